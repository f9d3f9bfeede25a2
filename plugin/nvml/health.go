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

// HealthEvent reports what the watch learnt about one GPU: a fault, whose
// Cause says what can bring the GPU back, or (CauseWatched) that the watch
// covers the GPU. NVML reports no recovery from a fault: bringing a GPU back
// after a transient one is the caller's decision.
type HealthEvent struct {
	// Index is the GPU's NVML index.
	Index int
	// UUID is the GPU's UUID, the key the inventory should use.
	UUID string
	// Xid is the Xid error code, or 0 when the event is not an Xid (ECC, GPU lost, watch state).
	Xid uint64
	// Cause classifies the event; see Cause.
	Cause Cause
	// Reason is a human-readable cause for logs and the node's published health.
	Reason string
}

// DefaultReprobeInterval is how often a GPU that could not be registered
// for events is tried again.
const DefaultReprobeInterval = time.Minute

// HealthOptions tunes WatchHealth; the zero value is the production default.
type HealthOptions struct {
	// IgnoredXids are skipped in addition to DefaultIgnoredXids, for sites
	// that see other application-caused Xids.
	IgnoredXids []uint64
	// FatalXids are fatal in addition to DefaultFatalXids; an Xid both
	// ignored and fatal is ignored.
	FatalXids []uint64
	// WaitTimeout bounds each NVML wait; 0 means DefaultWaitTimeout.
	WaitTimeout time.Duration
	// ReprobeInterval paces new registration attempts for GPUs whose
	// registration failed; 0 means DefaultReprobeInterval.
	ReprobeInterval time.Duration
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
// double-bit ECC events and sends HealthEvents to events (blocking until the
// receiver takes one, ctx ends or Shutdown begins): first one per GPU saying
// whether it is watched (CauseWatched, also for GPUs that support no events,
// which are logged and left unwatched) or not (CauseUnwatched, retried every
// ReprobeInterval until it works), then one per fault and affected GPU. It
// returns nil when ctx ends or Shutdown begins, and an error only when the
// watch cannot be set up at all.
func (l *library) WatchHealth(ctx context.Context, opts HealthOptions, events chan<- HealthEvent) error {
	if events == nil {
		return errors.New("watch GPU health: nil events channel")
	}
	if err := l.enter(); err != nil {
		return fmt.Errorf("watch GPU health: %w", err)
	}
	defer l.calls.Done()

	gpus, handles, _, err := l.devices()
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

	w := newWatcher(ctx, l, opts, events, gpus, handles)
	for i := range gpus {
		if !w.register(i, set) {
			return nil
		}
	}
	l.log.Info("watching GPU health", zap.Int("gpus", len(gpus)), zap.Int("unwatched", len(w.unwatched)),
		zap.Uint64s("ignoredXids", sortedKeys(w.ignored)), zap.Uint64s("fatalXids", sortedKeys(w.fatal)))
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
	handles []nvml.Device
	byUUID  map[string]GPU
	ignored map[uint64]bool
	fatal   map[uint64]bool
	timeout time.Duration
	// unwatched holds the positions in gpus whose registration failed;
	// they are tried again every reprobe, from nextProbe on.
	unwatched []int
	reprobe   time.Duration
	nextProbe time.Time
	// lost remembers that NVML already said a GPU is lost, so a persistent
	// loss is reported once rather than on every wait.
	lost bool
}

// newWatcher prepares the lookup tables of one watch.
func newWatcher(ctx context.Context, l *library, opts HealthOptions, events chan<- HealthEvent, gpus []GPU, handles []nvml.Device) *watcher {
	w := &watcher{
		ctx:     ctx,
		l:       l,
		log:     l.log,
		events:  events,
		gpus:    gpus,
		handles: handles,
		byUUID:  make(map[string]GPU, len(gpus)),
		ignored: setOf(DefaultIgnoredXids(), opts.IgnoredXids),
		fatal:   setOf(DefaultFatalXids(), opts.FatalXids),
		timeout: opts.WaitTimeout,
		reprobe: opts.ReprobeInterval,
	}
	if w.timeout <= 0 {
		w.timeout = DefaultWaitTimeout
	}
	if w.reprobe <= 0 {
		w.reprobe = DefaultReprobeInterval
	}
	for _, g := range gpus {
		w.byUUID[g.UUID] = g
	}
	return w
}

// setOf merges lists of Xids into a set.
func setOf(lists ...[]uint64) map[uint64]bool {
	out := make(map[uint64]bool)
	for _, l := range lists {
		for _, x := range l {
			out[x] = true
		}
	}
	return out
}

// sortedKeys lists a set of Xids in order, for log lines.
func sortedKeys(set map[uint64]bool) []uint64 {
	out := make([]uint64, 0, len(set))
	for x := range set {
		out = append(out, x)
	}
	slices.Sort(out)
	return out
}

// subscription is the outcome of registering one GPU for events.
type subscription int

const (
	subscribed  subscription = iota // events will arrive
	unsupported                     // the GPU offers none of them, and never will
	failed                          // NVML failed: the GPU's health is unknown
)

// subscribe registers GPU i for the watched events; err explains a failure.
func (w *watcher) subscribe(i int, set nvml.EventSet) (subscription, error) {
	gpu, dev := w.gpus[i], w.handles[i]
	supported, ret := dev.GetSupportedEventTypes()
	switch ret {
	case nvml.SUCCESS:
	case nvml.ERROR_NOT_SUPPORTED:
		return unsupported, errors.New("GPU supports no NVML events")
	default:
		return failed, newCallError(fmt.Sprintf("GPU %d: get supported event types", gpu.Index), ret)
	}
	mask := watchedEvents & supported
	if mask == 0 {
		return unsupported, fmt.Errorf("GPU supports none of the watched NVML events (supported mask %#x)", supported)
	}
	switch ret := dev.RegisterEvents(mask, set); ret {
	case nvml.SUCCESS:
		return subscribed, nil
	case nvml.ERROR_NOT_SUPPORTED:
		return unsupported, errors.New("GPU does not support NVML event registration")
	default:
		return failed, newCallError(fmt.Sprintf("GPU %d: register events", gpu.Index), ret)
	}
}

// register subscribes GPU i and reports the outcome as an event. It returns
// false when the watch is ending (ctx done or Shutdown) while it was sending.
func (w *watcher) register(i int, set nvml.EventSet) bool {
	gpu := w.gpus[i]
	log := w.log.With(zap.Int("index", gpu.Index), zap.String("uuid", gpu.UUID))
	sub, err := w.subscribe(i, set)
	switch sub {
	case unsupported:
		log.Info("GPU health is not watched", zap.String("why", err.Error()))
	case failed:
		log.Warn("cannot watch GPU health; marking it unhealthy until the watch works",
			zap.Duration("retryEvery", w.reprobe), zap.Error(err))
		w.unwatched = append(w.unwatched, i)
		w.nextProbe = time.Now().Add(w.reprobe)
		return w.send(HealthEvent{Index: gpu.Index, UUID: gpu.UUID, Cause: CauseUnwatched, Reason: "health watch unavailable: " + err.Error()})
	}
	return w.send(HealthEvent{Index: gpu.Index, UUID: gpu.UUID, Cause: CauseWatched, Reason: "watched"})
}

// reprobeDue tries again, once the reprobe interval has passed, to register
// the GPUs whose registration failed, and reports those that now work.
// False means the watch is ending.
func (w *watcher) reprobeDue(set nvml.EventSet) bool {
	if len(w.unwatched) == 0 || time.Now().Before(w.nextProbe) {
		return true
	}
	w.nextProbe = time.Now().Add(w.reprobe)
	still := w.unwatched[:0:0]
	for _, i := range w.unwatched {
		gpu := w.gpus[i]
		if sub, err := w.subscribe(i, set); sub == failed {
			w.log.Debug("GPU still cannot be watched", zap.Int("index", gpu.Index), zap.Error(err))
			still = append(still, i)
			continue
		}
		w.log.Info("GPU health is watched again", zap.Int("index", gpu.Index), zap.String("uuid", gpu.UUID))
		if !w.send(HealthEvent{Index: gpu.Index, UUID: gpu.UUID, Cause: CauseWatched, Reason: "watched"}) {
			return false
		}
	}
	w.unwatched = still
	return true
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
		if !w.reprobeDue(set) {
			return
		}
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
				w.log.Error("NVML reports a GPU is lost; marking every GPU unhealthy for the life of this process")
				if !w.sendAll(0, CauseFatal, "GPU is lost (NVML ERROR_GPU_IS_LOST)") {
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

// classify turns one NVML event into a cause and a reason; ok is false for
// events that say nothing about the GPU's health (ignored Xids, other types).
func (w *watcher) classify(data nvml.EventData) (xid uint64, cause Cause, reason string, ok bool) {
	switch data.EventType {
	case nvml.EventTypeXidCriticalError:
		xid = data.EventData
		if w.ignored[xid] {
			w.log.Info("ignoring application Xid", zap.Uint64("xid", xid))
			return 0, 0, "", false
		}
		cause = XidCause(xid, w.fatal)
		return xid, cause, fmt.Sprintf("critical Xid %d", xid), true
	case nvml.EventTypeDoubleBitEccError:
		// NVML does not say whether the error was contained; an
		// uncorrectable memory error is fatal either way (see DefaultFatalXids).
		return 0, CauseFatal, "uncorrectable (double-bit) ECC error", true
	default:
		w.log.Debug("ignoring NVML event", zap.Uint64("eventType", data.EventType))
		return 0, 0, "", false
	}
}

// handle turns one NVML event into health events; false means the watch is ending.
func (w *watcher) handle(data nvml.EventData) bool {
	xid, cause, reason, ok := w.classify(data)
	if !ok {
		return true
	}
	if data.Device == nil {
		w.log.Error("NVML event names no GPU; marking every GPU unhealthy", zap.String("reason", reason), zap.Stringer("cause", cause))
		return w.sendAll(xid, cause, reason)
	}
	uuid, ret := data.Device.GetUUID()
	if ret != nvml.SUCCESS {
		w.log.Error("cannot tell which GPU an NVML event is for; marking every GPU unhealthy",
			zap.String("reason", reason), zap.Stringer("cause", cause), zap.Error(newCallError("get UUID of event's GPU", ret)))
		return w.sendAll(xid, cause, reason)
	}
	gpu, ok := w.byUUID[uuid]
	if !ok {
		w.log.Warn("NVML event for a GPU that is not in the device list; ignored",
			zap.String("uuid", uuid), zap.String("reason", reason))
		return true
	}
	w.log.Warn("GPU unhealthy", zap.Int("index", gpu.Index), zap.String("uuid", gpu.UUID),
		zap.Uint64("xid", xid), zap.Stringer("cause", cause), zap.String("reason", reason))
	return w.send(HealthEvent{Index: gpu.Index, UUID: gpu.UUID, Xid: xid, Cause: cause, Reason: reason})
}

// sendAll reports every GPU unhealthy, for events NVML cannot attribute.
func (w *watcher) sendAll(xid uint64, cause Cause, reason string) bool {
	for _, g := range w.gpus {
		if !w.send(HealthEvent{Index: g.Index, UUID: g.UUID, Xid: xid, Cause: cause, Reason: reason}) {
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
