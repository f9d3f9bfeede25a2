package dra

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/gpushare/gpushare/plugin/dra/prepare"
	"github.com/gpushare/gpushare/plugin/dra/slice"
	"github.com/gpushare/gpushare/plugin/dra/store"
	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/isolation"
	"github.com/gpushare/gpushare/plugin/nvml"
	"github.com/gpushare/gpushare/plugin/topology"
)

// Defaults for the zero values of Config.
const (
	DefaultHealthQuietPeriod = 5 * time.Minute
	DefaultProbeEvery        = 2 * time.Second
	DefaultMinBackoff        = 100 * time.Millisecond
	DefaultMaxBackoff        = 10 * time.Second
)

// Config is everything the driver needs, passed in by the command.
type Config struct {
	Node    string               // this node's name; required
	Client  kubernetes.Interface // API client; required
	Library nvml.Library         // GPUs and health; required
	Unit    gpushare.Unit        // memory unit; 0 means GiB
	// PluginDir is the plugin data directory (dra.sock, the checkpoint);
	// RegistrarDir the kubelet's registration directory; CDIDir where the
	// claims' CDI specifications go. Empty means the defaults.
	PluginDir, RegistrarDir, CDIDir string
	// CDIGPUs names each GPU to the runtime as NVIDIA's CDI device
	// (a CDI device-list strategy); false names them in NVIDIA_VISIBLE_DEVICES.
	CDIGPUs bool
	IDs     gpushare.DeviceIDStrategy // how a GPU's CDI device is named; "" is uuid
	// HealthCheck turns NVML health watching on.
	HealthCheck       bool
	HealthQuietPeriod time.Duration // 0 means the default
	Health            nvml.HealthOptions
	Isolation         IsolationConfig
	// MinBackoff and MaxBackoff bound retries of the health watch; 0 means the defaults.
	MinBackoff, MaxBackoff time.Duration
	Logger                 *zap.Logger
	// HelperOptions are added to kubeletplugin.Start's (tests: sockets).
	HelperOptions []kubeletplugin.Option
	// Started, when set, is called once the driver serves and published.
	Started func(*Driver)
}

// IsolationConfig configures the tiers, as in device-plugin mode.
type IsolationConfig struct {
	Tier       gpushare.Isolation // the node's tier unless its label says otherwise; "" is none
	Paths      isolation.Config
	MPS        isolation.MPSDaemon // nil keeps the mps tier down
	ProbeEvery time.Duration       // 0 means the default
}

// check validates c and fills in defaults.
func (c *Config) check() error {
	switch {
	case c.Node == "":
		return errors.New("DRA driver: no node name (set " + gpushare.EnvNodeName + ")")
	case c.Client == nil:
		return errors.New("DRA driver: no API client")
	case c.Library == nil:
		return errors.New("DRA driver: no NVML library")
	}
	if c.Unit == 0 {
		c.Unit = gpushare.GiB
	}
	if !c.Unit.Valid() {
		return &gpushare.UnitError{Value: c.Unit.String()}
	}
	c.PluginDir = or(c.PluginDir, gpushare.DefaultDRAPluginDir)
	c.RegistrarDir = or(c.RegistrarDir, gpushare.DefaultDRARegistrarDir)
	c.CDIDir = or(c.CDIDir, gpushare.DefaultCDISpecDir)
	if c.HealthQuietPeriod <= 0 {
		c.HealthQuietPeriod = DefaultHealthQuietPeriod
	}
	if c.Isolation.ProbeEvery <= 0 {
		c.Isolation.ProbeEvery = DefaultProbeEvery
	}
	if c.Isolation.Tier == "" {
		c.Isolation.Tier = gpushare.IsolationNone
	}
	if c.MinBackoff <= 0 {
		c.MinBackoff = DefaultMinBackoff
	}
	if c.MaxBackoff < c.MinBackoff {
		c.MaxBackoff = max(DefaultMaxBackoff, c.MinBackoff)
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	return nil
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// Run reads the GPUs, serves the kubelet as the DRA driver
// gpushare.DRADriverName and publishes the node's ResourceSlice, again
// within a moment of every change of health or tier, until ctx ends; it
// returns nil then. It fails before registering when the GPUs cannot be
// read or published, or the checkpoint cannot be read.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.check(); err != nil {
		return err
	}
	log := cfg.Logger.Named("dra").With(zap.String("node", cfg.Node))
	base, err := readGPUs(cfg.Library, log)
	if err != nil {
		return err
	}
	labels, stopLabels, err := watchNodeLabels(ctx, cfg.Client, cfg.Node)
	if err != nil {
		return err
	}
	defer stopLabels()
	tw := newTierWatch(cfg.Isolation, log, labels)
	defer tw.stop()
	n, err := newNode(base, cfg.Unit, tw.status(ctx))
	if err != nil {
		return err
	}
	if _, err := slice.Devices(n.publish(), cfg.Unit); err != nil {
		return err
	}
	st, err := store.New(cfg.PluginDir, cfg.CDIDir)
	if err != nil {
		return err
	}
	d, err := newDriver(log, cfg.Node, n, st, prepare.Config{Unit: cfg.Unit, Isolation: cfg.Isolation.Paths, CDIGPUs: cfg.CDIGPUs, IDs: cfg.IDs})
	if err != nil {
		return err
	}
	d.pods = cfg.Client
	return serve(ctx, cfg, log, d, tw)
}

// serve starts the helper, publishes, and runs the loops until ctx ends.
func serve(ctx context.Context, cfg Config, log *zap.Logger, d *Driver, tw *tierWatch) error {
	opts := append([]kubeletplugin.Option{
		kubeletplugin.DriverName(gpushare.DRADriverName), kubeletplugin.NodeName(cfg.Node), kubeletplugin.KubeClient(cfg.Client),
		kubeletplugin.RegistrarDirectoryPath(cfg.RegistrarDir), kubeletplugin.PluginDataDirectoryPath(cfg.PluginDir),
	}, cfg.HelperOptions...)
	helper, err := kubeletplugin.Start(ctx, d, opts...)
	if err != nil {
		return fmt.Errorf("start the DRA kubelet plugin: %w", err)
	}
	defer helper.Stop()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	if err := publish(ctx, helper, cfg, d.node); err != nil {
		return err
	}
	log.Info("DRA driver serving", zap.String("driver", gpushare.DRADriverName), zap.String("pluginDir", cfg.PluginDir),
		zap.String("cdiDir", cfg.CDIDir), zap.Int("gpus", len(d.node.base)), zap.Stringer("unit", cfg.Unit))
	resync := make(chan struct{}, 1)
	wg.Go(func() { republish(ctx, helper, cfg, d.node, resync, log) })
	wg.Go(func() {
		err := keepPublished(ctx, cfg.Client, cfg.Node, func() {
			select {
			case resync <- struct{}{}:
			default: // one pending is enough
			}
		})
		if err != nil {
			log.Error("watch the node's ResourceSlices: a deleted slice comes back only after the helper's sync delay", zap.Error(err))
		}
	})
	wg.Go(func() { every(ctx, cfg.Isolation.ProbeEvery, func() { d.node.setTier(tw.status(ctx)) }) })
	if cfg.HealthCheck {
		wg.Go(func() { watchHealth(ctx, cfg, d.node, log) })
	} else {
		log.Info("GPU health checking is off")
	}
	if cfg.Started != nil {
		cfg.Started(d)
	}
	<-ctx.Done()
	return nil
}

// publish hands the node's devices to the helper, which writes the slice.
func publish(ctx context.Context, h *kubeletplugin.Helper, cfg Config, n *node) error {
	devices, err := slice.Devices(n.publish(), cfg.Unit)
	if err != nil {
		return err
	}
	return h.PublishResources(ctx, slice.Resources(cfg.Node, devices))
}

// republish publishes again after every change and every deletion of the
// node's slice (resync); the helper's controller writes at once, so either
// reaches the API server within its round trip.
func republish(ctx context.Context, h *kubeletplugin.Helper, cfg Config, n *node, resync <-chan struct{}, log *zap.Logger) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-resync:
			if err := publish(ctx, h, cfg, n); err != nil {
				log.Error("publish the node's GPUs", zap.Error(err))
			}
		case <-n.Changed():
			if err := publish(ctx, h, cfg, n); err != nil {
				log.Error("publish the node's GPUs", zap.Error(err))
			}
		}
	}
}

// every calls fn every period until ctx ends.
func every(ctx context.Context, period time.Duration, fn func()) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fn()
		}
	}
}

// readGPUs reads the shareable GPUs and their topology. GPUs in MIG mode
// are skipped, named in the log, as in device-plugin mode.
func readGPUs(lib nvml.Library, log *zap.Logger) ([]slice.GPU, error) {
	gpus, err := lib.Devices()
	if err != nil {
		return nil, fmt.Errorf("read GPUs: %w", err)
	}
	for _, s := range lib.Skipped() {
		log.Warn("GPU skipped: not published", zap.Int("index", s.Index), zap.String("uuid", s.UUID), zap.String("reason", s.Reason))
	}
	reading, topoErr := lib.Topology()
	if topoErr != nil {
		log.Warn("GPU topology not read: GPUs published without NUMA node and NVLink domain", zap.Error(topoErr))
	}
	if lib.Simulated() {
		log.Warn("using SIMULATED GPUs: no container gets a real GPU", zap.String("backend", lib.Name()))
	}
	base := BaseGPUs(gpus, reading, topoErr == nil, lib.Simulated())
	for i := range base {
		base[i].DriverVersion = lib.DriverVersion()
	}
	return base, nil
}

// BaseGPUs describes gpus for the slice: the topology (when read) gives
// each its NUMA node and NVLink domain, the product name its architecture.
func BaseGPUs(gpus []nvml.GPU, r topology.Reading, haveTopology, simulated bool) []slice.GPU {
	uuids := make(map[int]string, len(gpus))
	for _, g := range gpus {
		uuids[g.Index] = g.UUID
	}
	numa := map[int]int{}
	var domains map[int]string
	if haveTopology {
		for _, t := range r.GPUs {
			numa[t.Index] = t.NUMANode
		}
		domains = slice.NVLinkDomains(r, uuids)
	}
	out := make([]slice.GPU, len(gpus))
	for i, g := range gpus {
		arch, cc := slice.Architecture(g.Model)
		n, ok := numa[g.Index]
		if !ok {
			n = -1
		}
		out[i] = slice.GPU{Index: g.Index, UUID: g.UUID, Model: g.Model, MemoryMiB: g.MemoryMiB, PCIBusID: g.PCIBusID,
			NUMANode: n, NVLinkDomain: domains[g.Index], Architecture: arch, ComputeCapability: cc, Simulated: simulated}
	}
	return out
}
