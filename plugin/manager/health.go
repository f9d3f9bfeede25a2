package manager

import (
	"context"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/gpushare/gpushare/plugin/inventory"
	"github.com/gpushare/gpushare/plugin/nvml"
)

// recoveryOf maps the watch's cause of a fault to what brings the GPU back
// (docs/device-plugin.md, "Health", has the table).
func recoveryOf(c nvml.Cause) inventory.Recovery {
	switch c {
	case nvml.CauseFatal:
		return inventory.Never
	case nvml.CauseUnwatched:
		return inventory.WhenWatched
	default:
		return inventory.AfterQuiet
	}
}

// healthWatch is the state of watchHealth's loop: the NVML watch, whose
// setup is retried with backoff while it fails, and the recovery timer.
type healthWatch struct {
	m       *Manager
	opts    nvml.HealthOptions
	events  chan nvml.HealthEvent
	ended   chan error // WatchHealth's result; nil while none runs
	backoff time.Duration
	retry   *time.Timer // next setup attempt; nil unless waiting for one
	recover *time.Timer // next quiet-period recovery; nil when none is due
}

// watchHealth turns NVML health events into inventory changes, brings GPUs
// with transient faults back after the quiet period, and publishes every
// change to the kubelet and the node, until ctx ends. While the watch
// cannot be set up, every GPU is unhealthy (its health is unknown) and the
// setup is retried between MinBackoff and MaxBackoff.
func (m *Manager) watchHealth(ctx context.Context) {
	h := &healthWatch{m: m, opts: m.cfg.Health, events: make(chan nvml.HealthEvent, 16), backoff: m.cfg.MinBackoff}
	h.opts.IgnoredXids = slices.Clone(h.opts.IgnoredXids)
	h.opts.FatalXids = slices.Clone(h.opts.FatalXids)
	defer h.stopTimers()
	h.start(ctx)
	for {
		select {
		case <-ctx.Done():
			if h.ended != nil {
				<-h.ended
			}
			return
		case err := <-h.ended:
			h.watchEnded(ctx, err)
		case <-timerC(h.retry):
			h.retry = nil
			h.start(ctx)
		case ev := <-h.events:
			h.apply(ctx, ev)
		case <-timerC(h.recover):
			h.recover = nil
			next, recovered := m.inventory().Recover(time.Now(), m.cfg.HealthQuietPeriod)
			if len(recovered) > 0 {
				m.log.Info("GPUs healthy again after the quiet period", zap.Ints("gpus", recovered))
				m.setInventory(ctx, next, true)
			}
		}
		h.armRecovery()
	}
}

// timerC is t's channel, or nil (never ready) for no timer.
func timerC(t *time.Timer) <-chan time.Time {
	if t == nil {
		return nil
	}
	return t.C
}

// start runs one WatchHealth in the background.
func (h *healthWatch) start(ctx context.Context) {
	ended := make(chan error, 1)
	h.ended = ended
	go func() { ended <- h.m.cfg.Library.WatchHealth(ctx, h.opts, h.events) }()
}

// watchEnded handles WatchHealth's return before ctx ended: a setup failure
// makes every GPU's health unknown until a retry succeeds; nil means the
// library was shut down, after which nothing can be watched again.
func (h *healthWatch) watchEnded(ctx context.Context, err error) {
	h.ended = nil
	if ctx.Err() != nil {
		return // the loop ends at its next turn
	}
	if err == nil {
		h.m.log.Info("GPU health watch ended: the NVML library was shut down")
		return
	}
	h.m.log.Error("GPU health watch unavailable; every GPU is unhealthy until it works",
		zap.Duration("retryIn", h.backoff), zap.Error(err))
	h.markAll(ctx, "health watch unavailable: "+err.Error())
	h.retry = time.NewTimer(h.backoff)
	h.backoff = min(2*h.backoff, h.m.cfg.MaxBackoff)
}

// markAll marks every GPU unhealthy until it is watched.
func (h *healthWatch) markAll(ctx context.Context, reason string) {
	inv, changed := h.m.inventory(), false
	now := time.Now()
	for _, g := range inv.GPUs() {
		next, c, err := inv.SetUnhealthy(g.Index, reason, inventory.WhenWatched, now)
		if err == nil {
			inv, changed = next, changed || c
		}
	}
	h.m.setInventory(ctx, inv, changed)
}

// apply turns one health event into an inventory change.
func (h *healthWatch) apply(ctx context.Context, ev nvml.HealthEvent) {
	m := h.m
	inv := m.inventory()
	idx, ok := inv.IndexOfUUID(ev.UUID)
	if !ok {
		idx = ev.Index
	}
	if ev.Cause == nvml.CauseWatched {
		h.backoff = m.cfg.MinBackoff // the watch works again
		next, changed, err := inv.Watched(idx)
		if err == nil && changed {
			m.log.Info("GPU health is watched again; GPU healthy", zap.Int("gpu", idx), zap.String("uuid", ev.UUID))
			m.setInventory(ctx, next, true)
		}
		return
	}
	rec := recoveryOf(ev.Cause)
	next, changed, err := inv.SetUnhealthy(idx, ev.Reason, rec, time.Now())
	if err != nil {
		m.log.Warn("health event for an unknown GPU", zap.Int("gpu", ev.Index), zap.String("uuid", ev.UUID), zap.Error(err))
		return
	}
	// An earlier fatal fault outlasts a later transient one: say what holds now.
	if st, ok := next.GPU(idx); ok {
		rec = st.Recovery
	}
	log := m.log.Warn
	if rec == inventory.Never {
		log = m.log.Error
	}
	log("GPU unhealthy", zap.Int("gpu", idx), zap.String("uuid", ev.UUID), zap.Uint64("xid", ev.Xid),
		zap.String("reason", ev.Reason), zap.Stringer("cause", ev.Cause), zap.String("until", untilText(rec, m.cfg.HealthQuietPeriod)))
	m.setInventory(ctx, next, changed)
}

// untilText says in a log line what brings a GPU back.
func untilText(rec inventory.Recovery, quiet time.Duration) string {
	switch rec {
	case inventory.Never:
		return "the GPU is reset or repaired and the device plugin restarted"
	case inventory.WhenWatched:
		return "its health can be watched again"
	default:
		return quiet.String() + " without a health event"
	}
}

// armRecovery re-arms the recovery timer for the earliest GPU due.
func (h *healthWatch) armRecovery() {
	if h.recover != nil {
		h.recover.Stop()
		h.recover = nil
	}
	if at, ok := h.m.inventory().NextRecovery(h.m.cfg.HealthQuietPeriod); ok {
		h.recover = time.NewTimer(max(time.Until(at), 0))
	}
}

// stopTimers releases the timers when the loop ends.
func (h *healthWatch) stopTimers() {
	for _, t := range []*time.Timer{h.retry, h.recover} {
		if t != nil {
			t.Stop()
		}
	}
}

// setInventory installs inv and, when the kubelet-visible state changed,
// pushes the device list and republishes the node description.
func (m *Manager) setInventory(ctx context.Context, inv *inventory.Inventory, changed bool) {
	m.mu.Lock()
	before := m.inv
	m.inv = inv
	srv := m.srv
	events := m.events
	m.mu.Unlock()
	if !changed {
		return
	}
	events.healthChanged(before, inv)
	if srv != nil {
		srv.SetDevices(inv.Devices())
	}
	if err := publishNode(ctx, m.cfg.Client, m.cfg.Node, inv, m.cfg.Library.Simulated(), m.tierStatuses(inv)); err != nil {
		m.log.Error("publish GPU health on the node", zap.Error(err))
	}
}
