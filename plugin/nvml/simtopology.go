package nvml

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// Topology profiles of the simulated machines, chosen with
// ":topology=<profile>" after the machine (docs/device-plugin.md, Topology).
// Every profile has the same PCIe layout: GPUs 2k and 2k+1 share a PCIe
// switch (SINGLE), the first half of the GPUs is on NUMA node 0 and the
// second on node 1 (NODE within a half, SYSTEM across).
const (
	// TopologyNVSwitch links every GPU to NVSwitches by the machine's number
	// of links (12 on A100, 18 on H100, H200, B200), so all pairs are
	// connected; the default of the DGX machines, as on the real ones.
	TopologyNVSwitch = "nvswitch"
	// TopologyIslands links GPUs 0-3 and 4-7 (each group of four) pairwise
	// by 4 NVLink links (bridges); PCIe between islands.
	TopologyIslands = "islands"
	// TopologyPCIe has no NVLink at all.
	TopologyPCIe = "pcie"
	// TopologyMixed links GPUs 0-1 by 4 NVLink links and 2-3 by 2; every
	// other GPU has PCIe only. The default of the mixed machine.
	TopologyMixed = "mixed"
)

// islandLinks is the NVLink links between two GPUs of an island, as between
// the GPUs of a 4-GPU HGX A100 board.
const islandLinks = 4

// simTopologies lists the profiles, for parsing and errors.
func simTopologies() []string {
	return []string{TopologyNVSwitch, TopologyIslands, TopologyPCIe, TopologyMixed}
}

// nvlinkEnd is where one simulated NVLink link ends: a GPU, or a switch.
type nvlinkEnd struct {
	gpu int // index of the remote GPU; -1 for a switch
	sw  int
}

// simTopology is how the GPUs of a simulated machine are connected.
type simTopology struct {
	n     int
	links [][]nvlinkEnd // per GPU, its NVLink links in link order
}

// newSimTopology builds profile for n GPUs with nvlinks links per GPU in
// the nvswitch profile; the profile name is known (parseSimulated checks it).
func newSimTopology(profile string, n, nvlinks int) simTopology {
	t := simTopology{n: n, links: make([][]nvlinkEnd, n)}
	connect := func(a, b, count int) {
		if a >= n || b >= n {
			return
		}
		for range count {
			t.links[a] = append(t.links[a], nvlinkEnd{gpu: b})
			t.links[b] = append(t.links[b], nvlinkEnd{gpu: a})
		}
	}
	switch profile {
	case TopologyNVSwitch:
		for i := range n {
			for k := range nvlinks {
				t.links[i] = append(t.links[i], nvlinkEnd{gpu: -1, sw: k % 4})
			}
		}
	case TopologyIslands:
		for a := range n {
			for b := a + 1; b < n && b/4 == a/4; b++ {
				connect(a, b, islandLinks)
			}
		}
	case TopologyMixed:
		connect(0, 1, 4)
		connect(2, 3, 2)
	}
	return t
}

// numa is the NUMA node of GPU i: the first half of the GPUs on node 0.
func (t simTopology) numa(i int) int {
	return i / max((t.n+1)/2, 1)
}

// level is the PCIe common ancestor of GPUs a and b.
func (t simTopology) level(a, b int) nvml.GpuTopologyLevel {
	switch {
	case a == b:
		return nvml.TOPOLOGY_INTERNAL
	case a/2 == b/2:
		return nvml.TOPOLOGY_SINGLE
	case t.numa(a) == t.numa(b):
		return nvml.TOPOLOGY_NODE
	default:
		return nvml.TOPOLOGY_SYSTEM
	}
}

// switchBusID is the PCI bus ID of simulated NVSwitch k, clear of the GPUs'.
func switchBusID(k int) string {
	return fmt.Sprintf("0000:%02x:00.0", 0xc0+k)
}

// pciInfo is a PciInfo carrying only the bus ID id.
func pciInfo(id string) nvml.PciInfo {
	var p nvml.PciInfo
	for i := 0; i < len(id) && i < len(p.BusId)-1; i++ {
		p.BusId[i] = int8(id[i])
	}
	return p
}

// apply gives the mock GPU at index the topology calls, which the go-nvml
// mocks do not implement: common ancestors, NVLink state, remote PCI info
// and remote device type.
func (t simTopology) apply(index int, dev *server.Device, all []nvml.Device) {
	links := t.links[index]
	dev.GetTopologyCommonAncestorFunc = func(other nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
		o, ok := other.(*server.Device)
		if !ok || o.Index < 0 || o.Index >= t.n {
			return 0, nvml.ERROR_INVALID_ARGUMENT
		}
		return t.level(index, o.Index), nvml.SUCCESS
	}
	end := func(link int) (nvlinkEnd, nvml.Return) {
		switch {
		case len(links) == 0:
			return nvlinkEnd{}, nvml.ERROR_NOT_SUPPORTED
		case link < 0 || link >= len(links):
			return nvlinkEnd{}, nvml.ERROR_INVALID_ARGUMENT
		}
		return links[link], nvml.SUCCESS
	}
	dev.GetNvLinkStateFunc = func(link int) (nvml.EnableState, nvml.Return) {
		if _, ret := end(link); ret != nvml.SUCCESS {
			return nvml.FEATURE_DISABLED, ret
		}
		return nvml.FEATURE_ENABLED, nvml.SUCCESS
	}
	dev.GetNvLinkRemotePciInfoFunc = func(link int) (nvml.PciInfo, nvml.Return) {
		e, ret := end(link)
		switch {
		case ret != nvml.SUCCESS:
			return nvml.PciInfo{}, ret
		case e.gpu < 0:
			return pciInfo(switchBusID(e.sw)), nvml.SUCCESS
		}
		return pciInfo(all[e.gpu].(*server.Device).PciBusID), nvml.SUCCESS
	}
	dev.GetNvLinkRemoteDeviceTypeFunc = func(link int) (nvml.IntNvLinkDeviceType, nvml.Return) {
		e, ret := end(link)
		switch {
		case ret != nvml.SUCCESS:
			return nvml.NVLINK_DEVICE_TYPE_UNKNOWN, ret
		case e.gpu < 0:
			return nvml.NVLINK_DEVICE_TYPE_SWITCH, nvml.SUCCESS
		}
		return nvml.NVLINK_DEVICE_TYPE_GPU, nvml.SUCCESS
	}
}

// numaOf returns the library's NUMA reader for the machine's GPUs, by their
// sysfs bus IDs; -1 for any other.
func (t simTopology) numaOf(all []nvml.Device) func(string) int {
	byBus := make(map[string]int, len(all))
	for i, d := range all {
		if dev, ok := d.(*server.Device); ok && i < t.n {
			byBus[sysfsBusID(dev.PciBusID)] = t.numa(i)
		}
	}
	return func(busID string) int {
		if n, ok := byBus[busID]; ok {
			return n
		}
		return -1
	}
}
