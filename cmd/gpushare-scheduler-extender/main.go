package main

import (
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap/zapcore"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gpushare/gpushare/cmd/internal/kubeconfig"
	"github.com/gpushare/gpushare/cmd/internal/logging"
	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/extender/app"
	"github.com/gpushare/gpushare/extender/binder"
	"github.com/gpushare/gpushare/extender/cache"
	"github.com/gpushare/gpushare/extender/server"
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
	listen         string
	logLevel       zapcore.Level
	policy         allocator.Policy
	kubeconfig     string
	qps            float64
	burst          int
	assumeTTL      time.Duration
	bindTimeout    time.Duration
	requestTimeout time.Duration
	maxBody        int64
	gpuMetrics     server.GPUMetrics
	election       election
	tlsCert        string
	tlsKey         string
	clientCA       string
	clientNames    string
	debug          string
}

// election holds the leader-election flags, named as Kubernetes components name theirs.
type election struct {
	enabled                     bool
	lease, renew, retry         time.Duration
	resourceName, resourceSpace string
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
	fs.Var(&o.policy, "policy", "GPU placement policy: bestfit (also best-fit or binpack: fill cards first), firstfit (also first-fit: lowest index that fits) or spread")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file; empty means in-cluster configuration")
	fs.Float64Var(&o.qps, "kube-api-qps", 500, "API client queries per second; each bind costs one call (a Binding)")
	fs.IntVar(&o.burst, "kube-api-burst", 1000, "API client burst")
	fs.DurationVar(&o.assumeTTL, "assume-ttl", cache.DefaultAssumeTTL, "how long a bound pod's charge may wait for the informer before the extender asks the API server whether the pod still holds it; never releases memory by itself. Keep it above -apiserver-request-timeout plus 15s: a Binding without a clear answer may be committed until then, and a first GET before it cannot settle its charge")
	fs.DurationVar(&o.requestTimeout, "apiserver-request-timeout", cache.DefaultAPIServerRequestTimeout, "the API server's --request-timeout: after a Binding got no clear answer (a 504, another 5xx, a timeout, a cut connection) the API server may still commit it until then, so a read showing the pod unbound releases its charge only once this plus 15s has passed")
	fs.DurationVar(&o.bindTimeout, "bind-timeout", binder.DefaultBindTimeout, "deadline of one Binding, which the scheduler giving up does not cut short; keep it plus 5s under the scheduler's extender httpTimeout")
	fs.Int64Var(&o.maxBody, "max-body-bytes", server.DefaultMaxBodyBytes, "largest filter or prioritize request body accepted")
	fs.Var(&o.gpuMetrics, "gpu-metrics", "how finely /metrics reports GPU memory beside the cluster totals: gpu (the default; 3 series per GPU), node (3 per node) or none")
	namespace := getenv("POD_NAMESPACE")
	if namespace == "" {
		namespace = "kube-system"
	}
	fs.BoolVar(&o.election.enabled, "leader-elect", false, "run as one of several replicas: only the holder of a Lease serves filter, prioritize and bind, the others report not ready")
	fs.DurationVar(&o.election.lease, "leader-elect-lease-duration", 15*time.Second, "how long a standby waits after the last renewal it saw before taking the Lease over (whole seconds)")
	fs.DurationVar(&o.election.renew, "leader-elect-renew-deadline", 10*time.Second, "how long the leader retries renewing before it stops serving and exits")
	fs.DurationVar(&o.election.retry, "leader-elect-retry-period", 2*time.Second, "interval between tries to acquire or renew the Lease")
	fs.StringVar(&o.election.resourceName, "leader-elect-resource-name", "gpushare-scheduler-extender", "name of the Lease")
	fs.StringVar(&o.election.resourceSpace, "leader-elect-resource-namespace", namespace, "namespace of the Lease (default from $POD_NAMESPACE)")
	fs.StringVar(&o.tlsCert, "tls-cert-file", "", "serve HTTPS with this PEM certificate (chain); re-read when it changes; needs -tls-private-key-file")
	fs.StringVar(&o.tlsKey, "tls-private-key-file", "", "PEM private key of -tls-cert-file")
	fs.StringVar(&o.clientCA, "tls-client-ca-file", "", "require a client certificate signed by one of this file's PEM CA certificates on every path but /healthz, /readyz and /version (mutual TLS); re-read when it changes; needs -tls-cert-file")
	fs.StringVar(&o.clientNames, "tls-client-names", "", "comma-separated names (certificate common name or DNS name) that may call filter, prioritize and bind; empty means every certificate -tls-client-ca-file verifies; needs -tls-client-ca-file")
	fs.StringVar(&o.debug, "debug-listen", "", "address to serve net/http/pprof on (e.g. 127.0.0.1:6060); empty means off; never on -listen")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.qps <= 0 || o.burst <= 0 {
		return o, errors.New("-kube-api-qps and -kube-api-burst must be positive")
	}
	if o.assumeTTL <= 0 || o.bindTimeout <= 0 || o.requestTimeout <= 0 {
		return o, errors.New("-assume-ttl, -bind-timeout and -apiserver-request-timeout must be positive")
	}
	if (o.tlsCert == "") != (o.tlsKey == "") {
		return o, errors.New("-tls-cert-file and -tls-private-key-file go together: set both or neither")
	}
	if o.clientCA != "" && o.tlsCert == "" {
		return o, errors.New("-tls-client-ca-file needs HTTPS: set -tls-cert-file and -tls-private-key-file too")
	}
	if o.clientNames != "" && o.clientCA == "" {
		return o, errors.New("-tls-client-names needs -tls-client-ca-file")
	}
	if o.election.enabled {
		if err := o.election.validate(); err != nil {
			return o, err
		}
	}
	return o, nil
}

// splitNames reads a comma-separated list, dropping blanks.
func splitNames(s string) []string {
	var out []string
	for n := range strings.SplitSeq(s, ",") {
		if n = strings.TrimSpace(n); n != "" {
			out = append(out, n)
		}
	}
	return out
}

// validate checks the timings as client-go's elector will, but names the flags.
func (e election) validate() error {
	switch {
	case e.lease < time.Second || e.lease%time.Second != 0:
		return fmt.Errorf("-leader-elect-lease-duration %v must be a whole number of seconds, at least 1s (a Lease stores seconds)", e.lease)
	case e.renew <= 0 || e.renew >= e.lease:
		return fmt.Errorf("-leader-elect-renew-deadline %v must be positive and shorter than -leader-elect-lease-duration %v", e.renew, e.lease)
	case e.retry <= 0 || e.retry*6/5 >= e.renew:
		// client-go retries at up to 1.2 times the period (its jitter).
		return fmt.Errorf("-leader-elect-retry-period %v must be positive and, times 1.2, shorter than -leader-elect-renew-deadline %v", e.retry, e.renew)
	case e.resourceName == "" || e.resourceSpace == "":
		return errors.New("-leader-elect-resource-name and -leader-elect-resource-namespace must not be empty")
	}
	return nil
}

// identity names this replica in the Lease: the pod name (or host name) plus
// a random suffix, so two processes of one name (two on a host, or a restart
// while its predecessor still runs) never both take the Lease for their own.
func identity(getenv func(string) string, hostname func() (string, error)) (string, error) {
	id := getenv("POD_NAME")
	if id == "" {
		h, err := hostname()
		if err != nil {
			return "", fmt.Errorf("leader election identity: %w", err)
		}
		id = h
	}
	return id + "_" + rand.Text()[:10], nil
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

	cfg, err := kubeconfig.Load(o.kubeconfig, "gpushare-scheduler-extender")
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = float32(o.qps), o.burst
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	appCfg := app.Config{
		Client: client, Logger: log, Policy: o.policy, AssumeTTL: o.assumeTTL, BindTimeout: o.bindTimeout,
		WriteHorizon: o.requestTimeout + cache.WriteMargin,
		MaxBodyBytes: o.maxBody, GPUMetrics: o.gpuMetrics, Version: version(), TLSCertFile: o.tlsCert, TLSKeyFile: o.tlsKey,
		TLSClientCAFile: o.clientCA, TLSClientNames: splitNames(o.clientNames),
	}
	if o.election.enabled {
		id, err := identity(getenv, os.Hostname)
		if err != nil {
			return err
		}
		// Its own client, so renewals never queue behind binds in a rate limiter.
		leCfg := rest.CopyConfig(cfg)
		leCfg.UserAgent = "gpushare-scheduler-extender/leader-election"
		leClient, err := kubernetes.NewForConfig(leCfg)
		if err != nil {
			return err
		}
		appCfg.LeaderElection = &app.LeaderElection{
			Client: leClient, Namespace: o.election.resourceSpace, Name: o.election.resourceName, Identity: id,
			LeaseDuration: o.election.lease, RenewDeadline: o.election.renew, RetryPeriod: o.election.retry,
		}
	}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return err
	}
	if o.debug != "" {
		if appCfg.DebugListener, err = net.Listen("tcp", o.debug); err != nil {
			ln.Close()
			return fmt.Errorf("-debug-listen: %w", err)
		}
	}
	return app.Run(ctx, ln, appCfg)
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
