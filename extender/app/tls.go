package app

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"go.uber.org/zap"
)

// fileReloader serves a value loaded from files and picks up a new version
// (cert-manager and kubelet Secret volumes replace them in place) without a
// restart. The files are looked at on use at most once per interval; a
// version that does not load (say the certificate is new and the key not
// yet) keeps the previous value in use until the next look.
type fileReloader[T any] struct {
	files    []string
	load     func() (T, error)
	what     string // for the log: "TLS certificate", "client CA"
	interval time.Duration
	now      func() time.Time
	log      *zap.Logger

	mu      sync.Mutex
	value   T
	stamp   []fileStamp
	checked time.Time
}

// fileStamp identifies a version of a file well enough to notice a rewrite.
type fileStamp struct {
	mod  time.Time
	size int64
}

// newFileReloader loads the value once; an unusable value at start is an error.
func newFileReloader[T any](what string, files []string, load func() (T, error), interval time.Duration, now func() time.Time, log *zap.Logger) (*fileReloader[T], error) {
	r := &fileReloader[T]{files: files, load: load, what: what, interval: interval, now: now, log: log}
	stamp, err := r.stamps()
	if err != nil {
		return nil, err
	}
	v, err := load()
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", what, err)
	}
	r.value, r.stamp, r.checked = v, stamp, now()
	return r, nil
}

func (r *fileReloader[T]) stamps() ([]fileStamp, error) {
	out := make([]fileStamp, len(r.files))
	for i, f := range r.files {
		st, err := os.Stat(f) // follows the symlinks of a Secret volume
		if err != nil {
			return nil, fmt.Errorf("%s file: %w", r.what, err)
		}
		out[i] = fileStamp{mod: st.ModTime(), size: st.Size()}
	}
	return out, nil
}

// current returns the loaded value, reloading it first when the interval
// has passed and the files changed.
func (r *fileReloader[T]) current() T {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	if now.Sub(r.checked) < r.interval {
		return r.value
	}
	r.checked = now
	stamp, err := r.stamps()
	if err != nil {
		r.log.Warn("cannot check the files; using the loaded "+r.what, zap.Error(err))
		return r.value
	}
	if sameStamps(stamp, r.stamp) {
		return r.value
	}
	v, err := r.load()
	if err != nil {
		r.log.Warn("files changed but do not load; using the previous "+r.what, zap.Error(err))
		return r.value
	}
	r.value, r.stamp = v, stamp
	r.log.Info(r.what+" reloaded", zap.Strings("files", r.files))
	return r.value
}

func sameStamps(a, b []fileStamp) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return len(a) == len(b)
}

// newCertReloader serves the pair in certFile and keyFile.
func newCertReloader(certFile, keyFile string, interval time.Duration, now func() time.Time, log *zap.Logger) (*fileReloader[*tls.Certificate], error) {
	load := func() (*tls.Certificate, error) {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		return &cert, err
	}
	return newFileReloader("TLS certificate", []string{certFile, keyFile}, load, interval, now, log)
}

// newClientCAReloader serves the pool of PEM certificates in caFile, the
// authorities a client certificate must chain to.
func newClientCAReloader(caFile string, interval time.Duration, now func() time.Time, log *zap.Logger) (*fileReloader[*x509.CertPool], error) {
	load := func() (*x509.CertPool, error) {
		data, err := os.ReadFile(caFile)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(data) {
			return nil, errors.New("no PEM certificate in " + caFile)
		}
		return pool, nil
	}
	return newFileReloader("client CA", []string{caFile}, load, interval, now, log)
}

// serverTLS is the TLS configuration of the extender's listener: the
// reloaded serving pair, and, with a client CA, client certificates checked
// against the reloaded pool. A client that presents none still completes the
// handshake (the kubelet's HTTPS probes present none); requireClientCert
// refuses it every path but the probes.
func serverTLS(certs *fileReloader[*tls.Certificate], clientCAs *fileReloader[*x509.CertPool]) *tls.Config {
	base := &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return certs.current(), nil },
	}
	if clientCAs == nil {
		return base
	}
	base.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		c := base.Clone()
		c.GetConfigForClient = nil
		c.ClientAuth = tls.VerifyClientCertIfGiven
		c.ClientCAs = clientCAs.current()
		return c, nil
	}
	return base
}

// ServingTLS is a listener's TLS configuration serving the pair in certFile
// and keyFile, reloaded when the files change, without client certificates:
// the webhook's listener, which only the API server calls.
func ServingTLS(certFile, keyFile string, log *zap.Logger) (*tls.Config, error) {
	certs, err := newCertReloader(certFile, keyFile, tlsRecheck, time.Now, log)
	if err != nil {
		return nil, err
	}
	return serverTLS(certs, nil), nil
}
