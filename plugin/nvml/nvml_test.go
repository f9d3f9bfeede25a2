package nvml

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"go.uber.org/zap/zaptest"
)

// wantGPU is what one simulated GPU must look like, apart from its random UUID.
type wantGPU struct {
	model string
	mib   uint64
}

// repeat makes n identical expectations.
func repeat(n int, w wantGPU) []wantGPU {
	out := make([]wantGPU, n)
	for i := range out {
		out[i] = w
	}
	return out
}

func TestSimulatedDevices(t *testing.T) {
	h100 := wantGPU{"NVIDIA H100 80GB HBM3", 81920}
	a100pcie := wantGPU{"NVIDIA A100-PCIE-40GB", 40960}
	tests := []struct {
		backend string
		want    []wantGPU
	}{
		// The mock's A100 keeps a "Mock " prefix for backward compatibility.
		{"simulated:dgxa100", repeat(8, wantGPU{"Mock NVIDIA A100-SXM4-40GB", 40960})},
		{"simulated:dgxh100", repeat(8, h100)},
		{"simulated:dgxh200", repeat(8, wantGPU{"NVIDIA H200 141GB HBM3e", 144384})},
		{"simulated:dgxb200", repeat(8, wantGPU{"NVIDIA B200 180GB HBM3e", 184320})},
		{"simulated:mixed", []wantGPU{h100, h100, a100pcie, a100pcie}},
	}
	for _, tt := range tests {
		t.Run(tt.backend, func(t *testing.T) {
			lib, err := New(zaptest.NewLogger(t), tt.backend)
			if err != nil {
				t.Fatalf("New(%q): %v", tt.backend, err)
			}
			t.Cleanup(func() {
				if err := lib.Shutdown(); err != nil {
					t.Errorf("Shutdown: %v", err)
				}
			})
			sim, ok := lib.(*Simulator)
			if !ok {
				t.Fatalf("New(%q) returned %T, want *Simulator", tt.backend, lib)
			}
			if _, ok := lib.(XidInjector); !ok {
				t.Errorf("simulated backend does not implement XidInjector")
			}
			if !lib.Simulated() || lib.Name() != tt.backend {
				t.Errorf("Simulated()=%v Name()=%q, want true %q", lib.Simulated(), lib.Name(), tt.backend)
			}

			gpus, err := lib.Devices()
			if err != nil {
				t.Fatalf("Devices: %v", err)
			}
			if len(gpus) != len(tt.want) || len(gpus) != len(sim.server.Devices) {
				t.Fatalf("got %d GPUs, want %d (mock has %d)", len(gpus), len(tt.want), len(sim.server.Devices))
			}
			seen := map[string]bool{}
			for i, g := range gpus {
				md := sim.server.Devices[i].(*server.Device)
				want := GPU{
					Index:     i,
					UUID:      md.UUID,
					Model:     tt.want[i].model,
					MemoryMiB: tt.want[i].mib,
					Minor:     md.Minor,
					PCIBusID:  md.PciBusID,
				}
				if g != want {
					t.Errorf("GPU %d = %+v, want %+v", i, g, want)
				}
				if !strings.HasPrefix(g.UUID, "GPU-") || seen[g.UUID] {
					t.Errorf("GPU %d: bad or duplicate UUID %q", i, g.UUID)
				}
				seen[g.UUID] = true
			}

			// A second listing must agree: the UUIDs are random per machine, not per call.
			again, err := lib.Devices()
			if err != nil {
				t.Fatalf("Devices again: %v", err)
			}
			for i := range gpus {
				if again[i] != gpus[i] {
					t.Errorf("GPU %d changed between calls: %+v then %+v", i, gpus[i], again[i])
				}
			}
		})
	}
}

func TestSimulatedMachinesAreIndependent(t *testing.T) {
	a, err := NewSimulator(nil, "simulated:dgxh100")
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewSimulator(nil, "simulated:dgxh100")
	if err != nil {
		t.Fatal(err)
	}
	ga, errA := a.Devices()
	gb, errB := b.Devices()
	if errA != nil || errB != nil {
		t.Fatalf("Devices: %v, %v", errA, errB)
	}
	if ga[0].UUID == gb[0].UUID {
		t.Errorf("two simulated machines share UUID %s", ga[0].UUID)
	}
}

func TestBackends(t *testing.T) {
	got := Backends()
	want := []string{"nvml", "simulated:dgxa100", "simulated:dgxh100", "simulated:dgxh200", "simulated:dgxb200", "simulated:mixed"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("Backends() = %v, want %v", got, want)
	}
	got[0] = "changed"
	if Backends()[0] != "nvml" {
		t.Errorf("Backends() shares its slice with callers")
	}
}

func TestNewUnknownBackend(t *testing.T) {
	for _, backend := range []string{"", "bogus", "NVML", "simulated:", "simulated:dgx-h100", "simulated"} {
		t.Run(backend, func(t *testing.T) {
			lib, err := New(zaptest.NewLogger(t), backend)
			if err == nil {
				lib.Shutdown()
				t.Fatalf("New(%q) succeeded", backend)
			}
			if !errors.Is(err, ErrUnknownBackend) {
				t.Errorf("error %v is not ErrUnknownBackend", err)
			}
			for _, b := range Backends() {
				if !strings.Contains(err.Error(), b) {
					t.Errorf("error %q does not list backend %q", err, b)
				}
			}
		})
	}
	if _, err := NewSimulator(nil, "nvml"); !errors.Is(err, ErrUnknownBackend) {
		t.Errorf("NewSimulator(nvml) = %v, want ErrUnknownBackend", err)
	}
}

// testMachine is a hand-made machine over go-nvml's single-method mocks, so
// each test can break exactly one call.
type testMachine struct {
	iface *mock.Interface
	devs  []*mock.Device
	queue chan nvml.EventData
}

// testUUID is the UUID of test GPU i.
func testUUID(i int) string { return fmt.Sprintf("GPU-00000000-0000-0000-0000-%012d", i) }

// newTestMachine builds n working GPUs with the events of a simulated machine.
func newTestMachine(n int) *testMachine {
	m := &testMachine{queue: make(chan nvml.EventData, simulatedEventQueue)}
	for i := range n {
		d := &mock.Device{}
		d.GetUUIDFunc = func() (string, nvml.Return) { return testUUID(i), nvml.SUCCESS }
		d.GetNameFunc = func() (string, nvml.Return) { return "Test GPU", nvml.SUCCESS }
		// Not a whole number of MiB: MemoryMiB must round down.
		d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
			return nvml.Memory{Total: 16<<30 + 12345}, nvml.SUCCESS
		}
		d.GetMinorNumberFunc = func() (int, nvml.Return) { return 10 + i, nvml.SUCCESS }
		d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
			var p nvml.PciInfo
			for j, c := range fmt.Sprintf("00000000:%02X:00.0", 0x3A+i) {
				p.BusId[j] = int8(c)
			}
			return p, nvml.SUCCESS
		}
		d.GetMigModeFunc = func() (int, int, nvml.Return) { return nvml.DEVICE_MIG_DISABLE, nvml.DEVICE_MIG_DISABLE, nvml.SUCCESS }
		d.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) {
			return nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeSingleBitEccError, nvml.SUCCESS
		}
		d.RegisterEventsFunc = func(mask uint64, set nvml.EventSet) nvml.Return {
			if s, ok := set.(*simEventSet); ok {
				s.register(d, mask)
			}
			return nvml.SUCCESS
		}
		m.devs = append(m.devs, d)
	}
	m.iface = &mock.Interface{
		InitFunc:                   func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:               func() nvml.Return { return nvml.SUCCESS },
		SystemGetDriverVersionFunc: func() (string, nvml.Return) { return "", nvml.ERROR_NOT_SUPPORTED },
		DeviceGetCountFunc:         func() (int, nvml.Return) { return len(m.devs), nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
			if i < 0 || i >= len(m.devs) {
				return nil, nvml.ERROR_INVALID_ARGUMENT
			}
			return m.devs[i], nvml.SUCCESS
		},
		EventSetCreateFunc: func() (nvml.EventSet, nvml.Return) { return newSimEventSet(m.queue), nvml.SUCCESS },
	}
	return m
}

// open initialises the machine as a Library.
func (m *testMachine) open(t *testing.T) *library {
	t.Helper()
	l, err := openLibrary(zaptest.NewLogger(t), "test", m.iface, true)
	if err != nil {
		t.Fatalf("openLibrary: %v", err)
	}
	t.Cleanup(func() { l.Shutdown() })
	return l
}

func TestDevicesFromMocks(t *testing.T) {
	m := newTestMachine(2)
	gpus, err := m.open(t).Devices()
	if err != nil {
		t.Fatal(err)
	}
	want := []GPU{
		{Index: 0, UUID: testUUID(0), Model: "Test GPU", MemoryMiB: 16384, Minor: 10, PCIBusID: "0000:3a:00.0"},
		{Index: 1, UUID: testUUID(1), Model: "Test GPU", MemoryMiB: 16384, Minor: 11, PCIBusID: "0000:3b:00.0"},
	}
	if fmt.Sprint(gpus) != fmt.Sprint(want) {
		t.Errorf("Devices() = %+v, want %+v", gpus, want)
	}
}

func TestDevicesErrors(t *testing.T) {
	tests := []struct {
		name   string
		breakM func(m *testMachine)
		want   string      // in the message
		is     error       // errors.Is target, if any
		ret    nvml.Return // the wrapped NVML code, if any
	}{
		{
			name: "count",
			breakM: func(m *testMachine) {
				m.iface.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
			},
			want: "get device count", ret: nvml.ERROR_UNKNOWN,
		},
		{
			name: "handle",
			breakM: func(m *testMachine) {
				m.iface.DeviceGetHandleByIndexFunc = func(int) (nvml.Device, nvml.Return) { return nil, nvml.ERROR_GPU_IS_LOST }
			},
			want: "GPU 0: get handle", ret: nvml.ERROR_GPU_IS_LOST,
		},
		{
			name: "nil handle",
			breakM: func(m *testMachine) {
				m.iface.DeviceGetHandleByIndexFunc = func(int) (nvml.Device, nvml.Return) { return nil, nvml.SUCCESS }
			},
			want: "GPU 0: get handle returned no device",
		},
		{
			name: "uuid",
			breakM: func(m *testMachine) {
				m.devs[1].GetUUIDFunc = func() (string, nvml.Return) { return "", nvml.ERROR_UNKNOWN }
			},
			want: "GPU 1: get UUID", ret: nvml.ERROR_UNKNOWN,
		},
		{
			name:   "empty uuid",
			breakM: func(m *testMachine) { m.devs[0].GetUUIDFunc = func() (string, nvml.Return) { return "", nvml.SUCCESS } },
			want:   "GPU 0: get UUID: empty UUID",
		},
		{
			name: "name",
			breakM: func(m *testMachine) {
				m.devs[0].GetNameFunc = func() (string, nvml.Return) { return "", nvml.ERROR_TIMEOUT }
			},
			want: "GPU 0: get name", ret: nvml.ERROR_TIMEOUT,
		},
		{
			name: "memory",
			breakM: func(m *testMachine) {
				m.devs[1].GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, nvml.ERROR_NO_PERMISSION }
			},
			want: "GPU 1: get memory info", ret: nvml.ERROR_NO_PERMISSION,
		},
		{
			name: "minor",
			breakM: func(m *testMachine) {
				m.devs[0].GetMinorNumberFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
			},
			want: "GPU 0: get minor number", is: ErrNotSupported, ret: nvml.ERROR_NOT_SUPPORTED,
		},
		{
			name: "MIG mode",
			breakM: func(m *testMachine) {
				m.devs[1].GetMigModeFunc = func() (int, int, nvml.Return) { return 0, 0, nvml.ERROR_UNKNOWN }
			},
			want: "GPU 1: get MIG mode", ret: nvml.ERROR_UNKNOWN,
		},
		{
			name:   "no GPU at all",
			breakM: func(m *testMachine) { m.devs = nil },
			want:   "NVML found no GPU",
		},
		{
			name: "pci",
			breakM: func(m *testMachine) {
				m.devs[0].GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) { return nvml.PciInfo{}, nvml.ERROR_UNKNOWN }
			},
			want: "GPU 0: get PCI info", ret: nvml.ERROR_UNKNOWN,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newTestMachine(2)
			tt.breakM(m)
			gpus, err := m.open(t).Devices()
			if err == nil {
				t.Fatalf("Devices() = %v, want an error", gpus)
			}
			if gpus != nil {
				t.Errorf("Devices() returned GPUs with an error: %v", gpus)
			}
			if !strings.Contains(err.Error(), tt.want) || !strings.HasPrefix(err.Error(), "list GPUs: ") {
				t.Errorf("error %q does not say %q", err, tt.want)
			}
			if tt.ret != nvml.SUCCESS {
				if !errors.Is(err, tt.ret) || !strings.Contains(err.Error(), tt.ret.Error()) {
					t.Errorf("error %q does not carry %v", err, tt.ret)
				}
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("error %q is not %v", err, tt.is)
			}
		})
	}
}

func TestOpenErrors(t *testing.T) {
	tests := []struct {
		ret  nvml.Return
		is   error
		want string
	}{
		{nvml.ERROR_LIBRARY_NOT_FOUND, ErrLibraryNotFound, "libnvidia-ml.so.1 was not found"},
		{nvml.ERROR_DRIVER_NOT_LOADED, nil, "kernel driver is not loaded"},
		{nvml.ERROR_NO_PERMISSION, nil, "nvmlInit: ERROR_NO_PERMISSION"},
	}
	for _, tt := range tests {
		t.Run(tt.ret.Error(), func(t *testing.T) {
			m := newTestMachine(1)
			m.iface.InitFunc = func() nvml.Return { return tt.ret }
			l, err := openLibrary(zaptest.NewLogger(t), "test", m.iface, false)
			if err == nil {
				t.Fatalf("openLibrary succeeded: %v", l)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not say %q", err, tt.want)
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("error %q is not %v", err, tt.is)
			}
			if tt.is != ErrLibraryNotFound && errors.Is(err, ErrLibraryNotFound) {
				t.Errorf("error %q wrongly reads as ErrLibraryNotFound", err)
			}
		})
	}
}

func TestShutdown(t *testing.T) {
	m := newTestMachine(1)
	shutdowns := 0
	m.iface.ShutdownFunc = func() nvml.Return { shutdowns++; return nvml.SUCCESS }
	l := m.open(t)
	if err := l.Shutdown(); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if err := l.Shutdown(); err != nil {
		t.Errorf("second Shutdown: %v", err)
	}
	if shutdowns != 1 {
		t.Errorf("nvmlShutdown called %d times, want 1", shutdowns)
	}
	if _, err := l.Devices(); !errors.Is(err, ErrShutdown) {
		t.Errorf("Devices after Shutdown = %v, want ErrShutdown", err)
	}
	if err := l.WatchHealth(t.Context(), HealthOptions{}, make(chan HealthEvent)); !errors.Is(err, ErrShutdown) {
		t.Errorf("WatchHealth after Shutdown = %v, want ErrShutdown", err)
	}
}

func TestShutdownError(t *testing.T) {
	m := newTestMachine(1)
	m.iface.ShutdownFunc = func() nvml.Return { return nvml.ERROR_UNKNOWN }
	l := m.open(t)
	if err := l.Shutdown(); err == nil || !errors.Is(err, nvml.ERROR_UNKNOWN) {
		t.Errorf("Shutdown = %v, want an ERROR_UNKNOWN error", err)
	}
}

func TestSysfsBusID(t *testing.T) {
	for in, want := range map[string]string{
		"00000000:3B:00.0": "0000:3b:00.0",
		"0000:3b:00.0":     "0000:3b:00.0",
		"00000001:01:00.0": "0001:01:00.0",
		"10000000:01:00.0": "10000000:01:00.0", // a domain wider than four digits stays whole, as sysfs prints it
		"":                 "",
	} {
		if got := sysfsBusID(in); got != want {
			t.Errorf("sysfsBusID(%q) = %q, want %q", in, got, want)
		}
	}
}

// migMode makes a mock GPU answer GetMigMode with current, pending and ret.
func migMode(current, pending int, ret nvml.Return) func() (int, int, nvml.Return) {
	return func() (int, int, nvml.Return) { return current, pending, ret }
}

func TestDevicesSkipMIG(t *testing.T) {
	m := newTestMachine(4)
	m.devs[1].GetMigModeFunc = migMode(nvml.DEVICE_MIG_ENABLE, nvml.DEVICE_MIG_ENABLE, nvml.SUCCESS)
	m.devs[2].GetMigModeFunc = migMode(0, 0, nvml.ERROR_NOT_SUPPORTED) // no MIG on this GPU
	// Pending changes wait for a GPU reset: only the current mode counts.
	m.devs[3].GetMigModeFunc = migMode(nvml.DEVICE_MIG_DISABLE, nvml.DEVICE_MIG_ENABLE, nvml.SUCCESS)
	m.devs[0].GetMigModeFunc = migMode(nvml.DEVICE_MIG_ENABLE, nvml.DEVICE_MIG_DISABLE, nvml.SUCCESS)
	l := m.open(t)
	if s := l.Skipped(); s != nil {
		t.Errorf("Skipped before Devices = %v, want nil", s)
	}
	gpus, err := l.Devices()
	if err != nil {
		t.Fatal(err)
	}
	var got []int
	for _, g := range gpus {
		got = append(got, g.Index)
	}
	if fmt.Sprint(got) != "[2 3]" {
		t.Errorf("Devices() indices = %v, want [2 3]", got)
	}
	want := []SkippedGPU{
		{Index: 0, UUID: testUUID(0), Model: "Test GPU", Reason: ReasonMIG},
		{Index: 1, UUID: testUUID(1), Model: "Test GPU", Reason: ReasonMIG},
	}
	skipped := l.Skipped()
	if fmt.Sprint(skipped) != fmt.Sprint(want) {
		t.Errorf("Skipped() = %+v, want %+v", skipped, want)
	}
	skipped[0].Index = 9
	if l.Skipped()[0].Index != 0 {
		t.Error("Skipped shares its slice with callers")
	}

	// A MIG GPU is not watched: its events are not reported.
	w := startWatch(t, l, HealthOptions{}, 0)
	m.queue <- xidEvent(m.devs[1], 79)
	m.queue <- xidEvent(m.devs[3], 79)
	if ev := w.next(t); ev.Index != 3 {
		t.Errorf("event = %+v, want one for GPU 3 only", ev)
	}
}

func TestDevicesAllMIG(t *testing.T) {
	m := newTestMachine(2)
	for _, d := range m.devs {
		d.GetMigModeFunc = migMode(nvml.DEVICE_MIG_ENABLE, nvml.DEVICE_MIG_ENABLE, nvml.SUCCESS)
	}
	l := m.open(t)
	gpus, err := l.Devices()
	if err != nil || len(gpus) != 0 {
		t.Fatalf("Devices() = %v, %v; want no GPU and no error", gpus, err)
	}
	if s := l.Skipped(); len(s) != 2 {
		t.Errorf("Skipped() = %v, want both GPUs", s)
	}
}

func TestSimulatedMIG(t *testing.T) {
	const backend = "simulated:mixed:mig=3,1"
	sim, gpus := newSim(t, backend)
	if sim.Name() != backend {
		t.Errorf("Name() = %q, want %q", sim.Name(), backend)
	}
	if len(gpus) != 2 || gpus[0].Index != 0 || gpus[1].Index != 2 {
		t.Fatalf("Devices() = %+v, want GPUs 0 and 2", gpus)
	}
	skipped := sim.Skipped()
	if len(skipped) != 2 || skipped[0].Index != 1 || skipped[1].Index != 3 || skipped[0].Reason != ReasonMIG ||
		skipped[1].Model != "NVIDIA A100-PCIE-40GB" || !strings.HasPrefix(skipped[0].UUID, "GPU-") {
		t.Errorf("Skipped() = %+v, want GPUs 1 and 3 for MIG", skipped)
	}
	w := startWatch(t, sim, HealthOptions{}, 0)
	for _, i := range []int{1, 2} {
		if err := sim.InjectXid(i, 79); err != nil {
			t.Fatal(err)
		}
	}
	if ev := w.next(t); ev.Index != 2 {
		t.Errorf("event = %+v, want one for GPU 2 only (GPU 1 is in MIG mode)", ev)
	}
}

func TestSimulatedBackendSyntax(t *testing.T) {
	good := map[string]simulatedSpec{
		"simulated:dgxh100":           {machine: "dgxh100"},
		"simulated:dgxh100:mig=0":     {machine: "dgxh100", mig: []int{0}},
		"simulated:mixed:mig=3,0,1":   {machine: "mixed", mig: []int{0, 1, 3}},
		"simulated:whatever:mig=12":   {machine: "whatever", mig: []int{12}}, // the machine is checked by NewSimulator
		"simulated:dgxb200:mig=7,6,5": {machine: "dgxb200", mig: []int{5, 6, 7}},
	}
	for in, want := range good {
		if got, err := parseSimulated(in); err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("parseSimulated(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, bad := range []string{
		"simulated:dgxh100:", "simulated:dgxh100:mig=", "simulated:dgxh100:mig=a", "simulated:dgxh100:mig=1,1",
		"simulated:dgxh100:mig=-1", "simulated:dgxh100:mig=01", "simulated:dgxh100:mig=1,", "simulated:dgxh100:gpus=1",
		"simulated:dgxh100:mig=1:mig=2", "simulated:dgxh100:mig=8", "simulated:mixed:mig=4", "simulated:bogus:mig=1", "nvml:mig=1",
	} {
		sim, err := NewSimulator(nil, bad)
		if err == nil {
			sim.Shutdown()
			t.Errorf("NewSimulator(%q) succeeded", bad)
			continue
		}
		if !errors.Is(err, ErrUnknownBackend) {
			t.Errorf("NewSimulator(%q) = %v, want ErrUnknownBackend", bad, err)
		}
	}
	lib, err := New(nil, "simulated:dgxa100:mig=7")
	if err != nil {
		t.Fatalf("New with a MIG GPU: %v", err)
	}
	defer lib.Shutdown()
	if gpus, err := lib.Devices(); err != nil || len(gpus) != 7 {
		t.Errorf("Devices() = %d GPUs, %v; want 7", len(gpus), err)
	}
}
