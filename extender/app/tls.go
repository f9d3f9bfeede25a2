package app

import (
	"crypto/tls"
	"fmt"
	"os"
	"sync"
	"time"

	"go.uber.org/zap"
)

// certReloader serves a certificate and key pair from files and picks up a
// new pair (cert-manager and kubelet Secret volumes replace them in place)
// without a restart. The files are looked at on a handshake at most once per
// interval; a pair that does not load (say the certificate is new and the key
// not yet) keeps the previous one in use until the next look.
type certReloader struct {
	certFile, keyFile string
	interval          time.Duration
	now               func() time.Time
	log               *zap.Logger

	mu      sync.Mutex
	cert    *tls.Certificate
	stamp   [2]fileStamp
	checked time.Time
}

// fileStamp identifies a version of a file well enough to notice a rewrite.
type fileStamp struct {
	mod  time.Time
	size int64
}

// newCertReloader loads the pair once; an unusable pair at start is an error.
func newCertReloader(certFile, keyFile string, interval time.Duration, now func() time.Time, log *zap.Logger) (*certReloader, error) {
	r := &certReloader{certFile: certFile, keyFile: keyFile, interval: interval, now: now, log: log}
	stamp, err := r.stamps()
	if err != nil {
		return nil, err
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("load TLS certificate and key: %w", err)
	}
	r.cert, r.stamp, r.checked = &cert, stamp, now()
	return r, nil
}

func (r *certReloader) stamps() ([2]fileStamp, error) {
	var out [2]fileStamp
	for i, f := range []string{r.certFile, r.keyFile} {
		st, err := os.Stat(f) // follows the symlinks of a Secret volume
		if err != nil {
			return out, fmt.Errorf("TLS file: %w", err)
		}
		out[i] = fileStamp{mod: st.ModTime(), size: st.Size()}
	}
	return out, nil
}

// getCertificate is the tls.Config hook.
func (r *certReloader) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	if now.Sub(r.checked) < r.interval {
		return r.cert, nil
	}
	r.checked = now
	stamp, err := r.stamps()
	if err != nil {
		r.log.Warn("cannot check the TLS files; serving the loaded certificate", zap.Error(err))
		return r.cert, nil
	}
	if stamp == r.stamp {
		return r.cert, nil
	}
	cert, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		r.log.Warn("TLS files changed but do not load; serving the previous certificate", zap.Error(err))
		return r.cert, nil
	}
	r.cert, r.stamp = &cert, stamp
	r.log.Info("TLS certificate reloaded", zap.String("file", r.certFile))
	return r.cert, nil
}
