package nvml

import (
	"fmt"
	"slices"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// ProcessSetter is implemented only by simulated backends: tests and the
// demo put simulated processes on GPUs, so the usage loop (plugin/usage)
// runs on the test bed as it would on a GPU. Callers reach it with a type
// assertion on a Library, which fails for the real backend.
type ProcessSetter interface {
	// SetProcesses replaces the processes on the GPU with NVML index index.
	// The GPU's memory in use becomes the sum of their known figures.
	SetProcesses(index int, procs []Process) error
	// SetUtilization sets the GPU's utilisation in percent (0-100), or -1
	// for a GPU that does not report it.
	SetUtilization(index, percent int) error
}

var _ ProcessSetter = (*Simulator)(nil)

// simUsage is the simulated processes and utilisation of every GPU.
type simUsage struct {
	mu    sync.Mutex
	procs map[int][]Process // by NVML index
	util  map[int]int       // by NVML index; absent: 0
}

// completeUsage answers a mock GPU's memory, utilisation and process-list
// calls from u; the mocks report no process and panic on utilisation.
func (u *simUsage) completeUsage(index int, dev *server.Device) {
	total := dev.MemoryInfo.Total
	dev.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		used := min(u.usedBytes(index), total)
		return nvml.Memory{Total: total, Used: used, Free: total - used}, nvml.SUCCESS
	}
	dev.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
		u.mu.Lock()
		defer u.mu.Unlock()
		p := u.util[index]
		if p < 0 {
			return nvml.Utilization{}, nvml.ERROR_NOT_SUPPORTED
		}
		return nvml.Utilization{Gpu: uint32(p)}, nvml.SUCCESS
	}
	dev.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return u.infos(index), nvml.SUCCESS }
	dev.GetGraphicsRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.SUCCESS }
	dev.GetMPSComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.SUCCESS }
}

// usedBytes sums the known figures of the GPU's processes.
func (u *simUsage) usedBytes(index int) uint64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	var sum uint64
	for _, p := range u.procs[index] {
		if p.UsedKnown {
			sum += p.UsedBytes
		}
	}
	return sum
}

// infos is the GPU's process list as NVML returns it.
func (u *simUsage) infos(index int) []nvml.ProcessInfo {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := make([]nvml.ProcessInfo, 0, len(u.procs[index]))
	for _, p := range u.procs[index] {
		used := p.UsedBytes
		if !p.UsedKnown {
			used = valueNotAvailable
		}
		out = append(out, nvml.ProcessInfo{Pid: p.PID, UsedGpuMemory: used, GpuInstanceId: ^uint32(0), ComputeInstanceId: ^uint32(0)})
	}
	return out
}

// SetProcesses implements ProcessSetter.
func (s *Simulator) SetProcesses(index int, procs []Process) error {
	if index < 0 || index >= len(s.server.Devices) {
		return fmt.Errorf("set simulated processes: no GPU with index %d (the machine has %d)", index, len(s.server.Devices))
	}
	s.usage.mu.Lock()
	defer s.usage.mu.Unlock()
	s.usage.procs[index] = slices.Clone(procs)
	return nil
}

// SetUtilization implements ProcessSetter.
func (s *Simulator) SetUtilization(index, percent int) error {
	if index < 0 || index >= len(s.server.Devices) {
		return fmt.Errorf("set simulated utilization: no GPU with index %d (the machine has %d)", index, len(s.server.Devices))
	}
	if percent < -1 || percent > 100 {
		return fmt.Errorf("set simulated utilization: %d is not a percentage (or -1)", percent)
	}
	s.usage.mu.Lock()
	defer s.usage.mu.Unlock()
	s.usage.util[index] = percent
	return nil
}
