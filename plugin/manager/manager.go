package manager

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/gpushare/gpushare/plugin/allocate"
	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/inventory"
	"github.com/gpushare/gpushare/plugin/isolation"
	"github.com/gpushare/gpushare/plugin/nvml"
	"github.com/gpushare/gpushare/plugin/podresources"
	"github.com/gpushare/gpushare/plugin/podsource"
	"github.com/gpushare/gpushare/plugin/server"
)

// Defaults for the zero values of Config.
const (
	DefaultAllocateWait      = 5 * time.Second
	DefaultHealthQuietPeriod = 5 * time.Minute
	DefaultMinBackoff        = 100 * time.Millisecond
	DefaultMaxBackoff        = 10 * time.Second
)

// The device plugin's API client limits, the kubelet's own defaults
// (kubeAPIQPS, kubeAPIBurst): each Allocate reads its pod and writes its
// record, so client-go's 5 queries per second held a node to about 2.5
// Allocate answers a second in a burst.
const (
	DefaultKubeAPIQPS   = 50
	DefaultKubeAPIBurst = 100
)

// Config is everything the manager needs, passed in by the command.
type Config struct {
	Node            string               // this node's name (NODE_NAME); required
	Client          kubernetes.Interface // API client; required
	Library         nvml.Library         // GPUs and health; required
	Unit            gpushare.Unit        // memory unit; 0 means GiB
	DevicePluginDir string               // the kubelet's device-plugin directory; empty means gpushare.DevicePluginDir
	// HealthCheck turns NVML health watching on.
	HealthCheck bool
	// HealthQuietPeriod is how long a GPU must go without a health event to be healthy again; 0 means the default.
	HealthQuietPeriod time.Duration
	// Health tunes the NVML watch (extra ignored Xids, wait timeout); the zero value is the default.
	Health nvml.HealthOptions
	// AllocateWait bounds how long Allocate waits for its pod to reach the store; 0 means the default.
	AllocateWait time.Duration
	// Restart requests a Stop/Start/Register cycle (the command sends SIGHUP here); nil means never.
	Restart <-chan struct{}
	// OnRegistered, when set, is called after every successful registration with the kubelet.
	OnRegistered func()
	// MinBackoff and MaxBackoff bound the wait between failed restarts; 0 means the defaults.
	MinBackoff, MaxBackoff time.Duration
	// PodResourcesSocket is the kubelet's pod-resources API, used to check
	// which container each answered Allocate went to; empty turns the check off.
	PodResourcesSocket string
	// RecordRetry paces the background retries of a container's record on
	// its pod after the write during Allocate failed; Steps 0 means DefaultRecordRetry.
	RecordRetry wait.Backoff
	// Metrics counts Allocate's answers and the records repaired; nil counts nothing.
	Metrics *Metrics
	Logger  *zap.Logger
	// DeviceList says how Allocate names the GPU to the container runtime
	// (--device-list-strategy, --device-id-strategy); the zero value is envvar.
	DeviceList server.DeviceList
	// Isolation configures the memory-isolation tiers; the zero value is
	// tier none everywhere the node's label does not say otherwise.
	Isolation IsolationConfig
	// Events receives the plugin's events on its Node (Allocate refusals,
	// GPU health changes); nil means Run sends them to the API server
	// through Client.
	Events EventRecorder
}

// attributeEvery paces the settling of answered calls between Allocates.
const attributeEvery = 100 * time.Millisecond

// Manager runs the device plugin until its context ends.
type Manager struct {
	cfg Config
	log *zap.Logger

	mu  sync.Mutex
	inv *inventory.Inventory
	srv *server.Server
	// tier is the node's isolation tier state, the same for every GPU (one
	// MPS daemon, one HAMi-core installation per node); tierKnown is false
	// until the first probe.
	tier      isolation.Status
	tierKnown bool
	tierSince time.Time // when tier was last set
	// events records on the Node; set by Run, nil before.
	events *nodeEvents
}

// New checks cfg and fills in defaults.
func New(cfg Config) (*Manager, error) {
	switch {
	case cfg.Node == "":
		return nil, errors.New("device plugin: no node name (set " + gpushare.EnvNodeName + ")")
	case cfg.Client == nil:
		return nil, errors.New("device plugin: no API client")
	case cfg.Library == nil:
		return nil, errors.New("device plugin: no NVML library")
	}
	if cfg.Unit == 0 {
		cfg.Unit = gpushare.GiB
	}
	if !cfg.Unit.Valid() {
		return nil, &gpushare.UnitError{Value: cfg.Unit.String()}
	}
	if cfg.DevicePluginDir == "" {
		cfg.DevicePluginDir = gpushare.DevicePluginDir
	}
	if cfg.HealthQuietPeriod <= 0 {
		cfg.HealthQuietPeriod = DefaultHealthQuietPeriod
	}
	if cfg.AllocateWait <= 0 {
		cfg.AllocateWait = DefaultAllocateWait
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = DefaultMinBackoff
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = max(DefaultMaxBackoff, cfg.MinBackoff)
	}
	if cfg.RecordRetry.Steps <= 0 {
		cfg.RecordRetry = DefaultRecordRetry()
	}
	if err := cfg.Isolation.check(); err != nil {
		return nil, fmt.Errorf("device plugin: isolation: %w", err)
	}
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	return &Manager{cfg: cfg, log: log.With(zap.String("node", cfg.Node))}, nil
}

// inventory returns the current inventory.
func (m *Manager) inventory() *inventory.Inventory {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.inv
}

// Run reads the GPUs, publishes them, and serves the kubelet until ctx ends;
// it returns nil then. It fails early, before registering anything, when
// the GPUs cannot be read or the unit does not fit the kubelet.
func (m *Manager) Run(ctx context.Context) error {
	lib := m.cfg.Library
	gpus, err := lib.Devices()
	if err != nil {
		return fmt.Errorf("read GPUs: %w", err)
	}
	in := make([]inventory.GPU, len(gpus))
	for i, g := range gpus {
		in[i] = inventory.GPU{Index: g.Index, UUID: g.UUID, Model: g.Model, MemoryMiB: g.MemoryMiB}
	}
	reading, topoErr := lib.Topology()
	if topoErr == nil {
		addPlacement(in, reading)
	}
	inv, err := inventory.New(in, m.cfg.Unit)
	if err != nil {
		return err
	}
	inv = m.withTopology(inv, reading, topoErr)
	if err := inv.CheckMessageSize(inventory.KubeletMaxMessageSize); err != nil {
		return err
	}
	nodeRec, stopEvents := startEvents(ctx, m.cfg.Events, m.cfg.Client)
	// Deferred first, so it runs last: after every loop that records.
	defer stopEvents()
	m.mu.Lock()
	m.inv = inv
	m.events = newNodeEvents(nodeRec, m.cfg.Node)
	m.mu.Unlock()
	m.log.Info("GPUs found", zap.String("backend", lib.Name()), zap.Bool("simulated", lib.Simulated()),
		zap.Int("gpus", len(gpus)), zap.Stringer("unit", m.cfg.Unit), zap.Uint64("units", inv.TotalUnits()),
		zap.Int("listAndWatchBytes", inv.MessageSize()))
	if lib.Simulated() {
		m.log.Warn("using SIMULATED GPUs: no container gets a real GPU", zap.String("backend", lib.Name()))
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	src := podsource.New(m.cfg.Client, m.cfg.Node, m.log)
	if err := src.Start(ctx); err != nil {
		return err
	}
	defer src.Shutdown()
	// The tier is probed (and the MPS daemon started) before the node is
	// first published, so that publication already shows each GPU's
	// effective tier. Deferred here, the daemon stops after the server and
	// every background loop.
	tiers := newTierWatch(m.cfg.Isolation, m.log, func() map[string]string {
		if n, ok := src.Node(); ok {
			return n.Labels
		}
		return nil
	})
	defer tiers.stop()
	m.setTier(ctx, tiers, tiers.status(ctx))
	if err := publishNode(ctx, m.cfg.Client, m.cfg.Node, inv, lib.Simulated(), m.tierStatuses(inv)); err != nil {
		return err
	}
	rec := newRecorder(ctx, src, m.cfg.RecordRetry, m.log)
	// Deferred before the server's stop (in serve) and the cancel below, so
	// it runs after both: no Allocate is left to start a retry, and every
	// retry sees ctx end.
	defer rec.wait()
	alloc := &allocator{log: m.log, node: m.cfg.Node, src: src, rec: rec, inventory: m.inventory, wait: m.cfg.AllocateWait, served: allocate.Served{},
		memo: allocate.NewMemo(), metrics: m.cfg.Metrics, deviceList: m.cfg.DeviceList, tiers: m.tierStatuses, tierPaths: m.cfg.Isolation.Paths,
		events: m.events}
	if m.cfg.PodResourcesSocket != "" {
		pr, err := podresources.New(m.cfg.PodResourcesSocket)
		if err != nil {
			return err
		}
		defer pr.Close()
		alloc.holders = func(ctx context.Context) (podresources.Allocations, error) {
			return pr.Holders(ctx, string(gpushare.ResourceName))
		}
	} else {
		m.log.Warn("no pod-resources socket: each Allocate is recorded on the pod it matched, unchecked against the kubelet")
	}

	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { m.watchTiers(ctx, tiers) })
	// Removes the hami-core cache directories no live container mounts
	// (cachesweep.go); nothing to do where the cache root does not exist.
	wg.Go(func() { every(ctx, cacheSweepEvery, m.sweepCaches) })
	if alloc.holders != nil {
		wg.Go(func() { every(ctx, attributeEvery, func() { alloc.attribute(ctx) }) })
		// Without the pod-resources API records follow the plugin's own match,
		// which may name a pod whose call is still to come; repairing the pod
		// that really started as well would count that call twice.
		rc := &reconciler{alloc: alloc, log: m.log.Named("reconcile")}
		wg.Go(func() { every(ctx, reconcileEvery, func() { rc.tick(ctx) }) })
	}
	if m.cfg.HealthCheck {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.watchHealth(ctx)
		}()
	} else {
		m.log.Info("GPU health checking is off")
	}
	return m.serve(ctx, alloc, alloc.kubeletRestarted)
}

// serve keeps a registered server running until ctx ends. kubeletRestarted
// runs when the kubelet's socket is created again, before registering anew.
func (m *Manager) serve(ctx context.Context, alloc server.Allocator, kubeletRestarted func()) error {
	watcher, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch %s: %w", m.cfg.DevicePluginDir, err)
	}
	defer watcher.Close()
	kubeletSock := filepath.Join(m.cfg.DevicePluginDir, server.KubeletSocket)
	watching := false
	backoff := m.cfg.MinBackoff
	defer m.stopServer()
	// Publishes the node again after each registration and when the Node
	// loses what we publish; it never blocks serving.
	pub := m.startRepublisher(ctx, nodeViewOf(alloc))
	defer pub.stop()
	for {
		if !watching {
			// The directory may not exist before the kubelet's first start.
			if err := watcher.Add(m.cfg.DevicePluginDir); err != nil {
				m.log.Warn("cannot watch the device-plugin directory yet", zap.String("dir", m.cfg.DevicePluginDir), zap.Error(err))
			} else {
				watching = true
			}
		}
		var done <-chan struct{}
		began := time.Now()
		if err := m.startServer(ctx, alloc); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			m.log.Warn("start and register failed; retrying", zap.Duration("backoff", backoff), zap.Error(err))
		} else {
			m.log.Info("registered with the kubelet", zap.Duration("took", time.Since(began)))
			backoff = m.cfg.MinBackoff
			done = m.currentServer().Done()
			pub.trigger()
			if m.cfg.OnRegistered != nil {
				m.cfg.OnRegistered()
			}
		}
		var retry <-chan time.Time
		var t *time.Timer
		if done == nil {
			t = time.NewTimer(backoff)
			retry = t.C
			backoff = min(2*backoff, m.cfg.MaxBackoff)
		}
		again := m.waitRestart(ctx, watcher, kubeletSock, done, retry, kubeletRestarted)
		if t != nil {
			t.Stop()
		}
		if !again {
			return nil
		}
	}
}

// waitRestart blocks until something calls for a restart (true) or ctx ends (false).
func (m *Manager) waitRestart(ctx context.Context, w *fsnotify.Watcher, kubeletSock string, done <-chan struct{}, retry <-chan time.Time, kubeletRestarted func()) bool {
	for {
		select {
		case <-ctx.Done():
			return false
		case <-retry:
			return true
		case <-done:
			m.log.Warn("device plugin server stopped by itself; restarting")
			return true
		case <-m.cfg.Restart:
			m.log.Info("restart requested")
			return true
		case ev, ok := <-w.Events:
			if !ok {
				return false
			}
			if ev.Name == kubeletSock && ev.Has(fsnotify.Create) {
				m.log.Info("kubelet.sock re-created: the kubelet restarted; registering again")
				kubeletRestarted()
				return true
			}
		case err, ok := <-w.Errors:
			if !ok {
				return false
			}
			m.log.Warn("watching the device-plugin directory", zap.Error(err))
		}
	}
}

// startServer replaces any running server with a new one and registers it.
func (m *Manager) startServer(ctx context.Context, alloc server.Allocator) error {
	m.stopServer()
	srv, err := server.New(server.Config{
		Dir: m.cfg.DevicePluginDir, Allocator: alloc, Devices: m.inventory().Devices(), Logger: m.log,
	})
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.srv = srv
	m.mu.Unlock()
	if err := srv.Start(ctx); err != nil {
		return err
	}
	// Health may have changed between New and Start; resend the latest list.
	srv.SetDevices(m.inventory().Devices())
	return srv.Register(ctx)
}

// currentServer returns the running server, if any.
func (m *Manager) currentServer() *server.Server {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.srv
}

// stopServer stops the running server, if any.
func (m *Manager) stopServer() {
	m.mu.Lock()
	srv := m.srv
	m.srv = nil
	m.mu.Unlock()
	if srv != nil {
		srv.Stop()
	}
}

// every calls fn every period until ctx ends.
func every(ctx context.Context, period time.Duration, fn func()) {
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			fn()
		}
	}
}
