package packing

import (
	"fmt"

	"github.com/gpushare/gpushare/extender/allocator"
)

// NodeType is Count nodes with GPUs cards of GiB each.
type NodeType struct {
	Count int    `json:"count"`
	GPUs  int    `json:"gpus"`
	GiB   uint64 `json:"gib"`
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

// Validate reports an empty fleet or a node type without memory.
func (f Fleet) Validate() error {
	n := 0
	for _, t := range f.Types {
		if t.Count < 0 || t.GPUs <= 0 || t.GiB == 0 {
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
				out = append(out, NodeType{Count: 1, GPUs: t.GPUs, GiB: t.GiB})
			}
		}
	}
	return out
}

// Nodes returns fresh, empty allocator snapshots of the fleet's nodes,
// named n0000, n0001, ...
func (f Fleet) Nodes() []allocator.Node {
	lay := f.layout()
	out := make([]allocator.Node, len(lay))
	for i, t := range lay {
		gpus := make([]allocator.GPU, t.GPUs)
		for g := range gpus {
			gpus[g] = allocator.GPU{Index: g, Units: t.GiB, Healthy: true}
		}
		out[i] = allocator.Node{Name: fmt.Sprintf("n%04d", i), GPUShare: true, GPUs: gpus}
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
