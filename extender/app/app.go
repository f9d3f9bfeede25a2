package app

import (
	"context"
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
)

// Config is the extender's whole configuration.
type Config struct {
	Client       kubernetes.Interface
	Logger       *zap.Logger
	Policy       allocator.Policy
	AssumeTTL    time.Duration // zero: the cache's default
	MaxBodyBytes int64         // zero: the server's default
	Version      string
	// ShutdownGrace bounds how long in-flight requests may finish after the
	// context ends; zero means 5 seconds.
	ShutdownGrace time.Duration
}

// Run serves the extender on ln until ctx ends, then stops accepting at once,
// lets in-flight requests finish within the grace period and returns. It
// never serves from a stopped cache: the cache stops only after the server.
func Run(ctx context.Context, ln net.Listener, cfg Config) error {
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	grace := cfg.ShutdownGrace
	if grace == 0 {
		grace = 5 * time.Second
	}
	c, err := cache.New(cache.Config{Client: cfg.Client, Logger: log.Named("cache"), AssumeTTL: cfg.AssumeTTL})
	if err != nil {
		return err
	}
	b := binder.New(binder.Config{Client: cfg.Client, Cache: c, Policy: cfg.Policy, Logger: log.Named("binder")})
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	s, err := server.New(server.Config{
		Cache: c, Binder: b, Policy: cfg.Policy, Logger: log.Named("server"),
		Registry: reg, Version: cfg.Version, MaxBodyBytes: cfg.MaxBodyBytes,
	})
	if err != nil {
		return err
	}
	cacheCtx, stopCache := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { c.Run(cacheCtx) })
	defer func() {
		stopCache()
		wg.Wait()
	}()

	srv := &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          zap.NewStdLog(log.Named("http")),
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.Info("serving", zap.String("address", ln.Addr().String()), zap.String("policy", cfg.Policy.String()))
	go func() {
		if c.WaitForSync(ctx) {
			log.Info("cache synced; ready")
		}
	}()
	select {
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		// Requests still running after the grace period are cut off.
		_ = srv.Close()
	}
	if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}
