package packing

import (
	"fmt"
	"slices"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/topology"
)

// NodeType is Count nodes with GPUs cards of GiB each, connected as the
// device plugin's simulated Topology profile (plugin/nvml/simtopology.go):
// "nvswitch", "islands", "pcie" or "mixed"; empty publishes no topology
// (allocator.Node.Links zero), as every fleet did before multi-GPU pods.
type NodeType struct {
	Count    int    `json:"count"`
	GPUs     int    `json:"gpus"`
	GiB      uint64 `json:"gib"`
	Topology string `json:"topology,omitempty"`
}

// Topology profiles, as the device plugin's simulated machines name them.
const (
	TopologyNVSwitch = "nvswitch"
	TopologyIslands  = "islands"
	TopologyPCIe     = "pcie"
	TopologyMixed    = "mixed"
)

// topologies lists the profiles a node type may name.
var topologies = []string{TopologyNVSwitch, TopologyIslands, TopologyPCIe, TopologyMixed}

// ProfileLinks returns the GPU links the device plugin publishes for a node of n
// GPUs connected as profile (nil for no profile): the plugin's simulated
// machines (plugin/nvml/simtopology.go) as plugin/topology scores them.
// Every profile has the same PCIe layout: GPUs 2k and 2k+1 share a PCIe
// switch (SINGLE), the first half of the GPUs is one NUMA node and the second
// another (NODE within a half, SYSTEM across). NVLink: nvswitch gives every
// GPU 18 links to NVSwitches (all pairs connected, as a DGX H100); islands
// links GPUs 0-3 and 4-7 (each group of four) pairwise by 4 links; mixed
// links 0-1 by 4 and 2-3 by 2; pcie has none.
func ProfileLinks(profile string, n int) []gpushare.GPULink {
	r, ok := ProfileReading(profile, n)
	if !ok {
		return nil
	}
	return topology.Links(r)
}

// ProfileReading is what the device plugin reads from NVML on a simulated
// machine of n GPUs connected as profile (ProfileLinks describes them); ok
// is false for no profile, where nothing is read. The DRA driver names its
// NVLink domains from the same reading (plugin/dra/slice.NVLinkDomains).
func ProfileReading(profile string, n int) (r topology.Reading, ok bool) {
	if profile == "" {
		return topology.Reading{}, false
	}
	half := max((n+1)/2, 1)
	for i := range n {
		g := topology.GPU{Index: i, NUMANode: i / half}
		if profile == TopologyNVSwitch {
			g.SwitchLinks = 18
		}
		r.GPUs = append(r.GPUs, g)
	}
	for a := range n {
		for b := a + 1; b < n; b++ {
			p := topology.Pair{A: a, B: b, Level: topology.LevelSystem}
			switch {
			case a/2 == b/2:
				p.Level = topology.LevelSingle
			case a/half == b/half:
				p.Level = topology.LevelNode
			}
			switch {
			case profile == TopologyIslands && a/4 == b/4:
				p.NVLinks = 4
			case profile == TopologyMixed && a == 0 && b == 1:
				p.NVLinks = 4
			case profile == TopologyMixed && a == 2 && b == 3:
				p.NVLinks = 2
			}
			r.Pairs = append(r.Pairs, p)
		}
	}
	return r, true
}

// Fleet is a cluster's GPU nodes. Nodes of different types are interleaved
// (round robin, in Types order) so that no policy finds all the large cards
// first by accident of naming.
type Fleet struct {
	Name  string     `json:"name"`
	Types []NodeType `json:"types"`
}

// LargeFleet is 100 nodes of 8 x 80 GiB.
func LargeFleet() Fleet {
	return Fleet{Name: "100x8x80GiB", Types: []NodeType{{Count: 100, GPUs: 8, GiB: 80}}}
}

// SmallFleet is 4 nodes of 4 x 24 GiB.
func SmallFleet() Fleet {
	return Fleet{Name: "4x4x24GiB", Types: []NodeType{{Count: 4, GPUs: 4, GiB: 24}}}
}

// MixedFleet is 20 nodes of 8 x 80 GiB, 10 of 8 x 48 GiB and 20 of 4 x 24 GiB.
func MixedFleet() Fleet {
	return Fleet{Name: "mixed-20x8x80-10x8x48-20x4x24GiB", Types: []NodeType{{Count: 20, GPUs: 8, GiB: 80}, {Count: 10, GPUs: 8, GiB: 48}, {Count: 20, GPUs: 4, GiB: 24}}}
}

// IslandsFleet is 40 nodes of 8 x 80 GiB, each two NVLink islands of four
// GPUs (the "islands" profile): a multi-GPU pod honours the topology only
// within one island.
func IslandsFleet() Fleet {
	return Fleet{Name: "40x8x80GiB-islands", Types: []NodeType{{Count: 40, GPUs: 8, GiB: 80, Topology: TopologyIslands}}}
}

// TopologyMixFleet is 8-GPU 80 GiB nodes of every profile, 10 each:
// nvswitch (every set honoured), islands, mixed (two NVLink pairs) and pcie
// (none).
func TopologyMixFleet() Fleet {
	return Fleet{Name: "40x8x80GiB-nvswitch-islands-mixed-pcie", Types: []NodeType{
		{Count: 10, GPUs: 8, GiB: 80, Topology: TopologyNVSwitch}, {Count: 10, GPUs: 8, GiB: 80, Topology: TopologyIslands},
		{Count: 10, GPUs: 8, GiB: 80, Topology: TopologyMixed}, {Count: 10, GPUs: 8, GiB: 80, Topology: TopologyPCIe}}}
}

// Validate reports an empty fleet, a node type without memory, with more
// GPUs than a node may have, or with an unknown topology profile.
func (f Fleet) Validate() error {
	n := 0
	for _, t := range f.Types {
		if t.Topology != "" && !slices.Contains(topologies, t.Topology) {
			return fmt.Errorf("fleet %s: node type %+v: unknown topology profile (want one of %v)", f.Name, t, topologies)
		}
		if t.Count < 0 || t.GPUs <= 0 || t.GPUs > gpushare.MaxGPUsPerNode || t.GiB == 0 {
			return fmt.Errorf("fleet %s: bad node type %+v", f.Name, t)
		}
		n += t.Count
	}
	if n == 0 {
		return fmt.Errorf("fleet %s has no node", f.Name)
	}
	return nil
}

// layout returns each node's GPU size and count, in node order.
func (f Fleet) layout() []NodeType {
	left := make([]int, len(f.Types))
	total := 0
	for i, t := range f.Types {
		left[i] = t.Count
		total += t.Count
	}
	out := make([]NodeType, 0, total)
	for len(out) < total {
		for i, t := range f.Types {
			if left[i] > 0 {
				left[i]--
				out = append(out, NodeType{Count: 1, GPUs: t.GPUs, GiB: t.GiB, Topology: t.Topology})
			}
		}
	}
	return out
}

// Layout returns each node's type in node order (Count 1 each): the
// order Nodes and Bins use.
func (f Fleet) Layout() []NodeType { return f.layout() }

// Nodes returns fresh, empty allocator snapshots of the fleet's nodes,
// named n0000, n0001, ..., with the links of their topology profile.
func (f Fleet) Nodes() []allocator.Node {
	lay := f.layout()
	out := make([]allocator.Node, len(lay))
	for i, t := range lay {
		gpus := make([]allocator.GPU, t.GPUs)
		for g := range gpus {
			gpus[g] = allocator.GPU{Index: g, Units: t.GiB, Healthy: true}
		}
		out[i] = allocator.Node{Name: fmt.Sprintf("n%04d", i), GPUShare: true, GPUs: gpus, Links: allocator.NewLinkScores(gpus, ProfileLinks(t.Topology, t.GPUs))}
	}
	return out
}

// Bins returns every GPU's size in node order, then GPU order: the bins of
// the FFD reference.
func (f Fleet) Bins() []uint64 {
	var out []uint64
	for _, t := range f.layout() {
		for range t.GPUs {
			out = append(out, t.GiB)
		}
	}
	return out
}

// CapacityGiB returns the fleet's GPU memory.
func (f Fleet) CapacityGiB() uint64 {
	var c uint64
	for _, t := range f.Types {
		c += uint64(t.Count*t.GPUs) * t.GiB
	}
	return c
}

// Holds reports whether some node of the fleet has count GPUs of at least
// per GiB: whether a pod of that shape could ever be placed.
func (f Fleet) Holds(count int, per uint64) bool {
	for _, t := range f.Types {
		if t.Count > 0 && t.GPUs >= count && t.GiB >= per {
			return true
		}
	}
	return false
}

// LargestGiB returns the largest GPU of the fleet.
func (f Fleet) LargestGiB() uint64 {
	var m uint64
	for _, t := range f.Types {
		if t.Count > 0 {
			m = max(m, t.GiB)
		}
	}
	return m
}
