package collect

import (
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

// NodeUsage is what a node's usage loop measured (its gpushare.io/usage
// annotation, docs/usage.md), in MiB whatever the report's unit.
type NodeUsage struct {
	// At is when the plugin read the GPUs; it rewrites the value only when
	// a figure moved by a unit, so an old At means nothing moved since.
	At time.Time `json:"at"`
	// UsedMiB is all memory in use on the node's GPUs, every context counted.
	UsedMiB uint64 `json:"usedMiB"`
	// SlicedMiB is what containers with a slice use, on any GPU.
	SlicedMiB uint64 `json:"slicedMiB"`
	// OverSlice counts containers above their slice on some GPU.
	OverSlice int `json:"overSlice"`
	// Truncated is how many of the plugin's container entries it left out.
	Truncated int `json:"truncated,omitempty"`
}

// ClusterUsage adds up the nodes that measure use.
type ClusterUsage struct {
	// Nodes is how many nodes publish their use.
	Nodes int `json:"nodes"`
	// UsedMiB is what containers with a slice use on those nodes
	// (their NodeUsage.SlicedMiB), AllocatedMiB what those nodes allocate.
	UsedMiB      uint64 `json:"usedMiB"`
	AllocatedMiB uint64 `json:"allocatedMiB"`
	OverSlice    int    `json:"overSlice"`
}

// readUsage decodes a node's usage summary; nil when it has none. A
// malformed one is skipped with the reason: the allocation view stands.
func readUsage(n *corev1.Node, r *Report) *gpushare.NodeUsage {
	raw, ok := n.Annotations[gpushare.AnnotationNodeUsage]
	if !ok {
		return nil
	}
	u, err := gpushare.DecodeNodeUsage(raw)
	if err != nil {
		r.Skipped = append(r.Skipped, Skipped{Kind: KindNode, Name: n.Name,
			Reason: "annotation " + gpushare.AnnotationNodeUsage + " ignored, use unknown: " + err.Error()})
		return nil
	}
	return &u
}

// applyUsage puts u's figures on n's GPUs and containers.
func applyUsage(n *Node, u *gpushare.NodeUsage) {
	if u == nil {
		return
	}
	nu := &NodeUsage{At: u.At, Truncated: u.Truncated}
	for _, g := range u.GPUs {
		nu.UsedMiB += g.UsedMiB
		for i := range n.GPUs {
			if n.GPUs[i].Index == g.Index {
				used := g.UsedMiB
				n.GPUs[i].UsedMiB, n.GPUs[i].Utilization = &used, g.Utilization
			}
		}
	}
	type ref struct{ namespace, pod, container string }
	used := map[ref]uint64{}
	over := map[ref]bool{}
	for _, c := range u.Containers {
		if c.SliceMiB == 0 {
			continue
		}
		k := ref{c.Namespace, c.Pod, c.Container}
		used[k] += c.UsedMiB
		nu.SlicedMiB += c.UsedMiB
		over[k] = over[k] || c.Over()
	}
	for k, o := range over {
		if o && used[k] > 0 {
			nu.OverSlice++
		}
	}
	for i := range n.Pods {
		p := &n.Pods[i]
		for j := range p.Containers {
			c := &p.Containers[j]
			k := ref{p.Namespace, p.Name, c.Name}
			if v, ok := used[k]; ok {
				c.UsedMiB, c.OverSlice = &v, over[k]
			}
		}
	}
	n.Usage = nu
}

// addUsage counts n in the cluster's usage; unitMiB is n's unit.
func (c *ClusterUsage) addUsage(n *Node, unitMiB uint64) {
	c.Nodes++
	c.UsedMiB += n.Usage.SlicedMiB
	c.AllocatedMiB += n.Allocated * unitMiB
	c.OverSlice += n.Usage.OverSlice
}
