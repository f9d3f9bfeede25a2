package manager

import (
	"context"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/gpushare/gpushare/plugin/inventory"
	"github.com/gpushare/gpushare/plugin/nvml"
)

// watchHealth turns NVML health events into inventory changes, brings GPUs
// back after the quiet period, and publishes every change to the kubelet
// and the node, until ctx ends.
func (m *Manager) watchHealth(ctx context.Context) {
	events := make(chan nvml.HealthEvent, 16)
	opts := m.cfg.Health
	opts.IgnoredXids = slices.Clone(opts.IgnoredXids)
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		if err := m.cfg.Library.WatchHealth(ctx, opts, events); err != nil {
			m.log.Error("GPU health watch failed; GPUs stay as they are", zap.Error(err))
		}
	}()
	quiet := m.cfg.HealthQuietPeriod
	var recover *time.Timer
	var recoverC <-chan time.Time
	defer func() {
		if recover != nil {
			recover.Stop()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			<-watchDone
			return
		case ev := <-events:
			inv := m.inventory()
			idx, ok := inv.IndexOfUUID(ev.UUID)
			if !ok {
				idx = ev.Index
			}
			next, changed, err := inv.SetUnhealthy(idx, ev.Reason, time.Now())
			if err != nil {
				m.log.Warn("health event for an unknown GPU", zap.Int("gpu", ev.Index), zap.String("uuid", ev.UUID), zap.Error(err))
				continue
			}
			m.log.Warn("GPU unhealthy", zap.Int("gpu", idx), zap.String("uuid", ev.UUID), zap.Uint64("xid", ev.Xid),
				zap.String("reason", ev.Reason), zap.Duration("quietPeriod", quiet))
			m.setInventory(ctx, next, changed)
		case <-recoverC:
			next, recovered := m.inventory().Recover(time.Now(), quiet)
			if len(recovered) > 0 {
				m.log.Info("GPUs healthy again after the quiet period", zap.Ints("gpus", recovered))
				m.setInventory(ctx, next, true)
			}
		}
		// Re-arm the recovery timer for the earliest unhealthy GPU.
		if recover != nil {
			recover.Stop()
			recover, recoverC = nil, nil
		}
		if at, ok := m.inventory().NextRecovery(quiet); ok {
			recover = time.NewTimer(max(time.Until(at), 0))
			recoverC = recover.C
		}
	}
}

// setInventory installs inv and, when the kubelet-visible state changed,
// pushes the device list and republishes the node description.
func (m *Manager) setInventory(ctx context.Context, inv *inventory.Inventory, changed bool) {
	m.mu.Lock()
	m.inv = inv
	srv := m.srv
	m.mu.Unlock()
	if !changed {
		return
	}
	if srv != nil {
		srv.SetDevices(inv.Devices())
	}
	if err := publishNode(ctx, m.cfg.Client, m.cfg.Node, inv, m.cfg.Library.Simulated()); err != nil {
		m.log.Error("publish GPU health on the node", zap.Error(err))
	}
}
