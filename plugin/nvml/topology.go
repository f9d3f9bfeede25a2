package nvml

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpushare/gpushare/plugin/topology"
)

// sysfsPCIDevices is where Linux lists PCI devices, each with its numa_node.
const sysfsPCIDevices = "/sys/bus/pci/devices"

// readSysfsNUMA reads the NUMA node of the PCI device with the sysfs bus ID
// busID; -1 when the kernel does not know it or the file cannot be read.
// NVML's nvmlDeviceGetNumaNodeId is not used: it answers only where the GPU's
// memory is a NUMA node of its own (Grace Hopper), not which CPU socket the
// GPU hangs off.
func readSysfsNUMA(busID string) int {
	b, err := os.ReadFile(filepath.Join(sysfsPCIDevices, busID, "numa_node"))
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 0 {
		return -1
	}
	return n
}

// levelOf maps NVML's common-ancestor level to ours.
func levelOf(l nvml.GpuTopologyLevel) topology.Level {
	switch l {
	case nvml.TOPOLOGY_INTERNAL:
		return topology.LevelInternal
	case nvml.TOPOLOGY_SINGLE:
		return topology.LevelSingle
	case nvml.TOPOLOGY_MULTIPLE:
		return topology.LevelMultiple
	case nvml.TOPOLOGY_HOSTBRIDGE:
		return topology.LevelHostBridge
	case nvml.TOPOLOGY_NODE:
		return topology.LevelNode
	case nvml.TOPOLOGY_SYSTEM:
		return topology.LevelSystem
	default:
		return topology.LevelUnknown
	}
}

// cannotAnswer reports whether ret means the GPU or driver cannot answer, as
// opposed to a failure.
func cannotAnswer(ret nvml.Return) bool {
	return ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_FUNCTION_NOT_FOUND
}

// Topology implements Library: the shared GPUs (those Devices lists), each
// with its PCI bus ID, NUMA node and NVLink links to NVSwitches, and every
// pair's PCIe common ancestor and direct NVLink link count. A GPU or driver
// that cannot answer a question (NOT_SUPPORTED) reads as no NVLink or an
// unknown level; any other NVML failure fails the whole reading.
func (l *library) Topology() (topology.Reading, error) {
	if err := l.enter(); err != nil {
		return topology.Reading{}, err
	}
	defer l.calls.Done()
	gpus, handles, _, err := l.devices()
	if err != nil {
		return topology.Reading{}, fmt.Errorf("read topology: %w", err)
	}
	fail := func(index int, what string, ret nvml.Return) error {
		return fmt.Errorf("read topology: %w", newCallError(fmt.Sprintf("GPU %d: %s", index, what), ret))
	}
	// Every GPU NVML lists, shared or not, by bus ID, so that a link to a
	// GPU in MIG mode is not taken for a link to a switch.
	count, ret := l.iface.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return topology.Reading{}, fmt.Errorf("read topology: %w", newCallError("get device count", ret))
	}
	byBus := make(map[string]int, count)
	for i := range count {
		dev, ret := l.iface.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return topology.Reading{}, fail(i, "get handle", ret)
		}
		pci, ret := dev.GetPciInfo()
		if ret != nvml.SUCCESS {
			return topology.Reading{}, fail(i, "get PCI info", ret)
		}
		byBus[busKey(cString(pci.BusId[:]))] = i
	}

	r := topology.Reading{GPUs: make([]topology.GPU, len(gpus))}
	// direct[i][j]: active links from the i-th shared GPU that end at GPU index j.
	direct := make([]map[int]int, len(gpus))
	for i, g := range gpus {
		pci, ret := handles[i].GetPciInfo()
		if ret != nvml.SUCCESS {
			return topology.Reading{}, fail(g.Index, "get PCI info", ret)
		}
		r.GPUs[i] = topology.GPU{Index: g.Index, PCIBusID: cString(pci.BusId[:]), NUMANode: l.numa(g.PCIBusID)}
		direct[i] = map[int]int{}
		for link := range nvml.NVLINK_MAX_LINKS {
			state, ret := handles[i].GetNvLinkState(link)
			if cannotAnswer(ret) || ret == nvml.ERROR_INVALID_ARGUMENT {
				continue // no NVLink, or no such link on this GPU
			}
			if ret != nvml.SUCCESS {
				return topology.Reading{}, fail(g.Index, fmt.Sprintf("get NVLink %d state", link), ret)
			}
			if state != nvml.FEATURE_ENABLED {
				continue
			}
			remote, ret := handles[i].GetNvLinkRemotePciInfo(link)
			if ret != nvml.SUCCESS {
				return topology.Reading{}, fail(g.Index, fmt.Sprintf("get NVLink %d remote PCI info", link), ret)
			}
			peer, isGPU := byBus[busKey(cString(remote.BusId[:]))]
			kind, ret := handles[i].GetNvLinkRemoteDeviceType(link)
			switch {
			case ret == nvml.SUCCESS && kind == nvml.NVLINK_DEVICE_TYPE_SWITCH:
				r.GPUs[i].SwitchLinks++
			case ret == nvml.SUCCESS && kind != nvml.NVLINK_DEVICE_TYPE_GPU:
				// An IBM NPU or unknown: no GPU reached through it.
			case ret == nvml.SUCCESS || cannotAnswer(ret):
				// A GPU, or an older driver that cannot say: the bus ID decides.
				if isGPU {
					if peer != g.Index {
						direct[i][peer]++
					}
				} else if ret != nvml.SUCCESS {
					r.GPUs[i].SwitchLinks++
				}
			default:
				return topology.Reading{}, fail(g.Index, fmt.Sprintf("get NVLink %d remote device type", link), ret)
			}
		}
	}
	for i := range gpus {
		for j := i + 1; j < len(gpus); j++ {
			ancestor, ret := handles[i].GetTopologyCommonAncestor(handles[j])
			level := topology.LevelUnknown
			switch {
			case ret == nvml.SUCCESS:
				level = levelOf(ancestor)
			case cannotAnswer(ret):
			default:
				return topology.Reading{}, fail(gpus[i].Index, fmt.Sprintf("get common ancestor with GPU %d", gpus[j].Index), ret)
			}
			// A link counts when both ends see it.
			n := min(direct[i][gpus[j].Index], direct[j][gpus[i].Index])
			r.Pairs = append(r.Pairs, topology.Pair{A: gpus[i].Index, B: gpus[j].Index, Level: level, NVLinks: n})
		}
	}
	return r, nil
}

// busKey is a PCI bus ID in one form whatever NVML's padding and case:
// "00000000:1B:00.0" and "0000:1b:00.0" give the same key.
func busKey(id string) string {
	return sysfsBusID(id)
}
