package dra

import (
	"context"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/gpushare/gpushare/plugin/inventory"
	"github.com/gpushare/gpushare/plugin/nvml"
)

// watchHealth applies NVML's health events to n with device-plugin mode's
// rules (docs/device-plugin.md, "Health"): a fatal fault lasts for the life
// of the process, a transient one until the quiet period passes without
// another event, and while the watch cannot be set up every GPU is
// unhealthy and the setup is retried with backoff.
func watchHealth(ctx context.Context, cfg Config, n *node, log *zap.Logger) {
	opts := cfg.Health
	opts.IgnoredXids, opts.FatalXids = slices.Clone(opts.IgnoredXids), slices.Clone(opts.FatalXids)
	events := make(chan nvml.HealthEvent, 16)
	backoff := cfg.MinBackoff
	var ended chan error
	start := func() {
		ended = make(chan error, 1)
		go func(ch chan<- error) { ch <- cfg.Library.WatchHealth(ctx, opts, events) }(ended)
	}
	var retry, heal *time.Timer
	defer func() {
		for _, t := range []*time.Timer{retry, heal} {
			if t != nil {
				t.Stop()
			}
		}
	}()
	start()
	for {
		select {
		case <-ctx.Done():
			if ended != nil {
				<-ended
			}
			return
		case err := <-ended:
			ended = nil
			retry = watchEnded(ctx, err, n, log, &backoff, cfg.MaxBackoff)
		case <-timerC(retry):
			retry = nil
			start()
		case ev := <-events:
			if ev.Cause == nvml.CauseWatched {
				backoff = cfg.MinBackoff
			}
			applyHealth(n, ev, log)
		case <-timerC(heal):
			heal = nil
			n.update(func(inv *inventory.Inventory) (*inventory.Inventory, bool) {
				next, recovered := inv.Recover(time.Now(), cfg.HealthQuietPeriod)
				if len(recovered) > 0 {
					log.Info("GPUs healthy again after the quiet period", zap.Ints("gpus", recovered))
				}
				return next, len(recovered) > 0
			})
		}
		heal = rearm(heal, n, cfg.HealthQuietPeriod)
	}
}

// watchEnded handles the watch's end before ctx's: nil means NVML was shut
// down; an error makes every GPU's health unknown until a retry, which it
// schedules.
func watchEnded(ctx context.Context, err error, n *node, log *zap.Logger, backoff *time.Duration, maxBackoff time.Duration) *time.Timer {
	if ctx.Err() != nil || err == nil {
		return nil
	}
	log.Error("GPU health watch unavailable; every GPU is unhealthy until it works", zap.Duration("retryIn", *backoff), zap.Error(err))
	for _, g := range n.base {
		applyHealth(n, nvml.HealthEvent{Index: g.Index, UUID: g.UUID, Cause: nvml.CauseUnwatched, Reason: "health watch unavailable: " + err.Error()}, log)
	}
	t := time.NewTimer(*backoff)
	*backoff = min(2**backoff, maxBackoff)
	return t
}

// applyHealth applies one event and logs what it changed.
func applyHealth(n *node, ev nvml.HealthEvent, log *zap.Logger) {
	idx, changed, err := n.health(ev, time.Now())
	switch {
	case err != nil:
		log.Warn("health event for an unknown GPU", zap.Int("gpu", ev.Index), zap.String("uuid", ev.UUID), zap.Error(err))
	case changed && ev.Cause == nvml.CauseWatched:
		log.Info("GPU health is watched again; GPU healthy", zap.Int("gpu", idx))
	case changed:
		log.Warn("GPU unhealthy: its device is tainted", zap.Int("gpu", idx), zap.String("uuid", ev.UUID), zap.Uint64("xid", ev.Xid),
			zap.Stringer("cause", ev.Cause), zap.String("reason", ev.Reason))
	}
}

// rearm sets the recovery timer for the earliest GPU due to heal.
func rearm(t *time.Timer, n *node, quiet time.Duration) *time.Timer {
	if t != nil {
		t.Stop()
	}
	n.mu.Lock()
	at, ok := n.inv.NextRecovery(quiet)
	n.mu.Unlock()
	if !ok {
		return nil
	}
	return time.NewTimer(max(time.Until(at), 0))
}

// timerC is t's channel, or nil (never ready) for no timer.
func timerC(t *time.Timer) <-chan time.Time {
	if t == nil {
		return nil
	}
	return t.C
}
