package manager_test

import (
	"errors"
	"fmt"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/manager"
	"github.com/gpushare/gpushare/plugin/nvml"
	"github.com/gpushare/gpushare/plugin/topology"
)

// publishedNode waits for the plugin's registration and returns its Node's
// GPU description.
func publishedNode(t *testing.T, e *env) gpushare.NodeGPUs {
	t.Helper()
	e.kubelet.waitRegister(t)
	node, err := e.client.CoreV1().Nodes().Get(t.Context(), nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	desc, err := gpushare.DecodeNodeGPUs(node.Annotations[gpushare.AnnotationNodeGPUs])
	if err != nil {
		t.Fatal(err)
	}
	return desc
}

// Every simulated topology profile is published as read: each GPU's NUMA
// node and PCI bus ID, one link per pair with the profile's NVLinks.
func TestPublishesTopology(t *testing.T) {
	tests := []struct {
		backend string
		n       int
		nvlinks func(a, b int) int
	}{
		{"simulated:dgxh100", 8, func(a, b int) int { return 18 }},
		{"simulated:dgxa100:topology=islands", 8, func(a, b int) int {
			if a/4 == b/4 {
				return 4
			}
			return 0
		}},
		{"simulated:dgxh200:topology=pcie", 8, func(a, b int) int { return 0 }},
		{"simulated:mixed", 4, func(a, b int) int {
			return map[[2]int]int{{0, 1}: 4, {2, 3}: 2}[[2]int{a, b}]
		}},
	}
	for _, tt := range tests {
		t.Run(tt.backend, func(t *testing.T) {
			desc := publishedNode(t, run(t, tt.backend, nil))
			if len(desc.GPUs) != tt.n || len(desc.Links) != tt.n*(tt.n-1)/2 {
				t.Fatalf("%d GPUs and %d links, want %d and every pair", len(desc.GPUs), len(desc.Links), tt.n)
			}
			for i, g := range desc.GPUs {
				if g.NUMANode == nil || *g.NUMANode != i/(tt.n/2) || g.PCIBusID != fmt.Sprintf("0000:%02x:00.0", i) {
					t.Errorf("GPU %d: NUMA %v, bus %q", i, g.NUMANode, g.PCIBusID)
				}
			}
			k := 0
			for a := range tt.n {
				for b := a + 1; b < tt.n; b++ {
					l := desc.Links[k]
					k++
					level := topology.LevelSystem
					if a/2 == b/2 {
						level = topology.LevelSingle
					} else if a/(tt.n/2) == b/(tt.n/2) {
						level = topology.LevelNode
					}
					want := gpushare.GPULink{A: a, B: b, NVLinks: tt.nvlinks(a, b), Score: topology.PairScore(level, tt.nvlinks(a, b))}
					if l != want {
						t.Errorf("link %+v, want %+v", l, want)
					}
				}
			}
		})
	}
}

// noTopology is a library whose topology cannot be read.
type noTopology struct{ nvml.Library }

func (noTopology) Topology() (topology.Reading, error) {
	return topology.Reading{}, errors.New("read topology: GPU 3: get NVLink 0 state: ERROR_UNKNOWN")
}

// A topology that cannot be read does not stop the plugin: the GPUs are
// published without NUMA nodes, bus IDs or links.
func TestPublishesWithoutTopology(t *testing.T) {
	e := run(t, "simulated:dgxh100", func(c *manager.Config) { c.Library = noTopology{c.Library} })
	desc := publishedNode(t, e)
	if len(desc.GPUs) != 8 || desc.Links != nil {
		t.Fatalf("published %d GPUs, links %+v; want 8 and none", len(desc.GPUs), desc.Links)
	}
	for _, g := range desc.GPUs {
		if g.NUMANode != nil || g.PCIBusID != "" {
			t.Errorf("GPU %d published with NUMA %v, bus %q", g.Index, g.NUMANode, g.PCIBusID)
		}
	}
}
