package manager

import (
	"context"
	"fmt"
	"os"
	"time"

	"go.uber.org/zap"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/inventory"
	"github.com/gpushare/gpushare/plugin/isolation"
)

// Tier probing defaults.
const (
	// DefaultProbeEvery paces the probes of the tier's prerequisite: a dead
	// MPS daemon is published, and refused at Allocate, within about this
	// long (plus one probe's timeout and one PATCH).
	DefaultProbeEvery = 2 * time.Second
	// probeTimeout bounds one probe (an MPS control command).
	probeTimeout = 5 * time.Second
	// maxStartBackoff bounds the wait between failed starts of the daemon.
	maxStartBackoff = time.Minute
	// stopTimeout bounds stopping the daemon at exit.
	stopTimeout = 30 * time.Second
	// reasonRefresh bounds how often a down tier whose reason alone changes
	// (a PID, a start's error after a probe's) is written again: a PATCH per
	// probe on every fenced node would load the API server for nothing.
	reasonRefresh = time.Minute
)

// IsolationConfig configures the memory-isolation tiers
// (docs/device-plugin.md, "Isolation tiers").
type IsolationConfig struct {
	// Tier is the node's tier unless its label gpushare.io/isolation says
	// otherwise; "" means none.
	Tier gpushare.Isolation
	// Paths are each tier's host paths.
	Paths isolation.Config
	// MPS is the node's MPS control daemon; nil keeps the mps tier down.
	// Its PipeDir must be Paths.MPSPipeDir: clients are handed that one.
	MPS isolation.MPSDaemon
	// ProbeEvery paces the probes; 0 means DefaultProbeEvery.
	ProbeEvery time.Duration
}

// check validates c and fills in defaults.
func (c *IsolationConfig) check() error {
	if c.Tier == "" {
		c.Tier = gpushare.IsolationNone
	}
	if _, err := gpushare.ParseIsolation(string(c.Tier)); err != nil {
		return err
	}
	if c.ProbeEvery <= 0 {
		c.ProbeEvery = DefaultProbeEvery
	}
	if c.MPS != nil && c.MPS.PipeDir() != c.Paths.MPSPipeDir {
		return fmt.Errorf("the MPS control daemon's pipe directory %q is not the one containers are given (%q)", c.MPS.PipeDir(), c.Paths.MPSPipeDir)
	}
	return nil
}

// tierWatch keeps the node's tier and its prerequisite's state. In the mps
// tier it runs the node's daemon: it starts it, and starts it again when it
// stops answering. A dead daemon fences the whole node (every Allocate is
// refused), and the daemon holds no state worth waiting for: the limits are
// each client's environment, and clients of a dead daemon are lost whatever
// we do. So restarting at once is the only way back, backed off while starts
// fail so a broken driver is not hammered.
type tierWatch struct {
	cfg    IsolationConfig
	log    *zap.Logger
	labels func() map[string]string // the plugin's Node's labels; nil when unknown
	prober isolation.Prober

	started  bool // Start succeeded at least once
	lastTier gpushare.Isolation
	failures int       // consecutive failed starts
	startErr string    // the last failed start's error; empty after a success
	nextTry  time.Time // no start before
}

func newTierWatch(cfg IsolationConfig, log *zap.Logger, labels func() map[string]string) *tierWatch {
	return &tierWatch{cfg: cfg, log: log.Named("isolation"), labels: labels,
		prober: isolation.Prober{Config: cfg.Paths, MPS: cfg.MPS}}
}

// status decides the node's tier now: starting the MPS daemon or creating
// hami-core's directories when its tier needs them, then probing.
func (w *tierWatch) status(ctx context.Context) isolation.Status {
	tier, err := isolation.NodeTier(w.cfg.Tier, w.labels())
	if err != nil {
		return isolation.Status{Down: true, Reason: err.Error() + "; refusing every container until it is fixed"}
	}
	w.lastTier = tier
	if tier == gpushare.IsolationHAMiCore {
		w.ensureHAMiDirs()
	}
	st := w.probe(ctx, tier)
	if tier != gpushare.IsolationMPS || !st.Down || w.cfg.MPS == nil {
		return st
	}
	if !time.Now().Before(w.nextTry) && w.start(ctx) {
		return w.probe(ctx, tier)
	}
	if w.startErr != "" {
		st.Reason += "; starting it again failed: " + w.startErr
	}
	return st
}

func (w *tierWatch) probe(ctx context.Context, tier gpushare.Isolation) isolation.Status {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	return w.prober.Probe(ctx, tier)
}

// start starts the daemon, backing off after failures.
func (w *tierWatch) start(ctx context.Context) bool {
	err := w.cfg.MPS.Start(ctx)
	if err == nil {
		w.started, w.failures, w.startErr = true, 0, ""
		w.log.Info("MPS control daemon started", zap.String("pipeDir", w.cfg.MPS.PipeDir()))
		return true
	}
	w.failures++
	w.startErr = err.Error()
	wait := min(w.cfg.ProbeEvery<<min(w.failures, 10), maxStartBackoff)
	w.nextTry = time.Now().Add(wait)
	w.log.Error("start the MPS control daemon; every Allocate is refused until it answers",
		zap.Int("failures", w.failures), zap.Duration("retryIn", wait), zap.Error(err))
	return false
}

// ensureHAMiDirs creates hami-core's lock directory and cache root. Every
// container user must be able to create files in them (HAMi's device plugin
// makes /tmp/vgpulock 0777 the same way); a failure shows in the probe.
func (w *tierWatch) ensureHAMiDirs() {
	p := w.cfg.Paths
	for dir, mode := range map[string]os.FileMode{p.HAMiLockDir: 0o777, p.HAMiCacheRoot: 0o755} {
		if dir == "" {
			continue
		}
		if fi, err := os.Stat(dir); err == nil && fi.IsDir() {
			continue
		}
		if err := os.MkdirAll(dir, mode); err != nil {
			w.log.Warn("create a hami-core directory", zap.String("dir", dir), zap.Error(err))
			continue
		}
		if err := os.Chmod(dir, mode); err != nil { // MkdirAll's mode is cut by the umask
			w.log.Warn("chmod a hami-core directory", zap.String("dir", dir), zap.Error(err))
		}
	}
}

// stop stops the daemon at exit when this plugin ran it: the answers it
// gave send clients to it, and its compute-mode changes are undone by Stop.
func (w *tierWatch) stop() {
	if w.cfg.MPS == nil || (!w.started && w.lastTier != gpushare.IsolationMPS) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	if err := w.cfg.MPS.Stop(ctx); err != nil {
		w.log.Error("stop the MPS control daemon", zap.Error(err))
		return
	}
	w.log.Info("MPS control daemon stopped")
}

// logChange logs a change of the node's tier state.
func (w *tierWatch) logChange(old, now isolation.Status, known bool) {
	fields := []zap.Field{zap.String("tier", string(now.Tier)), zap.String("effective", string(now.Effective()))}
	switch {
	case now.Down:
		w.log.Error("isolation tier down: every Allocate is refused until it is back; GPUs published with tier none",
			append(fields, zap.String("reason", now.Reason))...)
	case !known || old.Down || old.Tier != now.Tier:
		w.log.Info("isolation tier up", fields...)
	}
}

// tierStatuses returns every GPU of inv with the node's tier, or nil before
// the first probe (the seed's answers).
func (m *Manager) tierStatuses(inv *inventory.Inventory) map[int]isolation.Status {
	m.mu.Lock()
	st, known := m.tier, m.tierKnown
	m.mu.Unlock()
	if !known || inv == nil {
		return nil
	}
	out := make(map[int]isolation.Status, len(inv.GPUs()))
	for _, g := range inv.GPUs() {
		out[g.Index] = st
	}
	return out
}

// setTier installs the node's tier state and, when it changed, logs it
// and publishes it on the Node at once (the republisher repairs a lost write).
// A change of the reason alone is taken at most every reasonRefresh.
func (m *Manager) setTier(ctx context.Context, w *tierWatch, st isolation.Status) {
	m.mu.Lock()
	old, known := m.tier, m.tierKnown
	reasonOnly := known && old.Tier == st.Tier && old.Down == st.Down
	if (reasonOnly && time.Since(m.tierSince) < reasonRefresh) || (known && old == st) {
		m.mu.Unlock()
		return
	}
	m.tier, m.tierKnown, m.tierSince = st, true, time.Now()
	inv := m.inv
	m.mu.Unlock()
	w.logChange(old, st, known)
	if !known {
		return // Run publishes the node right after the first probe
	}
	if err := publishNode(ctx, m.cfg.Client, m.cfg.Node, inv, m.cfg.Library.Simulated(), m.tierStatuses(inv)); err != nil {
		m.log.Error("publish the isolation tier on the node", zap.Error(err))
	}
}

// watchTiers probes every ProbeEvery until ctx ends.
func (m *Manager) watchTiers(ctx context.Context, w *tierWatch) {
	every(ctx, w.cfg.ProbeEvery, func() { m.setTier(ctx, w, w.status(ctx)) })
}
