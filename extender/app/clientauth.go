package app

import (
	"crypto/x509"
	"net/http"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

// clientAuth refuses requests without a client certificate the TLS layer
// verified against the client CA. The probes (/healthz, /readyz, /version)
// stay open: they reveal nothing and the kubelet presents no certificate.
// The scheduler verbs (POST under the extender prefix: filter, prioritize,
// bind) may be narrowed to certificates naming one of schedulerNames, so a
// certificate given to Prometheus or a person for /metrics and /inspect
// cannot bind.
type clientAuth struct {
	schedulerNames []string // empty: every verified certificate
	refused        *prometheus.CounterVec
	log            *zap.Logger
}

// Reasons of gpushare_extender_client_refused_total.
const (
	refusedNoCertificate = "no-certificate"
	refusedName          = "name-not-allowed"
)

func newClientAuth(schedulerNames []string, reg prometheus.Registerer, log *zap.Logger) (*clientAuth, error) {
	refused := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpushare_extender_client_refused_total",
		Help: "Requests refused for their client certificate, by reason: no-certificate (none, or not verified against -tls-client-ca-file), name-not-allowed (a scheduler verb from a certificate not in -tls-client-names).",
	}, []string{"reason"})
	if err := reg.Register(refused); err != nil {
		return nil, err
	}
	for _, r := range []string{refusedNoCertificate, refusedName} {
		refused.WithLabelValues(r)
	}
	return &clientAuth{schedulerNames: schedulerNames, refused: refused, log: log}, nil
}

func (a *clientAuth) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if isProbe(r) {
			next.ServeHTTP(w, r)
			return
		}
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 {
			a.refuse(w, r, http.StatusUnauthorized, refusedNoCertificate,
				"a client certificate signed by the extender's -tls-client-ca-file is required")
			return
		}
		leaf := r.TLS.VerifiedChains[0][0]
		if isVerb(r) && len(a.schedulerNames) > 0 && !namesOneOf(leaf, a.schedulerNames) {
			a.refuse(w, r, http.StatusForbidden, refusedName,
				"client certificate "+leaf.Subject.CommonName+" may not call the scheduler verbs: not in -tls-client-names")
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (a *clientAuth) refuse(w http.ResponseWriter, r *http.Request, status int, reason, msg string) {
	a.refused.WithLabelValues(reason).Inc()
	a.log.Warn("request refused", zap.String("reason", reason), zap.String("path", r.URL.Path), zap.String("remote", r.RemoteAddr))
	writeError(w, status, msg)
}

func isProbe(r *http.Request) bool {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return false
	}
	switch r.URL.Path {
	case "/healthz", "/readyz", "/version":
		return true
	}
	return false
}

func isVerb(r *http.Request) bool {
	return r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, gpushare.ExtenderURLPrefix+"/")
}

// namesOneOf reports whether the certificate's common name or one of its DNS
// names is in names.
func namesOneOf(cert *x509.Certificate, names []string) bool {
	if slices.Contains(names, cert.Subject.CommonName) {
		return true
	}
	for _, n := range cert.DNSNames {
		if slices.Contains(names, n) {
			return true
		}
	}
	return false
}
