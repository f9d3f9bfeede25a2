package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"

	"go.uber.org/zap/zapcore"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpushare/gpushare/cmd/internal/logging"
	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/extender/app"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "gpushare-scheduler-extender:", err)
		}
		os.Exit(1)
	}
}

// options are the command's flags.
type options struct {
	listen     string
	logLevel   zapcore.Level
	policy     allocator.Policy
	kubeconfig string
	qps        float64
	burst      int
	assumeTTL  time.Duration
	maxBody    int64
}

// parse reads flags; PORT and LOG_LEVEL are the seed's environment variables
// and serve as defaults, so the seed's manifests keep working unchanged.
func parse(args []string, getenv func(string) string, stderr io.Writer) (options, error) {
	o := options{logLevel: zapcore.InfoLevel}
	port := getenv("PORT")
	if port == "" {
		port = "12345"
	}
	if lvl := getenv("LOG_LEVEL"); lvl != "" {
		if err := o.logLevel.Set(lvl); err != nil {
			return o, fmt.Errorf("LOG_LEVEL: %w", err)
		}
	}
	fs := flag.NewFlagSet("gpushare-scheduler-extender", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.listen, "listen", ":"+port, "address to serve on (host:port); default port from $PORT, else 12345")
	fs.TextVar(&o.logLevel, "log-level", o.logLevel, "debug, info, warn or error (default from $LOG_LEVEL)")
	fs.Var(&o.policy, "policy", "GPU placement policy: bestfit (fill cards first), firstfit (lowest index that fits) or spread")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file; empty means in-cluster configuration")
	fs.Float64Var(&o.qps, "kube-api-qps", 500, "API client queries per second; each bind costs two calls")
	fs.IntVar(&o.burst, "kube-api-burst", 1000, "API client burst")
	fs.DurationVar(&o.assumeTTL, "assume-ttl", 30*time.Second, "how long a bind may stay unconfirmed by the informer before its charge is dropped")
	fs.Int64Var(&o.maxBody, "max-body-bytes", 64<<20, "largest filter or prioritize request body accepted")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.qps <= 0 || o.burst <= 0 {
		return o, errors.New("-kube-api-qps and -kube-api-burst must be positive")
	}
	return o, nil
}

func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	o, err := parse(args, getenv, stderr)
	if err != nil {
		return err
	}
	log, err := logging.New(o.logLevel)
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()

	var cfg *rest.Config
	if o.kubeconfig == "" {
		cfg, err = rest.InClusterConfig()
	} else {
		cfg, err = clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	}
	if err != nil {
		return fmt.Errorf("API client configuration: %w", err)
	}
	cfg.QPS, cfg.Burst = float32(o.qps), o.burst
	cfg.UserAgent = "gpushare-scheduler-extender"
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return err
	}
	return app.Run(ctx, ln, app.Config{
		Client: client, Logger: log, Policy: o.policy, AssumeTTL: o.assumeTTL,
		MaxBodyBytes: o.maxBody, Version: version(),
	})
}

// version is the module version stamped by the Go toolchain (or a VCS revision).
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" {
			v += "+" + s.Value
		}
	}
	return v
}
