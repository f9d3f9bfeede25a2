package explain

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/extender/cache"
	"github.com/gpushare/gpushare/inspector/collect"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

// view is one node as the extender sees it, plus what only reasons need.
type view struct {
	node  *corev1.Node
	alloc *allocator.Node
	// unhealthy maps a GPU index to why the device plugin marked it (may be "").
	unhealthy map[int]string
	// mig are the GPUs the device plugin skips (MIG mode), with its reason.
	mig []gpushare.SkippedGPU
}

// buildViews turns the listed objects into one view per node, sorted by
// name, through the extender cache's own snapshot code. exclude (a pod,
// may be nil) is left out: a bound pod is explained on the cluster without it.
func buildViews(st State, exclude *corev1.Pod) ([]view, []Skip) {
	byNode := map[string][]*corev1.Pod{}
	for i := range st.Pods {
		p := &st.Pods[i]
		if p.Spec.NodeName == "" || !collect.IsActivePod(p) || exclude != nil && samePod(p, exclude) {
			continue
		}
		byNode[p.Spec.NodeName] = append(byNode[p.Spec.NodeName], p)
	}
	var views []view
	var skipped []Skip
	for i := range st.Nodes {
		n := &st.Nodes[i]
		alloc, skips := cache.Snapshot(n, byNode[n.Name], nil)
		for _, s := range skips {
			skipped = append(skipped, Skip{Pod: s.Pod, Reason: s.Reason})
		}
		v := view{node: n, alloc: alloc}
		v.unhealthy, v.mig = gpuNotes(n, alloc)
		views = append(views, v)
	}
	slices.SortFunc(views, func(a, b view) int { return strings.Compare(a.node.Name, b.node.Name) })
	slices.SortFunc(skipped, func(a, b Skip) int { return strings.Compare(a.Pod, b.Pod) })
	return views, skipped
}

func samePod(a, b *corev1.Pod) bool {
	if a.UID != "" && b.UID != "" {
		return a.UID == b.UID
	}
	return a.Namespace == b.Namespace && a.Name == b.Name
}

// gpuNotes reads why GPUs are unusable: unhealthy ones from the snapshot,
// with the reason the device plugin published, and the MIG GPUs it skips.
// An unreadable annotation only loses the reasons, never a verdict.
func gpuNotes(n *corev1.Node, alloc *allocator.Node) (map[int]string, []gpushare.SkippedGPU) {
	var unhealthy map[int]string
	for _, g := range alloc.GPUs {
		if !g.Healthy {
			if unhealthy == nil {
				unhealthy = map[int]string{}
			}
			unhealthy[g.Index] = ""
		}
	}
	if raw, ok := n.Annotations[gpushare.AnnotationNodeGPUs]; ok && unhealthy != nil {
		if desc, err := gpushare.DecodeNodeGPUs(raw); err == nil {
			for _, g := range desc.GPUs {
				if _, bad := unhealthy[g.Index]; bad {
					unhealthy[g.Index] = g.Reason
				}
			}
		}
	}
	var mig []gpushare.SkippedGPU
	if raw, ok := n.Annotations[gpushare.AnnotationSkippedGPUs]; ok {
		mig, _ = gpushare.DecodeSkippedGPUs(raw)
	}
	return unhealthy, mig
}

// unitOf is the unit label the inspector's tables use for these nodes.
func unitOf(st State) string {
	return collect.Build(st.Nodes, nil).Unit
}

// amount writes units with the unit label: "12 GiB", or "3 × 256MiB".
func amount(units uint64, unit string) string {
	switch unit {
	case "GiB", "MiB":
		return strconv.FormatUint(units, 10) + " " + unit
	}
	return fmt.Sprintf("%d × %s", units, unit)
}

// indices lists GPU indices for prose: "GPU 3", "GPUs 0, 1".
func indices(gpus []int) string {
	parts := make([]string, len(gpus))
	for i, g := range gpus {
		parts[i] = strconv.Itoa(g)
	}
	if len(gpus) == 1 {
		return "GPU " + parts[0]
	}
	return "GPUs " + strings.Join(parts, ", ")
}

// charged returns a copy of n with ch (GPU index → units) charged on its
// GPUs, as if a copy of the pod had been bound there and allocated.
func charged(n *allocator.Node, ch map[int]uint64) *allocator.Node {
	c := *n
	c.GPUs = slices.Clone(n.GPUs)
	for i := range c.GPUs {
		c.GPUs[i].Used += ch[c.GPUs[i].Index]
	}
	return &c
}
