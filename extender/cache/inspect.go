package cache

import (
	"cmp"
	"maps"
	"slices"
)

// Inspect is the JSON of GET /gpushare-scheduler/inspect, in the seed's shape
// (contract section 4).
type Inspect struct {
	Nodes []InspectNode `json:"nodes"`
	Error string        `json:"error,omitempty"`
}

// InspectNode is one GPU-sharing node.
type InspectNode struct {
	Name     string       `json:"name"`
	TotalGPU uint64       `json:"totalGPU"`
	UsedGPU  uint64       `json:"usedGPU"`
	Devs     []InspectGPU `json:"devs"`
}

// InspectGPU is one GPU of a node.
type InspectGPU struct {
	ID       int          `json:"id"`
	TotalGPU uint64       `json:"totalGPU"`
	UsedGPU  uint64       `json:"usedGPU"`
	Pods     []InspectPod `json:"pods"`
}

// InspectPod is one pod's charge on one GPU.
type InspectPod struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	UsedGPU   uint64 `json:"usedGPU"`
}

// Inspect describes every GPU-sharing node, or only node when it is not
// empty; ok is false when that node is unknown or does not share GPUs.
// Nodes are sorted by name, pods by namespace and name.
func (c *Cache) Inspect(node string) (Inspect, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := Inspect{Nodes: []InspectNode{}}
	names := []string{node}
	if node == "" {
		names = slices.Sorted(maps.Keys(c.nodes))
	}
	for _, name := range names {
		n, ok := c.nodes[name]
		if !ok || n.node == nil || !n.view.GPUShare {
			continue
		}
		in := InspectNode{Name: name, Devs: make([]InspectGPU, 0, len(n.view.GPUs))}
		for _, g := range n.view.GPUs {
			dev := InspectGPU{ID: g.Index, TotalGPU: g.Units, UsedGPU: g.Used, Pods: []InspectPod{}}
			for _, p := range n.pods {
				if u := p.charges[g.Index]; u > 0 {
					dev.Pods = append(dev.Pods, InspectPod{Name: p.name, Namespace: p.namespace, UsedGPU: u})
				}
			}
			slices.SortFunc(dev.Pods, func(a, b InspectPod) int {
				return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
			})
			in.TotalGPU += g.Units
			in.UsedGPU += g.Used
			in.Devs = append(in.Devs, dev)
		}
		out.Nodes = append(out.Nodes, in)
	}
	return out, node == "" || len(out.Nodes) == 1
}
