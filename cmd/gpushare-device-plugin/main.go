package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"k8s.io/client-go/kubernetes"

	"github.com/gpushare/gpushare/cmd/internal/kubeconfig"
	"github.com/gpushare/gpushare/cmd/internal/logging"
	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/manager"
	"github.com/gpushare/gpushare/plugin/nvml"
	"github.com/gpushare/gpushare/plugin/podresources"
	"github.com/gpushare/gpushare/plugin/server"
	"github.com/gpushare/gpushare/plugin/usage"
)

func main() {
	os.Exit(run(os.Args[1:], os.Getenv, os.Stderr))
}

// options are the command's flags.
type options struct {
	backend      string
	unit         gpushare.Unit
	dir          string
	podResources string
	kubeconfig   string
	healthCheck  bool
	quiet        time.Duration
	fatalXids    []uint64
	allocateWait time.Duration
	qps          float64
	burst        int
	metrics      string
	deviceList   server.DeviceList
	cdiSpecDir   string
	isolation    isolationOptions
	dra          draOptions
	usage        usageOptions
	logLevel     zapcore.Level
	node         string
}

// parse reads flags and the environment; errors are usage errors.
func parse(args []string, getenv func(string) string, stderr io.Writer) (options, error) {
	o := options{unit: gpushare.GiB, logLevel: zapcore.InfoLevel}
	fs := flag.NewFlagSet("gpushare-device-plugin", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.backend, "gpu-backend", nvml.BackendNVML, "GPU backend: "+strings.Join(nvml.Backends(), ", ")+
		" (simulated ones are for tests and demos; append :mig=<index>[,<index>...] to put simulated GPUs in MIG mode)")
	fs.TextVar(&o.unit, "memory-unit", gpushare.GiB, "size of one aliyun.com/gpu-mem unit: GiB, MiB or <n>MiB where n divides 1024 (e.g. 256MiB)")
	fs.StringVar(&o.dir, "device-plugin-dir", gpushare.DevicePluginDir, "the kubelet's device-plugin directory")
	fs.StringVar(&o.podResources, "pod-resources-socket", podresources.DefaultSocket, "the kubelet's pod-resources API, to check which container each Allocate went to; empty turns the check off")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file; empty means in-cluster configuration")
	fs.BoolVar(&o.healthCheck, "health-check", true, "watch NVML for critical Xid and ECC errors and mark the GPU unhealthy")
	fs.DurationVar(&o.quiet, "health-quiet-period", manager.DefaultHealthQuietPeriod, "how long a GPU with a transient fault must go without a health event to be healthy again (fatal faults last until the plugin restarts)")
	fs.Func("health-fatal-xids", "comma-separated Xids to treat as fatal in addition to the built-in ones (e.g. 62,140)", func(v string) error {
		xids, err := parseXids(v)
		o.fatalXids = append(o.fatalXids, xids...)
		return err
	})
	fs.DurationVar(&o.allocateWait, "allocate-wait", manager.DefaultAllocateWait, "how long Allocate waits for its pod to reach the plugin's watch")
	fs.Float64Var(&o.qps, "kube-api-qps", manager.DefaultKubeAPIQPS, "API client queries per second; each Allocate reads its pod and records what it served on it")
	fs.IntVar(&o.burst, "kube-api-burst", manager.DefaultKubeAPIBurst, "API client burst above --kube-api-qps")
	fs.StringVar(&o.metrics, "metrics-listen", "", "host:port to serve Prometheus /metrics on (Allocate outcomes, records repaired); empty serves nothing")
	listStrategy := fs.String("device-list-strategy", string(gpushare.DeviceListEnvvar), "how Allocate names the GPU to the container runtime, as NVIDIA's device plugin: "+
		"a comma-separated list of "+strings.Join(gpushare.DeviceListStrategyNames(), ", ")+" (docs/device-plugin.md: only volume-mounts and the CDI ones resist a pod setting NVIDIA_VISIBLE_DEVICES itself)")
	idStrategy := fs.String("device-id-strategy", string(gpushare.DeviceIDUUID), "how volume-mounts and the CDI strategies name the GPU: "+
		strings.Join(gpushare.DeviceIDStrategyNames(), " or ")+" (envvar always writes the index)")
	fs.StringVar(&o.cdiSpecDir, "cdi-spec-dir", gpushare.DefaultCDISpecDir, "with a CDI device-list strategy, where the plugin writes its CDI specification "+
		"("+gpushare.CDILimitsSpecFile+"), whose devices hand an isolation tier's variables to the runtime after the container's own env; "+
		"one of the runtime's cdi_spec_dirs")
	o.isolation.register(fs)
	o.dra.register(fs)
	o.usage.register(fs)
	fs.TextVar(&o.logLevel, "log-level", zapcore.InfoLevel, "log level: debug, info, warn, error")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	o.node = getenv(gpushare.EnvNodeName)
	if o.node == "" {
		return o, errors.New(gpushare.EnvNodeName + " is not set: give the plugin its node name (fieldRef spec.nodeName in the DaemonSet)")
	}
	if o.quiet <= 0 || o.allocateWait <= 0 {
		return o, errors.New("--health-quiet-period and --allocate-wait must be positive")
	}
	if o.qps <= 0 || o.burst <= 0 {
		return o, errors.New("--kube-api-qps and --kube-api-burst must be positive")
	}
	var err error
	if o.deviceList.Strategies, err = gpushare.ParseDeviceListStrategies(*listStrategy); err != nil {
		return o, fmt.Errorf("--device-list-strategy: %w", err)
	}
	if o.deviceList.IDs, err = gpushare.ParseDeviceIDStrategy(*idStrategy); err != nil {
		return o, fmt.Errorf("--device-id-strategy: %w", err)
	}
	if !filepath.IsAbs(o.cdiSpecDir) || filepath.Clean(o.cdiSpecDir) != o.cdiSpecDir {
		return o, fmt.Errorf("--cdi-spec-dir: %q is not a clean absolute path", o.cdiSpecDir)
	}
	if err := o.isolation.check(); err != nil {
		return o, err
	}
	if err := o.dra.check(o); err != nil {
		return o, err
	}
	if err := o.usage.check(); err != nil {
		return o, err
	}
	return o, nil
}

// parseXids reads a comma-separated list of Xids.
func parseXids(v string) ([]uint64, error) {
	var out []uint64
	for _, item := range strings.Split(v, ",") {
		x, err := strconv.ParseUint(strings.TrimSpace(item), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%q is not an Xid (a decimal number)", item)
		}
		out = append(out, x)
	}
	return out, nil
}

// run is main without the exit, so it can be tested.
func run(args []string, getenv func(string) string, stderr io.Writer) int {
	o, err := parse(args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "gpushare-device-plugin:", err)
		return 2
	}
	logger, err := logging.New(o.logLevel)
	if err != nil {
		fmt.Fprintln(stderr, "gpushare-device-plugin: build logger:", err)
		return 1
	}
	defer logger.Sync() //nolint:errcheck // nothing to do about a failed flush at exit

	if err := serve(o, logger); err != nil {
		logger.Error("device plugin failed", zap.Error(err))
		return 1
	}
	return 0
}

// serve builds the pieces and runs the manager until SIGTERM or SIGINT.
func serve(o options, logger *zap.Logger) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	restart := make(chan struct{})
	go func() {
		for {
			select {
			case <-hup:
				select {
				case restart <- struct{}{}:
				case <-ctx.Done():
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()

	rc, err := kubeconfig.Load(o.kubeconfig, "gpushare-device-plugin")
	if err != nil {
		return err
	}
	rc.QPS, rc.Burst = float32(o.qps), o.burst
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("API client: %w", err)
	}
	lib, err := nvml.New(logger, o.backend)
	if err != nil {
		return err
	}
	defer func() {
		if err := lib.Shutdown(); err != nil {
			logger.Warn("shut down NVML", zap.Error(err))
		}
	}()
	metrics, err := serveMetrics(o.metrics, o.usage.interval > 0, logger)
	if err != nil {
		return err
	}
	defer metrics.stop()
	tiers, err := o.isolation.config(lib, logger)
	if err != nil {
		return err
	}
	usageCtx, stopUsage := context.WithCancel(ctx)
	waitUsage, err := startUsage(usageCtx, o, logger, client, lib, metrics.usage)
	if err != nil {
		stopUsage()
		return err
	}
	// The loop reads NVML: it ends before the deferred Shutdown above.
	defer waitUsage()
	defer stopUsage()
	if o.dra.mode == modeDRA {
		return serveDRA(ctx, o, logger, client, lib, tiers)
	}
	if o.deviceList.Limits, err = limitSpecs(o, logger); err != nil {
		return err
	}
	m, err := manager.New(manager.Config{
		Node: o.node, Client: client, Library: lib, Unit: o.unit, DevicePluginDir: o.dir, PodResourcesSocket: o.podResources,
		HealthCheck: o.healthCheck, HealthQuietPeriod: o.quiet, AllocateWait: o.allocateWait,
		Health:  nvml.HealthOptions{FatalXids: o.fatalXids},
		Restart: restart, Metrics: metrics.plugin, Logger: logger, DeviceList: o.deviceList, Isolation: tiers,
	})
	if err != nil {
		return err
	}
	logger.Info("starting", zap.String("node", o.node), zap.String("backend", o.backend), zap.Stringer("unit", o.unit), zap.String("dir", o.dir),
		zap.Stringer("deviceList", o.deviceList), zap.String("isolation", string(o.isolation.tier)))
	err = m.Run(ctx)
	logger.Info("stopped")
	return err
}

// limitSpecs is the plugin's CDI specification in --cdi-spec-dir when a CDI
// strategy names the GPU (nil otherwise: envvar and volume-mounts cannot
// carry edits), pruned against the kubelet's checkpoint in --device-plugin-dir.
func limitSpecs(o options, logger *zap.Logger) (*server.LimitSpecs, error) {
	s := o.deviceList.Strategies
	if !s.Includes(gpushare.DeviceListCDIAnnotations) && !s.Includes(gpushare.DeviceListCDICRI) {
		return nil, nil
	}
	limits, err := server.NewLimitSpecs(server.LimitSpecsConfig{Dir: o.cdiSpecDir, Checkpoint: filepath.Join(o.dir, server.KubeletCheckpoint),
		Logger: logger.Named("cdi")})
	if err != nil {
		return nil, fmt.Errorf("--cdi-spec-dir: %w", err)
	}
	return limits, nil
}

// servedMetrics are the series serveMetrics serves, nil where none is.
type servedMetrics struct {
	plugin *manager.Metrics
	usage  *usage.Metrics
	addr   string // where it listens
	stop   func() // closes the listener
}

// serveMetrics serves the plugin's Prometheus series, and the usage loop's
// when withUsage, and nothing else, on addr; with addr empty it serves
// nothing and returns nil metrics.
func serveMetrics(addr string, withUsage bool, logger *zap.Logger) (servedMetrics, error) {
	if addr == "" {
		return servedMetrics{stop: func() {}}, nil
	}
	reg := prometheus.NewRegistry()
	var out servedMetrics
	var err error
	if out.plugin, err = manager.NewMetrics(reg); err != nil {
		return servedMetrics{}, err
	}
	if withUsage {
		if out.usage, err = usage.NewMetrics(reg); err != nil {
			return servedMetrics{}, err
		}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return servedMetrics{}, fmt.Errorf("--metrics-listen: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 10 * time.Second,
		IdleTimeout: time.Minute, ErrorLog: zap.NewStdLog(logger.Named("metrics"))}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("metrics server stopped", zap.Error(err))
		}
	}()
	logger.Info("serving metrics", zap.String("address", ln.Addr().String()))
	out.addr, out.stop = ln.Addr().String(), func() { srv.Close() }
	return out, nil
}
