package app

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"
	"k8s.io/client-go/kubernetes"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/extender/binder"
	"github.com/gpushare/gpushare/extender/cache"
	"github.com/gpushare/gpushare/extender/server"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

// ErrLeaderElectionLost is what Run returns when this replica stops holding
// the Lease on its own (renewals failed or another replica took it): the
// process should exit and restart as a clean standby, as kube-scheduler does.
var ErrLeaderElectionLost = errors.New("leader election lost")

// Config is the extender's whole configuration.
type Config struct {
	Client       kubernetes.Interface
	Logger       *zap.Logger
	Policy       allocator.Policy
	AssumeTTL    time.Duration // zero: the cache's default
	WriteHorizon time.Duration // zero: the cache's default (cache.Config.WriteHorizon)
	BindTimeout  time.Duration // zero: the binder's default
	MaxBodyBytes int64         // zero: the server's default
	GPUMetrics   server.GPUMetrics
	Version      string
	// ShutdownGrace bounds how long in-flight requests may finish after the
	// context ends; zero means 5 seconds.
	ShutdownGrace time.Duration
	// ReadTimeout bounds reading one whole request, headers and body; zero
	// means DefaultReadTimeout. IdleTimeout is how long a kept-alive
	// connection may wait for its next request; zero means DefaultIdleTimeout.
	// Tests shorten them.
	ReadTimeout time.Duration
	IdleTimeout time.Duration
	// LeaderElection, when set, runs this replica as one candidate for a
	// Lease; only the holder serves the verbs. Nil: no election, always serve.
	LeaderElection *LeaderElection
	// TLSCertFile and TLSKeyFile, both set, serve HTTPS (TLS 1.2 or later)
	// with a pair re-read when the files change.
	TLSCertFile string
	TLSKeyFile  string
	// TLSClientCAFile, set, requires a client certificate that chains to one
	// of its PEM certificates (re-read when it changes) on every path but the
	// probes; it needs HTTPS. TLSClientNames, set, narrows the scheduler verbs
	// to certificates whose common name or a DNS name is listed.
	TLSClientCAFile string
	TLSClientNames  []string
	// DebugListener, when set, serves net/http/pprof there and nowhere else.
	DebugListener net.Listener
}

// Defaults of Config's timeouts. A slow or idle client holds a connection,
// and the body buffer it has filled, no longer than these. ReadTimeout
// matches the shipped extender httpTimeout (30s): kube-scheduler sends its
// whole request at once, and gives up on the call after that anyway.
// IdleTimeout lets kube-scheduler's kept-alive connections be reused between
// scheduling cycles (its transport closes them after 90s idle itself).
const (
	DefaultReadTimeout = 30 * time.Second
	DefaultIdleTimeout = 90 * time.Second
)

// tlsRecheck is how often, at most, the TLS files are looked at for a new pair.
const tlsRecheck = 5 * time.Second

// Run serves the extender on ln until ctx ends, then stops accepting at once,
// lets in-flight requests finish within the grace period and returns. It
// never serves from a stopped cache: the cache stops only after the server.
// With leader election it also returns, with ErrLeaderElectionLost, when the
// Lease is lost; on a graceful stop it releases the Lease, after its last
// verb request has finished.
func Run(ctx context.Context, ln net.Listener, cfg Config) error {
	serving := false
	defer func() {
		// Refused before serving: the listeners are still ours to close.
		if !serving {
			ln.Close()
			if cfg.DebugListener != nil {
				cfg.DebugListener.Close()
			}
		}
	}()
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	grace := cfg.ShutdownGrace
	if grace == 0 {
		grace = 5 * time.Second
	}
	tlsConfig, err := listenerTLS(cfg, log)
	if err != nil {
		return err
	}
	lead := newLeadership(cfg.LeaderElection)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), lead.gauge())
	consistency, err := server.NewConsistencyMetrics(reg)
	if err != nil {
		return err
	}
	recorder, stopEvents, err := startEvents(ctx, cfg.Client)
	if err != nil {
		return err
	}
	c, err := cache.New(cache.Config{Client: cfg.Client, Logger: log.Named("cache"), AssumeTTL: cfg.AssumeTTL, WriteHorizon: cfg.WriteHorizon,
		OnVerify: consistency.Verification, Binder: gpushare.BinderExtender,
		OnForeignBind: foreignBinds(log.Named("cache"), recorder, consistency.ForeignBind, lead.serving)})
	if err != nil {
		stopEvents()
		return err
	}
	// Deferred first, so it runs last: after the server and every bind.
	defer stopEvents()
	b := binder.New(binder.Config{Client: cfg.Client, Cache: c, Policy: cfg.Policy, Logger: log.Named("binder"),
		BindTimeout: cfg.BindTimeout, OnAmbiguous: consistency.AmbiguousBind, Events: recorder})
	s, err := server.New(server.Config{
		Cache: c, Binder: b, Policy: cfg.Policy, Logger: log.Named("server"),
		Registry: reg, Version: cfg.Version, MaxBodyBytes: cfg.MaxBodyBytes, GPUMetrics: cfg.GPUMetrics,
	})
	if err != nil {
		return err
	}
	handler := lead.handler(s.Handler())
	if cfg.TLSClientCAFile != "" {
		auth, err := newClientAuth(cfg.TLSClientNames, reg, log.Named("client-auth"))
		if err != nil {
			return err
		}
		handler = auth.wrap(handler)
	}
	var elector interface{ Run(context.Context) }
	var started <-chan context.Context
	if cfg.LeaderElection != nil {
		if elector, started, err = lead.elector(cfg.LeaderElection, cfg.Client, log.Named("leader-election")); err != nil {
			return err
		}
	}

	serving = true
	// Every replica keeps its cache warm, leader or not, so a takeover needs
	// only the catch-up. Stopped last, after everything that reads it.
	cacheCtx, stopCache := context.WithCancel(context.Background())
	var cacheWG sync.WaitGroup
	cacheWG.Go(func() { c.Run(cacheCtx) })
	defer func() {
		stopCache()
		cacheWG.Wait()
	}()

	readTimeout, idleTimeout := cfg.ReadTimeout, cfg.IdleTimeout
	if readTimeout <= 0 {
		readTimeout = DefaultReadTimeout
	}
	if idleTimeout <= 0 {
		idleTimeout = DefaultIdleTimeout
	}
	srv := &http.Server{
		Handler:           handler,
		TLSConfig:         tlsConfig,
		ReadHeaderTimeout: min(10*time.Second, readTimeout),
		ReadTimeout:       readTimeout,
		IdleTimeout:       idleTimeout,
		ErrorLog:          zap.NewStdLog(log.Named("http")),
	}
	served := make(chan error, 1)
	go func() {
		if tlsConfig != nil {
			served <- srv.ServeTLS(ln, "", "")
			return
		}
		served <- srv.Serve(ln)
	}()
	log.Info("serving", zap.String("address", ln.Addr().String()), zap.String("policy", cfg.Policy.String()),
		zap.Bool("https", tlsConfig != nil), zap.Bool("clientCertificates", cfg.TLSClientCAFile != ""), zap.Bool("leaderElection", cfg.LeaderElection != nil))
	if cfg.DebugListener != nil {
		dbg := &http.Server{Handler: debugHandler(), ReadHeaderTimeout: 10 * time.Second, ErrorLog: zap.NewStdLog(log.Named("debug"))}
		go func() { _ = dbg.Serve(cfg.DebugListener) }()
		defer dbg.Close()
		log.Info("serving pprof", zap.String("address", cfg.DebugListener.Addr().String()))
	}
	go func() {
		if c.WaitForSync(cacheCtx) {
			log.Info("cache synced")
		}
	}()

	var electionDone chan struct{}
	stopElection := func() {}
	if elector != nil {
		electCtx, cancel := context.WithCancel(context.Background())
		electionDone = make(chan struct{})
		var termWG sync.WaitGroup
		go func() {
			defer close(electionDone)
			elector.Run(electCtx)
		}()
		termWG.Go(func() {
			select {
			case term := <-started:
				lead.takeOver(term, c, cfg.Client, cfg.LeaderElection.RetryPeriod, log.Named("leader-election"))
			case <-electionDone:
			}
		})
		// Cancelling the elector releases the Lease, so it comes after the
		// drain below; then wait for the elector and the takeover to end.
		stopElection = func() {
			cancel()
			<-electionDone
			termWG.Wait()
		}
	}

	var runErr error
	select {
	case err := <-served:
		runErr = fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
		log.Info("shutting down")
	case <-electionDone:
		log.Error("leader election lost; exiting to restart as a standby")
		runErr = ErrLeaderElectionLost
		grace = 0 // another replica may already be leading: cut running requests off
	}
	lead.retire()
	shutdown(srv, grace)
	// Nothing of this term runs any more: the Lease may go.
	lead.drain()
	stopElection()
	if runErr == nil {
		if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
			runErr = fmt.Errorf("serve: %w", err)
		}
	}
	return runErr
}

// listenerTLS is the listener's TLS configuration from cfg; nil for plain
// HTTP.
func listenerTLS(cfg Config, log *zap.Logger) (*tls.Config, error) {
	switch {
	case (cfg.TLSCertFile == "") != (cfg.TLSKeyFile == ""):
		return nil, errors.New("a TLS certificate file and a key file go together: set both or neither")
	case cfg.TLSCertFile == "" && cfg.TLSClientCAFile != "":
		return nil, errors.New("a client CA file needs HTTPS: set a TLS certificate and key file too")
	case cfg.TLSClientCAFile == "" && len(cfg.TLSClientNames) > 0:
		return nil, errors.New("client names need a client CA file")
	case cfg.TLSCertFile == "":
		return nil, nil
	}
	certs, err := newCertReloader(cfg.TLSCertFile, cfg.TLSKeyFile, tlsRecheck, time.Now, log.Named("tls"))
	if err != nil {
		return nil, err
	}
	var clientCAs *fileReloader[*x509.CertPool]
	if cfg.TLSClientCAFile != "" {
		if clientCAs, err = newClientCAReloader(cfg.TLSClientCAFile, tlsRecheck, time.Now, log.Named("tls")); err != nil {
			return nil, err
		}
	}
	return serverTLS(certs, clientCAs), nil
}

// shutdown stops accepting at once and gives running requests grace to
// finish; those still running after it are cut off (their contexts end).
func shutdown(srv *http.Server, grace time.Duration) {
	if grace <= 0 {
		_ = srv.Close()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		_ = srv.Close()
	}
}
