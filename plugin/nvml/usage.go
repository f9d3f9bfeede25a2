package nvml

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// valueNotAvailable is NVML_VALUE_NOT_AVAILABLE, what a process's
// usedGpuMemory holds when NVML cannot tell (no rights over the process, or
// a driver model that does not count per process).
const valueNotAvailable = ^uint64(0)

// Process is one process holding a context on a GPU.
type Process struct {
	// PID is the process ID in the host's PID namespace, as NVML reports it.
	PID uint32
	// UsedBytes is the GPU memory the process holds; meaningless when
	// UsedKnown is false.
	UsedBytes uint64
	// UsedKnown is false when NVML could not read the process's memory.
	UsedKnown bool
}

// Usage is what one GPU is doing now: its memory in use, its utilisation and
// the processes on it.
type Usage struct {
	Index int
	UUID  string
	// UsedBytes and TotalBytes are the GPU's memory as NVML's memory info
	// gives it; used counts every context, those of processes NVML does not
	// list included (the driver's own reservation, other containers).
	UsedBytes  uint64
	TotalBytes uint64
	// UtilizationPercent is the share of the last sample period in which a
	// kernel ran (NVML's utilization.gpu); -1 when the GPU does not report it.
	UtilizationPercent int
	// Processes are the processes of the compute, graphics and MPS client
	// lists, each PID once (a process in several lists counts once, with the
	// largest figure), sorted by PID.
	Processes []Process
}

// Usage reads every shareable GPU's memory, utilisation and processes (the
// v3 process lists where the driver has them: go-nvml binds the newest
// version the library exports). A GPU whose process lists cannot be read
// fails the whole reading, so a sample never silently misses a GPU's users.
func (l *library) Usage() ([]Usage, error) {
	if err := l.enter(); err != nil {
		return nil, err
	}
	defer l.calls.Done()
	gpus, handles, _, err := l.devices()
	if err != nil {
		return nil, err
	}
	out := make([]Usage, 0, len(gpus))
	for i, g := range gpus {
		u, err := readUsage(g, handles[i])
		if err != nil {
			return nil, err
		}
		out = append(out, u)
	}
	return out, nil
}

// readUsage reads one GPU.
func readUsage(g GPU, dev nvml.Device) (Usage, error) {
	fail := func(what string, ret nvml.Return) error {
		return newCallError(fmt.Sprintf("GPU %d: get %s", g.Index, what), ret)
	}
	u := Usage{Index: g.Index, UUID: g.UUID, UtilizationPercent: -1}
	mem, ret := dev.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return Usage{}, fail("memory info", ret)
	}
	u.UsedBytes, u.TotalBytes = mem.Used, mem.Total
	switch rates, ret := dev.GetUtilizationRates(); ret {
	case nvml.SUCCESS:
		u.UtilizationPercent = int(min(rates.Gpu, 100))
	case nvml.ERROR_NOT_SUPPORTED:
	default:
		return Usage{}, fail("utilization", ret)
	}
	lists := []struct {
		what string
		read func() ([]nvml.ProcessInfo, nvml.Return)
	}{
		{"compute processes", dev.GetComputeRunningProcesses},
		{"graphics processes", dev.GetGraphicsRunningProcesses},
		{"MPS client processes", dev.GetMPSComputeRunningProcesses},
	}
	byPID := map[uint32]Process{}
	for _, list := range lists {
		infos, ret := list.read()
		if ret == nvml.ERROR_NOT_SUPPORTED {
			continue // graphics on a compute-only GPU, MPS lists before Volta
		}
		if ret != nvml.SUCCESS {
			return Usage{}, fail(list.what, ret)
		}
		for _, info := range infos {
			byPID[info.Pid] = mergeProcess(byPID[info.Pid], info)
		}
	}
	for _, p := range byPID {
		u.Processes = append(u.Processes, p)
	}
	slices.SortFunc(u.Processes, func(a, b Process) int { return cmp.Compare(a.PID, b.PID) })
	return u, nil
}

// mergeProcess folds one list entry into what is known of its process: the
// largest known figure wins, since a process appears in two lists with the
// same context, not two contexts.
func mergeProcess(p Process, info nvml.ProcessInfo) Process {
	p.PID = info.Pid
	if info.UsedGpuMemory == valueNotAvailable {
		return p
	}
	if !p.UsedKnown || info.UsedGpuMemory > p.UsedBytes {
		p.UsedBytes, p.UsedKnown = info.UsedGpuMemory, true
	}
	return p
}
