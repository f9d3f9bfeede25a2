package slice

import (
	"github.com/gpushare/gpushare/plugin/topology"
)

// NVLinkDomains names each GPU's NVLink domain: the GPUs reachable from it
// over NVLink, directly or through NVSwitches, the way plugin/topology
// counts links (topology.Links: a pair is linked when its NVLink count,
// switch links included, is above zero). The name is "nvlink-" and the
// smallest UUID of the domain, so it is the same for every member, names
// no index (stable across restarts and renumbering), and a GPU with no
// NVLink is a domain of one. A claim's matchAttribute on it asks for GPUs
// of one domain. uuids maps each index of r.GPUs to its UUID; a GPU
// without one is left out.
func NVLinkDomains(r topology.Reading, uuids map[int]string) map[int]string {
	parent := map[int]int{}
	var find func(int) int
	find = func(i int) int {
		if parent[i] != i {
			parent[i] = find(parent[i])
		}
		return parent[i]
	}
	for _, g := range r.GPUs {
		if uuids[g.Index] != "" {
			parent[g.Index] = g.Index
		}
	}
	for _, l := range topology.Links(r) {
		_, okA := parent[l.A]
		_, okB := parent[l.B]
		if l.NVLinks > 0 && okA && okB {
			parent[find(l.A)] = find(l.B)
		}
	}
	smallest := map[int]string{}
	for i := range parent {
		root := find(i)
		if s, ok := smallest[root]; !ok || uuids[i] < s {
			smallest[root] = uuids[i]
		}
	}
	out := make(map[int]string, len(parent))
	for i := range parent {
		out[i] = "nvlink-" + smallest[find(i)]
	}
	return out
}
