package nvml

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"go.uber.org/zap/zaptest"
)

// TestUsageMergesLists reads a GPU whose process appears in the compute and
// the MPS client lists, one process NVML cannot measure, and a graphics list
// the GPU does not support.
func TestUsageMergesLists(t *testing.T) {
	m := newTestMachine(2)
	d := m.devs[1]
	d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		return nvml.Memory{Total: 16 << 30, Used: 9 << 30, Free: 7 << 30}, nvml.SUCCESS
	}
	d.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{Gpu: 37}, nvml.SUCCESS }
	d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		return []nvml.ProcessInfo{{Pid: 300, UsedGpuMemory: 1 << 30}, {Pid: 100, UsedGpuMemory: valueNotAvailable}}, nvml.SUCCESS
	}
	d.GetGraphicsRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED }
	d.GetMPSComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		return []nvml.ProcessInfo{{Pid: 300, UsedGpuMemory: 3 << 30}, {Pid: 200, UsedGpuMemory: 5 << 30}}, nvml.SUCCESS
	}
	idle(m.devs[0])
	got, err := m.open(t).Usage()
	if err != nil {
		t.Fatal(err)
	}
	want := []Usage{
		{Index: 0, UUID: testUUID(0), TotalBytes: 16<<30 + 12345, UtilizationPercent: -1},
		{Index: 1, UUID: testUUID(1), UsedBytes: 9 << 30, TotalBytes: 16 << 30, UtilizationPercent: 37, Processes: []Process{
			{PID: 100}, {PID: 200, UsedBytes: 5 << 30, UsedKnown: true}, {PID: 300, UsedBytes: 3 << 30, UsedKnown: true},
		}},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Usage() =\n%+v\nwant\n%+v", got, want)
	}
}

// idle makes d a GPU with no process and no utilisation counter.
func idle(d *mock.Device) {
	none := func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.SUCCESS }
	d.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{}, nvml.ERROR_NOT_SUPPORTED }
	d.GetComputeRunningProcessesFunc, d.GetGraphicsRunningProcessesFunc, d.GetMPSComputeRunningProcessesFunc = none, none, none
}

// TestUsageErrors fails the whole reading when one GPU's list cannot be
// read: a sample missing a GPU's users would show its memory as nobody's.
func TestUsageErrors(t *testing.T) {
	tests := []struct {
		name   string
		breakD func(d *mock.Device)
		want   string
	}{
		{"memory", func(d *mock.Device) {
			d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, nvml.ERROR_GPU_IS_LOST }
		}, "GPU 1: get memory info"},
		{"utilization", func(d *mock.Device) {
			d.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{}, nvml.ERROR_UNKNOWN }
		}, "GPU 1: get utilization"},
		{"compute", func(d *mock.Device) {
			d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.ERROR_NO_PERMISSION }
		}, "GPU 1: get compute processes"},
		{"mps", func(d *mock.Device) {
			d.GetMPSComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.ERROR_UNKNOWN }
		}, "GPU 1: get MPS client processes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newTestMachine(2)
			idle(m.devs[0])
			idle(m.devs[1])
			tt.breakD(m.devs[1])
			_, err := m.open(t).Usage()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Usage() error = %v, want one naming %q", err, tt.want)
			}
		})
	}
}

// TestSimulatedProcesses sets processes on a simulated GPU and reads them
// back, with the memory in use they add up to.
func TestSimulatedProcesses(t *testing.T) {
	lib, err := New(zaptest.NewLogger(t), "simulated:dgxh100")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lib.Shutdown() })
	sim, ok := lib.(ProcessSetter)
	if !ok {
		t.Fatalf("%T is not a ProcessSetter", lib)
	}
	procs := []Process{{PID: 42, UsedBytes: 3 << 30, UsedKnown: true}, {PID: 7}, {PID: 43, UsedBytes: 1 << 30, UsedKnown: true}}
	if err := sim.SetProcesses(2, procs); err != nil {
		t.Fatal(err)
	}
	if err := sim.SetUtilization(2, 55); err != nil {
		t.Fatal(err)
	}
	if err := sim.SetUtilization(3, -1); err != nil {
		t.Fatal(err)
	}
	got, err := lib.Usage()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 8 {
		t.Fatalf("Usage() read %d GPUs, want 8", len(got))
	}
	g := got[2]
	wantProcs := []Process{{PID: 7}, {PID: 42, UsedBytes: 3 << 30, UsedKnown: true}, {PID: 43, UsedBytes: 1 << 30, UsedKnown: true}}
	if g.UsedBytes != 4<<30 || g.TotalBytes != 80<<30 || g.UtilizationPercent != 55 || fmt.Sprint(g.Processes) != fmt.Sprint(wantProcs) {
		t.Errorf("GPU 2 = %+v; want 4 GiB of 80 used, 55%%, processes %+v", g, wantProcs)
	}
	if got[3].UtilizationPercent != -1 || got[0].UtilizationPercent != 0 || len(got[0].Processes) != 0 || got[0].UsedBytes != 0 {
		t.Errorf("GPUs 0 and 3 = %+v, %+v; want idle at 0%% and idle without a counter", got[0], got[3])
	}
	for _, bad := range []error{sim.SetProcesses(8, nil), sim.SetUtilization(0, 101), sim.SetUtilization(-1, 0)} {
		if bad == nil {
			t.Error("an out-of-range index or percentage was accepted")
		}
	}
	if err := lib.Shutdown(); err != nil {
		t.Fatal(err)
	}
	if _, err := lib.Usage(); !errors.Is(err, ErrShutdown) {
		t.Errorf("Usage() after Shutdown = %v, want ErrShutdown", err)
	}
}
