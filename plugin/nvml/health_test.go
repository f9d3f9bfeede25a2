package nvml

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"go.uber.org/zap/zaptest"
)

// testWait keeps each NVML wait short so stopping a watch is quick.
const testWait = 20 * time.Millisecond

// failAfter only turns a hang into a failure; no test waits for it to pass.
const failAfter = 10 * time.Second

// watch is one WatchHealth running in a goroutine.
type watch struct {
	events chan HealthEvent
	cancel context.CancelFunc
	// done is closed when WatchHealth has returned err.
	done chan struct{}
	err  error
}

// startWatch runs lib.WatchHealth until the test ends or stop is called.
func startWatch(t *testing.T, lib Library, opts HealthOptions, buffer int) *watch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &watch{events: make(chan HealthEvent, buffer), cancel: cancel, done: make(chan struct{})}
	if opts.WaitTimeout == 0 {
		opts.WaitTimeout = testWait
	}
	go func() {
		defer close(w.done)
		w.err = lib.WatchHealth(ctx, opts, w.events)
	}()
	t.Cleanup(func() { w.stop(t) })
	return w
}

// stop cancels the watch and returns what WatchHealth returned.
func (w *watch) stop(t *testing.T) error {
	t.Helper()
	w.cancel()
	return w.wait(t)
}

// wait returns what WatchHealth returned, failing if it does not return.
func (w *watch) wait(t *testing.T) error {
	t.Helper()
	select {
	case <-w.done:
		return w.err
	case <-time.After(failAfter):
		t.Fatalf("WatchHealth did not return within %v", failAfter)
		return nil
	}
}

// nextAny returns the next health event, failing if the watch ends or stalls.
func (w *watch) nextAny(t *testing.T) HealthEvent {
	t.Helper()
	select {
	case ev := <-w.events:
		return ev
	case <-w.done:
		t.Fatalf("WatchHealth returned early: %v", w.err)
	case <-time.After(failAfter):
		t.Fatalf("no health event within %v", failAfter)
	}
	return HealthEvent{}
}

// next returns the next fault, skipping the CauseWatched events every
// registered GPU sends first.
func (w *watch) next(t *testing.T) HealthEvent {
	t.Helper()
	for {
		if ev := w.nextAny(t); ev.Cause != CauseWatched {
			return ev
		}
	}
}

// noMoreFaults fails on any fault left in the buffer of a stopped watch.
func (w *watch) noMoreFaults(t *testing.T) {
	t.Helper()
	for {
		select {
		case ev := <-w.events:
			if ev.Cause != CauseWatched {
				t.Errorf("unexpected extra event %+v", ev)
			}
		default:
			return
		}
	}
}

// newSim builds a simulated machine that is shut down when the test ends.
func newSim(t *testing.T, backend string) (*Simulator, []GPU) {
	t.Helper()
	sim, err := NewSimulator(zaptest.NewLogger(t), backend)
	if err != nil {
		t.Fatalf("NewSimulator(%q): %v", backend, err)
	}
	t.Cleanup(func() {
		if err := sim.Shutdown(); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	gpus, err := sim.Devices()
	if err != nil {
		t.Fatalf("Devices: %v", err)
	}
	return sim, gpus
}

func TestHealthCriticalXid(t *testing.T) {
	sim, gpus := newSim(t, "simulated:dgxh100")
	w := startWatch(t, sim, HealthOptions{}, 0)
	if err := sim.InjectXid(3, 79); err != nil {
		t.Fatal(err)
	}
	got := w.next(t)
	want := HealthEvent{Index: 3, UUID: gpus[3].UUID, Xid: 79, Cause: CauseFatal, Reason: "critical Xid 79"}
	if got != want {
		t.Errorf("event = %+v, want %+v", got, want)
	}
	if err := w.stop(t); err != nil {
		t.Errorf("WatchHealth after cancel = %v, want nil", err)
	}
}

func TestHealthIgnoredXids(t *testing.T) {
	sim, gpus := newSim(t, "simulated:mixed")
	// Injected before the watch starts: they wait in the queue, in order, so
	// the critical Xid arriving first proves every earlier one was skipped.
	for _, xid := range append(DefaultIgnoredXids(), 94) {
		if err := sim.InjectXid(1, xid); err != nil {
			t.Fatal(err)
		}
	}
	if err := sim.InjectXid(2, 48); err != nil {
		t.Fatal(err)
	}
	w := startWatch(t, sim, HealthOptions{IgnoredXids: []uint64{94}}, 0)
	got := w.next(t)
	if got.Index != 2 || got.UUID != gpus[2].UUID || got.Xid != 48 {
		t.Errorf("first event = %+v, want Xid 48 on GPU 2: an ignored Xid got through", got)
	}
}

func TestHealthEccEvents(t *testing.T) {
	sim, gpus := newSim(t, "simulated:dgxb200")
	w := startWatch(t, sim, HealthOptions{}, 0)
	if err := sim.inject(5, nvml.EventTypeDoubleBitEccError, 0); err != nil {
		t.Fatal(err)
	}
	got := w.next(t)
	if got.Index != 5 || got.UUID != gpus[5].UUID || got.Xid != 0 || got.Cause != CauseFatal || !strings.Contains(got.Reason, "ECC") {
		t.Errorf("event = %+v, want a double-bit ECC event on GPU 5", got)
	}
	// Single-bit errors are corrected by the hardware and not watched.
	if err := sim.inject(0, nvml.EventTypeSingleBitEccError, 0); err != nil {
		t.Fatal(err)
	}
	if err := sim.InjectXid(0, 79); err != nil {
		t.Fatal(err)
	}
	if got := w.next(t); got.Index != 0 || got.Xid != 79 {
		t.Errorf("event = %+v, want Xid 79 on GPU 0 (single-bit ECC must not be reported)", got)
	}
}

func TestHealthStopsOnShutdown(t *testing.T) {
	sim, _ := newSim(t, "simulated:dgxh200")
	w := startWatch(t, sim, HealthOptions{}, 0)
	if err := sim.InjectXid(0, 79); err != nil {
		t.Fatal(err)
	}
	w.next(t) // the watch is certainly running now
	if err := sim.Shutdown(); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if err := w.wait(t); err != nil {
		t.Errorf("WatchHealth after Shutdown = %v, want nil", err)
	}
	if err := sim.InjectXid(0, 79); !errors.Is(err, ErrShutdown) {
		t.Errorf("InjectXid after Shutdown = %v, want ErrShutdown", err)
	}
}

func TestHealthStopsWhileReceiverIsAbsent(t *testing.T) {
	for _, how := range []string{"cancel", "shutdown"} {
		t.Run(how, func(t *testing.T) {
			sim, _ := newSim(t, "simulated:dgxa100")
			w := startWatch(t, sim, HealthOptions{}, 0) // nobody reads w.events
			if err := sim.InjectXid(0, 79); err != nil {
				t.Fatal(err)
			}
			if how == "cancel" {
				w.cancel()
			} else if err := sim.Shutdown(); err != nil {
				t.Fatal(err)
			}
			if err := w.wait(t); err != nil && !errors.Is(err, ErrShutdown) {
				t.Errorf("WatchHealth = %v", err)
			}
		})
	}
}

func TestHealthSetupErrors(t *testing.T) {
	m := newTestMachine(2)
	m.iface.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return nil, nvml.ERROR_UNKNOWN }
	l := m.open(t)
	err := l.WatchHealth(t.Context(), HealthOptions{}, make(chan HealthEvent))
	if err == nil || !strings.Contains(err.Error(), "create event set") || !errors.Is(err, nvml.ERROR_UNKNOWN) {
		t.Errorf("WatchHealth = %v, want a create-event-set error", err)
	}

	m = newTestMachine(2)
	m.devs[1].GetUUIDFunc = func() (string, nvml.Return) { return "", nvml.ERROR_UNKNOWN }
	err = m.open(t).WatchHealth(t.Context(), HealthOptions{}, make(chan HealthEvent))
	if err == nil || !strings.Contains(err.Error(), "GPU 1: get UUID") {
		t.Errorf("WatchHealth = %v, want a device-list error", err)
	}

	if err := newTestMachine(1).open(t).WatchHealth(t.Context(), HealthOptions{}, nil); err == nil {
		t.Errorf("WatchHealth with a nil channel succeeded")
	}
}

func TestHealthDevicesWithoutEvents(t *testing.T) {
	m := newTestMachine(3)
	m.devs[0].GetSupportedEventTypesFunc = func() (uint64, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	m.devs[1].GetSupportedEventTypesFunc = func() (uint64, nvml.Return) { return nvml.EventTypePState, nvml.SUCCESS }
	l := m.open(t)
	w := startWatch(t, l, HealthOptions{}, 0)
	m.queue <- xidEvent(m.devs[0], 79) // never registered: NVML would not raise it
	m.queue <- xidEvent(m.devs[1], 79)
	m.queue <- xidEvent(m.devs[2], 79)
	if got := w.next(t); got.Index != 2 || got.Xid != 79 {
		t.Errorf("event = %+v, want Xid 79 on GPU 2 only", got)
	}
}

func TestHealthRegistrationFailureMarksUnhealthy(t *testing.T) {
	m := newTestMachine(3)
	m.devs[0].GetSupportedEventTypesFunc = func() (uint64, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
	m.devs[1].RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.ERROR_UNKNOWN }
	m.devs[2].RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.ERROR_NOT_SUPPORTED }
	w := startWatch(t, m.open(t), HealthOptions{}, 0)
	for _, want := range []struct {
		index int
		cause Cause
		call  string
	}{{0, CauseUnwatched, "get supported event types"}, {1, CauseUnwatched, "register events"}, {2, CauseWatched, ""}} {
		got := w.nextAny(t)
		if got.Index != want.index || got.UUID != testUUID(want.index) || got.Cause != want.cause ||
			(want.call != "" && (!strings.Contains(got.Reason, "health watch unavailable") || !strings.Contains(got.Reason, want.call))) {
			t.Errorf("event = %+v, want GPU %d %v (%s)", got, want.index, want.cause, want.call)
		}
	}
	if err := w.stop(t); err != nil {
		t.Errorf("WatchHealth = %v", err)
	}
	w.noMoreFaults(t)
}

// A GPU whose registration failed is tried again and reported watched once
// NVML accepts it; the others are reported watched at once.
func TestHealthReprobesUnwatchedGPU(t *testing.T) {
	m := newTestMachine(2)
	var attempts atomic.Int32
	register := m.devs[1].RegisterEventsFunc
	m.devs[1].RegisterEventsFunc = func(mask uint64, set nvml.EventSet) nvml.Return {
		if attempts.Add(1) <= 3 {
			return nvml.ERROR_UNKNOWN
		}
		return register(mask, set)
	}
	w := startWatch(t, m.open(t), HealthOptions{ReprobeInterval: time.Millisecond}, 0)
	if got := w.nextAny(t); got.Index != 0 || got.Cause != CauseWatched {
		t.Fatalf("first event = %+v, want GPU 0 watched", got)
	}
	if got := w.nextAny(t); got.Index != 1 || got.Cause != CauseUnwatched {
		t.Fatalf("second event = %+v, want GPU 1 unwatched", got)
	}
	if got := w.nextAny(t); got.Index != 1 || got.Cause != CauseWatched {
		t.Fatalf("third event = %+v, want GPU 1 watched after the reprobe", got)
	}
	if n := attempts.Load(); n != 4 {
		t.Errorf("%d registration attempts; want 4 (three failures, then success)", n)
	}
	// Now registered, GPU 1's events arrive.
	m.queue <- xidEvent(m.devs[1], 94)
	if got := w.next(t); got.Index != 1 || got.Xid != 94 || got.Cause != CauseFatal {
		t.Errorf("event = %+v, want fatal Xid 94 on GPU 1", got)
	}
}

// Sites can add fatal Xids; an ignored Xid stays ignored even when listed fatal.
func TestHealthFatalXidsOption(t *testing.T) {
	m := newTestMachine(1)
	w := startWatch(t, m.open(t), HealthOptions{FatalXids: []uint64{62, 13}}, 0)
	m.queue <- xidEvent(m.devs[0], 13)
	m.queue <- xidEvent(m.devs[0], 69)
	m.queue <- xidEvent(m.devs[0], 62)
	for _, want := range []struct {
		xid   uint64
		cause Cause
	}{{69, CauseTransient}, {62, CauseFatal}} {
		if got := w.next(t); got.Xid != want.xid || got.Cause != want.cause {
			t.Errorf("event = %+v, want Xid %d %v", got, want.xid, want.cause)
		}
	}
}

// scriptedEventSet is a mock EventSet whose waits return steps in order and
// then time out, as a quiet NVML would.
func scriptedEventSet(steps ...func() (nvml.EventData, nvml.Return)) *mock.EventSet {
	n := 0 // only the watch goroutine waits
	return &mock.EventSet{
		WaitFunc: func(ms uint32) (nvml.EventData, nvml.Return) {
			if n < len(steps) {
				n++
				return steps[n-1]()
			}
			time.Sleep(time.Duration(ms) * time.Millisecond) // emulates NVML blocking; not synchronisation
			return nvml.EventData{}, nvml.ERROR_TIMEOUT
		},
		FreeFunc: func() nvml.Return { return nvml.SUCCESS },
	}
}

// event returns a script step yielding ev.
func event(ev nvml.EventData) func() (nvml.EventData, nvml.Return) {
	return func() (nvml.EventData, nvml.Return) { return ev, nvml.SUCCESS }
}

// failure returns a script step failing with ret.
func failure(ret nvml.Return) func() (nvml.EventData, nvml.Return) {
	return func() (nvml.EventData, nvml.Return) { return nvml.EventData{}, ret }
}

// xidEvent is a critical-Xid event on dev.
func xidEvent(dev nvml.Device, xid uint64) nvml.EventData {
	return nvml.EventData{Device: dev, EventType: nvml.EventTypeXidCriticalError, EventData: xid}
}

func TestHealthWaitResults(t *testing.T) {
	brokenDev := &mock.Device{GetUUIDFunc: func() (string, nvml.Return) { return "", nvml.ERROR_GPU_IS_LOST }}
	strangerDev := &mock.Device{GetUUIDFunc: func() (string, nvml.Return) { return "GPU-not-ours", nvml.SUCCESS }}
	tests := []struct {
		name  string
		steps func(m *testMachine) []func() (nvml.EventData, nvml.Return)
		want  []HealthEvent // the events, in order, after which nothing more may come
	}{
		{
			name: "GPU lost marks every GPU once",
			steps: func(*testMachine) []func() (nvml.EventData, nvml.Return) {
				return []func() (nvml.EventData, nvml.Return){failure(nvml.ERROR_GPU_IS_LOST), failure(nvml.ERROR_GPU_IS_LOST)}
			},
			want: []HealthEvent{
				{Index: 0, UUID: testUUID(0), Cause: CauseFatal, Reason: "GPU is lost (NVML ERROR_GPU_IS_LOST)"},
				{Index: 1, UUID: testUUID(1), Cause: CauseFatal, Reason: "GPU is lost (NVML ERROR_GPU_IS_LOST)"},
			},
		},
		{
			name: "a failed wait is survived",
			steps: func(m *testMachine) []func() (nvml.EventData, nvml.Return) {
				return []func() (nvml.EventData, nvml.Return){failure(nvml.ERROR_UNKNOWN), event(xidEvent(m.devs[1], 79))}
			},
			want: []HealthEvent{{Index: 1, UUID: testUUID(1), Xid: 79, Cause: CauseFatal, Reason: "critical Xid 79"}},
		},
		{
			name: "an event whose GPU cannot be named marks every GPU",
			steps: func(*testMachine) []func() (nvml.EventData, nvml.Return) {
				return []func() (nvml.EventData, nvml.Return){event(xidEvent(brokenDev, 62)), event(xidEvent(nil, 63))}
			},
			want: []HealthEvent{
				{Index: 0, UUID: testUUID(0), Xid: 62, Cause: CauseTransient, Reason: "critical Xid 62"},
				{Index: 1, UUID: testUUID(1), Xid: 62, Cause: CauseTransient, Reason: "critical Xid 62"},
				{Index: 0, UUID: testUUID(0), Xid: 63, Cause: CauseFatal, Reason: "critical Xid 63"},
				{Index: 1, UUID: testUUID(1), Xid: 63, Cause: CauseFatal, Reason: "critical Xid 63"},
			},
		},
		{
			name: "unknown GPUs, unwatched types and ignored Xids are skipped",
			steps: func(m *testMachine) []func() (nvml.EventData, nvml.Return) {
				return []func() (nvml.EventData, nvml.Return){
					event(xidEvent(strangerDev, 79)),
					event(nvml.EventData{Device: m.devs[0], EventType: nvml.EventTypePState}),
					event(xidEvent(m.devs[0], 13)),
					event(xidEvent(m.devs[0], 1000)),
					event(xidEvent(m.devs[0], 64)),
				}
			},
			want: []HealthEvent{{Index: 0, UUID: testUUID(0), Xid: 64, Cause: CauseFatal, Reason: "critical Xid 64"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newTestMachine(2)
			steps := tt.steps(m)
			set := scriptedEventSet(steps...)
			m.iface.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return set, nvml.SUCCESS }
			for _, d := range m.devs {
				d.RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.SUCCESS }
			}
			w := startWatch(t, m.open(t), HealthOptions{IgnoredXids: []uint64{1000}}, 2*len(tt.want)+len(m.devs))
			for i, want := range tt.want {
				if got := w.next(t); got != want {
					t.Errorf("event %d = %+v, want %+v", i, got, want)
				}
			}
			// Once the set is waited on past the script, every step has been
			// handled, so any extra event would already be in the buffer.
			deadline := time.After(failAfter)
			for len(set.WaitCalls()) <= len(steps) {
				select {
				case <-w.done:
					t.Fatalf("WatchHealth returned early: %v", w.err)
				case <-deadline:
					t.Fatalf("the script did not run out within %v", failAfter)
				case <-time.After(testWait):
				}
			}
			if err := w.stop(t); err != nil {
				t.Errorf("WatchHealth = %v", err)
			}
			w.noMoreFaults(t)
		})
	}
}

func TestInjectXidErrors(t *testing.T) {
	sim, _ := newSim(t, "simulated:mixed")
	for _, index := range []int{-1, 4} {
		if err := sim.InjectXid(index, 79); err == nil || !strings.Contains(err.Error(), "no GPU with index") {
			t.Errorf("InjectXid(%d) = %v, want a no-such-GPU error", index, err)
		}
	}
	for i := range simulatedEventQueue {
		if err := sim.InjectXid(0, 79); err != nil {
			t.Fatalf("InjectXid #%d: %v", i, err)
		}
	}
	if err := sim.InjectXid(0, 79); err == nil || !strings.Contains(err.Error(), "queue full") {
		t.Errorf("InjectXid on a full queue = %v, want a queue-full error", err)
	}
}

func TestRealBackendCannotInject(t *testing.T) {
	var lib Library = &library{}
	if _, ok := lib.(XidInjector); ok {
		t.Errorf("the real backend implements XidInjector; it must never fake events")
	}
}

func TestXidCause(t *testing.T) {
	fatal := setOf(DefaultFatalXids(), []uint64{1000})
	tests := []struct {
		xid  uint64
		want Cause
	}{
		{48, CauseFatal},  // double-bit ECC
		{63, CauseFatal},  // row remapping pending: applied at the next reset
		{64, CauseFatal},  // row remapping failed
		{74, CauseFatal},  // NVLink
		{79, CauseFatal},  // fallen off the bus
		{94, CauseFatal},  // contained uncorrectable ECC
		{95, CauseFatal},  // uncontained uncorrectable ECC
		{119, CauseFatal}, // GSP RPC timeout
		{120, CauseFatal}, // GSP error
		{154, CauseFatal}, // recovery action changed: reset or reboot required
		{1000, CauseFatal},
		{8, CauseTransient},  // GPU stopped processing
		{62, CauseTransient}, // micro-controller halt: a reset need comes as Xid 154
		{69, CauseTransient}, // graphics engine class error
		{92, CauseTransient}, // high single-bit ECC rate: every error was corrected
		{0, CauseTransient},
		{999, CauseTransient}, // unknown: never costs a GPU its whole life
	}
	for _, tt := range tests {
		if got := XidCause(tt.xid, fatal); got != tt.want {
			t.Errorf("XidCause(%d) = %v, want %v", tt.xid, got, tt.want)
		}
	}
	if XidCause(48, nil) != CauseTransient {
		t.Error("XidCause with no fatal set called Xid 48 fatal")
	}
	if a, b := DefaultFatalXids(), DefaultFatalXids(); &a[0] == &b[0] {
		t.Error("DefaultFatalXids shares its slice between calls")
	}
	for _, x := range DefaultIgnoredXids() {
		if fatal[x] {
			t.Errorf("Xid %d is both ignored by default and fatal by default", x)
		}
	}
}

func TestCauseString(t *testing.T) {
	for c, want := range map[Cause]string{CauseTransient: "transient", CauseFatal: "fatal", CauseUnwatched: "unwatched", CauseWatched: "watched", Cause(9): "Cause(9)"} {
		if got := c.String(); got != want {
			t.Errorf("Cause(%d).String() = %q, want %q", int(c), got, want)
		}
	}
}
