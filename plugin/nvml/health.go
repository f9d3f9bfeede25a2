package nvml

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"go.uber.org/zap"
)

// DefaultWaitTimeout bounds each NVML event wait, so a cancelled context or a
// Shutdown is noticed within this long even when no event arrives.
const DefaultWaitTimeout = 5 * time.Second

// watchedEvents are the event types that mean a GPU can no longer be trusted.
// Single-bit ECC errors are left out: the hardware corrected them, and on a
// busy GPU they would only add noise.
const watchedEvents = uint64(nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError)

// HealthEvent says that one GPU became unhealthy. NVML reports no recovery,
// so there is no healthy counterpart: bringing a GPU back is the caller's
// decision (for example when the plugin restarts and lists the GPUs again).
type HealthEvent struct {
	// Index is the GPU's NVML index.
	Index int
	// UUID is the GPU's UUID, the key the inventory should use.
	UUID string
	// Xid is the Xid error code, or 0 when the event is not an Xid (ECC, GPU lost).
	Xid uint64
	// Reason is a human-readable cause for logs and the node's published health.
	Reason string
}

// HealthOptions tunes WatchHealth; the zero value is the production default.
type HealthOptions struct {
	// IgnoredXids are skipped in addition to DefaultIgnoredXids, for sites
	// that see other application-caused Xids.
	IgnoredXids []uint64
	// WaitTimeout bounds each NVML wait; 0 means DefaultWaitTimeout.
	WaitTimeout time.Duration
}

// DefaultIgnoredXids returns the Xids NVIDIA's k8s-device-plugin skips by
// default, because an application, not the GPU, caused them: 13 (graphics
// engine exception), 31 (GPU memory page fault), 43 (GPU stopped processing),
// 45 (preemptive cleanup), 68 (video processor exception) and 109 (context
// switch timeout). A fresh slice each call, so callers may append to it.
func DefaultIgnoredXids() []uint64 {
	return []uint64{13, 31, 43, 45, 68, 109}
}

// WatchHealth implements Library. It registers every GPU for critical Xid and
// double-bit ECC events and sends one HealthEvent per affected GPU to events
// (blocking until the receiver takes it, ctx ends or Shutdown begins). GPUs
// that support no events are logged and left unwatched; a GPU whose
// registration fails for another reason is reported unhealthy, because it can
// no longer be watched. It returns nil when ctx ends or Shutdown begins, and
// an error only when the watch cannot be set up.
func (l *library) WatchHealth(ctx context.Context, opts HealthOptions, events chan<- HealthEvent) error {
	if events == nil {
		return errors.New("watch GPU health: nil events channel")
	}
	if err := l.enter(); err != nil {
		return fmt.Errorf("watch GPU health: %w", err)
	}
	defer l.calls.Done()

	gpus, handles, err := l.devices()
	if err != nil {
		return fmt.Errorf("watch GPU health: %w", err)
	}
	set, ret := l.iface.EventSetCreate()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("watch GPU health: %w", newCallError("create event set", ret))
	}
	if set == nil {
		return errors.New("watch GPU health: create event set returned no set")
	}
	defer func() {
		if ret := set.Free(); ret != nvml.SUCCESS {
			l.log.Warn("free NVML event set", zap.Error(newCallError("free event set", ret)))
		}
	}()

	w := newWatcher(ctx, l, opts, events, gpus)
	for i, dev := range handles {
		if !w.register(gpus[i], dev, set) {
			return nil
		}
	}
	l.log.Info("watching GPU health", zap.Int("gpus", len(gpus)), zap.Uint64s("ignoredXids", w.ignoredList()))
	w.loop(set)
	l.log.Info("stopped watching GPU health")
	return nil
}

// watcher is the state of one WatchHealth call.
type watcher struct {
	ctx     context.Context
	l       *library
	log     *zap.Logger
	events  chan<- HealthEvent
	gpus    []GPU
	byUUID  map[string]GPU
	ignored map[uint64]bool
	timeout time.Duration
	// lost remembers that NVML already said a GPU is lost, so a persistent
	// loss is reported once rather than on every wait.
	lost bool
}

// newWatcher prepares the lookup tables of one watch.
func newWatcher(ctx context.Context, l *library, opts HealthOptions, events chan<- HealthEvent, gpus []GPU) *watcher {
	w := &watcher{
		ctx:     ctx,
		l:       l,
		log:     l.log,
		events:  events,
		gpus:    gpus,
		byUUID:  make(map[string]GPU, len(gpus)),
		ignored: make(map[uint64]bool),
		timeout: opts.WaitTimeout,
	}
	if w.timeout <= 0 {
		w.timeout = DefaultWaitTimeout
	}
	for _, g := range gpus {
		w.byUUID[g.UUID] = g
	}
	for _, x := range DefaultIgnoredXids() {
		w.ignored[x] = true
	}
	for _, x := range opts.IgnoredXids {
		w.ignored[x] = true
	}
	return w
}

// ignoredList returns the ignored Xids for the log line.
func (w *watcher) ignoredList() []uint64 {
	out := make([]uint64, 0, len(w.ignored))
	for x := range w.ignored {
		out = append(out, x)
	}
	slices.Sort(out)
	return out
}

// register subscribes one GPU to the watched events. It returns false when
// the watch is ending (ctx done or Shutdown) while it was reporting a failure.
func (w *watcher) register(gpu GPU, dev nvml.Device, set nvml.EventSet) bool {
	log := w.log.With(zap.Int("index", gpu.Index), zap.String("uuid", gpu.UUID))
	supported, ret := dev.GetSupportedEventTypes()
	switch ret {
	case nvml.SUCCESS:
	case nvml.ERROR_NOT_SUPPORTED:
		log.Info("GPU supports no NVML events; its health is not watched")
		return true
	default:
		err := newCallError(fmt.Sprintf("GPU %d: get supported event types", gpu.Index), ret)
		log.Warn("cannot watch GPU health; marking it unhealthy", zap.Error(err))
		return w.send(HealthEvent{Index: gpu.Index, UUID: gpu.UUID, Reason: "health watch unavailable: " + err.Error()})
	}
	mask := watchedEvents & supported
	if mask == 0 {
		log.Info("GPU supports none of the watched NVML events; its health is not watched",
			zap.Uint64("supportedEvents", supported))
		return true
	}
	switch ret := dev.RegisterEvents(mask, set); ret {
	case nvml.SUCCESS:
		return true
	case nvml.ERROR_NOT_SUPPORTED:
		log.Info("GPU does not support NVML event registration; its health is not watched")
		return true
	default:
		err := newCallError(fmt.Sprintf("GPU %d: register events", gpu.Index), ret)
		log.Warn("cannot watch GPU health; marking it unhealthy", zap.Error(err))
		return w.send(HealthEvent{Index: gpu.Index, UUID: gpu.UUID, Reason: "health watch unavailable: " + err.Error()})
	}
}

// done reports whether the watch should end.
func (w *watcher) done() bool {
	select {
	case <-w.ctx.Done():
		return true
	case <-w.l.stop:
		return true
	default:
		return false
	}
}

// loop waits for events until ctx ends or Shutdown begins.
func (w *watcher) loop(set nvml.EventSet) {
	ms := w.timeout.Milliseconds()
	if ms < 1 {
		ms = 1
	}
	timeoutMs := uint32(min(ms, int64(^uint32(0))))
	for !w.done() {
		data, ret := set.Wait(timeoutMs)
		switch ret {
		case nvml.SUCCESS:
			if !w.handle(data) {
				return
			}
		case nvml.ERROR_TIMEOUT:
		case nvml.ERROR_GPU_IS_LOST:
			if !w.lost {
				w.lost = true
				w.log.Error("NVML reports a GPU is lost; marking every GPU unhealthy")
				if !w.sendAll(0, "GPU is lost (NVML ERROR_GPU_IS_LOST)") {
					return
				}
			}
			w.pause()
		default:
			// Some waits fail at once (driver trouble); pausing keeps a
			// persistent failure from spinning the CPU and flooding the log.
			w.log.Warn("wait for NVML events", zap.Error(newCallError("wait for events", ret)))
			w.pause()
		}
	}
}

// pause sleeps one wait timeout unless the watch ends first.
func (w *watcher) pause() {
	t := time.NewTimer(w.timeout)
	defer t.Stop()
	select {
	case <-t.C:
	case <-w.ctx.Done():
	case <-w.l.stop:
	}
}

// handle turns one NVML event into health events; false means the watch is ending.
func (w *watcher) handle(data nvml.EventData) bool {
	var xid uint64
	var reason string
	switch data.EventType {
	case nvml.EventTypeXidCriticalError:
		xid = data.EventData
		if w.ignored[xid] {
			w.log.Info("ignoring application Xid", zap.Uint64("xid", xid))
			return true
		}
		reason = fmt.Sprintf("critical Xid %d", xid)
	case nvml.EventTypeDoubleBitEccError:
		reason = "uncorrectable (double-bit) ECC error"
	default:
		w.log.Debug("ignoring NVML event", zap.Uint64("eventType", data.EventType))
		return true
	}

	if data.Device == nil {
		w.log.Error("NVML event names no GPU; marking every GPU unhealthy", zap.String("reason", reason))
		return w.sendAll(xid, reason)
	}
	uuid, ret := data.Device.GetUUID()
	if ret != nvml.SUCCESS {
		w.log.Error("cannot tell which GPU an NVML event is for; marking every GPU unhealthy",
			zap.String("reason", reason), zap.Error(newCallError("get UUID of event's GPU", ret)))
		return w.sendAll(xid, reason)
	}
	gpu, ok := w.byUUID[uuid]
	if !ok {
		w.log.Warn("NVML event for a GPU that is not in the device list; ignored",
			zap.String("uuid", uuid), zap.String("reason", reason))
		return true
	}
	w.log.Warn("GPU unhealthy", zap.Int("index", gpu.Index), zap.String("uuid", gpu.UUID),
		zap.Uint64("xid", xid), zap.String("reason", reason))
	return w.send(HealthEvent{Index: gpu.Index, UUID: gpu.UUID, Xid: xid, Reason: reason})
}

// sendAll reports every GPU unhealthy, for events NVML cannot attribute.
func (w *watcher) sendAll(xid uint64, reason string) bool {
	for _, g := range w.gpus {
		if !w.send(HealthEvent{Index: g.Index, UUID: g.UUID, Xid: xid, Reason: reason}) {
			return false
		}
	}
	return true
}

// send delivers ev unless the watch ends first; false means it ended.
func (w *watcher) send(ev HealthEvent) bool {
	select {
	case w.events <- ev:
		return true
	case <-w.ctx.Done():
		return false
	case <-w.l.stop:
		return false
	}
}
