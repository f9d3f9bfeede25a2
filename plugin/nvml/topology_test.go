package nvml

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"go.uber.org/zap"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/topology"
)

// linkTable is a node's published links as "a-b:nvlinks/score" strings.
func linkTable(links []gpushare.GPULink) []string {
	out := make([]string, len(links))
	for i, l := range links {
		out[i] = fmt.Sprintf("%d-%d:%d/%d", l.A, l.B, l.NVLinks, l.Score)
	}
	return out
}

func readTopology(t *testing.T, backend string) topology.Reading {
	t.Helper()
	sim, err := NewSimulator(nil, backend)
	if err != nil {
		t.Fatalf("NewSimulator(%q): %v", backend, err)
	}
	t.Cleanup(func() { sim.Shutdown() })
	r, err := sim.Topology()
	if err != nil {
		t.Fatalf("Topology(%q): %v", backend, err)
	}
	return r
}

// score builds the expected link of a pair.
func score(a, b int, level topology.Level, nvlinks int) string {
	return fmt.Sprintf("%d-%d:%d/%d", a, b, nvlinks, topology.PairScore(level, nvlinks))
}

// pcieLevel is the simulated PCIe layout of 8 GPUs.
func pcieLevel(a, b, n int) topology.Level {
	switch {
	case a/2 == b/2:
		return topology.LevelSingle
	case a/(n/2) == b/(n/2):
		return topology.LevelNode
	default:
		return topology.LevelSystem
	}
}

func TestSimulatedTopologyProfiles(t *testing.T) {
	tests := []struct {
		backend  string
		n        int
		nvswitch bool
		nvlinks  func(a, b int) int
	}{
		{"simulated:dgxh100", 8, true, func(a, b int) int { return 18 }},
		{"simulated:dgxh200:topology=nvswitch", 8, true, func(a, b int) int { return 18 }},
		{"simulated:dgxa100", 8, true, func(a, b int) int { return 12 }},
		{"simulated:dgxb200:topology=islands", 8, false, func(a, b int) int {
			if a/4 == b/4 {
				return 4
			}
			return 0
		}},
		{"simulated:dgxh100:topology=pcie", 8, false, func(a, b int) int { return 0 }},
		{"simulated:dgxh100:topology=mixed", 8, false, func(a, b int) int {
			switch {
			case a == 0 && b == 1:
				return 4
			case a == 2 && b == 3:
				return 2
			}
			return 0
		}},
		{"simulated:mixed", 4, false, func(a, b int) int {
			switch {
			case a == 0 && b == 1:
				return 4
			case a == 2 && b == 3:
				return 2
			}
			return 0
		}},
		{"simulated:mixed:topology=nvswitch", 4, true, func(a, b int) int { return 12 }},
	}
	for _, tt := range tests {
		t.Run(tt.backend, func(t *testing.T) {
			r := readTopology(t, tt.backend)
			if len(r.GPUs) != tt.n {
				t.Fatalf("%d GPUs, want %d", len(r.GPUs), tt.n)
			}
			for i, g := range r.GPUs {
				if g.Index != i || g.NUMANode != i/(tt.n/2) || !strings.HasPrefix(g.PCIBusID, "0000:") {
					t.Errorf("GPU %d = %+v, want NUMA node %d and a bus ID", i, g, i/(tt.n/2))
				}
			}
			if r.NVSwitch() != tt.nvswitch {
				t.Errorf("NVSwitch() = %v, want %v", r.NVSwitch(), tt.nvswitch)
			}
			var want []string
			for a := range tt.n {
				for b := a + 1; b < tt.n; b++ {
					want = append(want, score(a, b, pcieLevel(a, b, tt.n), tt.nvlinks(a, b)))
				}
			}
			if got := linkTable(topology.Links(r)); !reflect.DeepEqual(got, want) {
				t.Errorf("links\n got %v\nwant %v", got, want)
			}
		})
	}
}

func TestSimulatedTopologyMIG(t *testing.T) {
	// GPU 1 in MIG mode is left out, and GPU 0's links to it count for nothing.
	r := readTopology(t, "simulated:mixed:mig=1")
	if len(r.GPUs) != 3 || r.GPUs[1].Index != 2 || r.GPUs[0].SwitchLinks != 0 {
		t.Fatalf("GPUs = %+v, want 0, 2, 3 and no switch links", r.GPUs)
	}
	want := []string{score(0, 2, topology.LevelSystem, 0), score(0, 3, topology.LevelSystem, 0), score(2, 3, topology.LevelSingle, 2)}
	if got := linkTable(topology.Links(r)); !reflect.DeepEqual(got, want) {
		t.Errorf("links %v, want %v", got, want)
	}
}

// simServer builds a simulator whose mock devices the test may change.
func simServer(t *testing.T, backend string, change func(devs []*server.Device)) *Simulator {
	t.Helper()
	spec, err := parseSimulated(backend)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := newMixedMachine()
	if err != nil {
		t.Fatal(err)
	}
	profile := spec.topology
	if profile == "" {
		profile = TopologyMixed
	}
	topo := newSimTopology(profile, len(srv.Devices), 12)
	sim, err := newSimulatorFromServer(zap.NewNop(), backend, srv, spec.mig, topo)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Shutdown() })
	devs := make([]*server.Device, len(srv.Devices))
	for i, d := range srv.Devices {
		devs[i] = d.(*server.Device)
	}
	change(devs)
	return sim
}

func TestTopologyOlderDriver(t *testing.T) {
	// A driver that cannot name the remote device type: links to a GPU are
	// found by bus ID, the others are taken for switch links.
	for _, profile := range []string{TopologyMixed, TopologyNVSwitch} {
		sim := simServer(t, "simulated:mixed:topology="+profile, func(devs []*server.Device) {
			for _, d := range devs {
				d.GetNvLinkRemoteDeviceTypeFunc = func(int) (nvml.IntNvLinkDeviceType, nvml.Return) {
					return 0, nvml.ERROR_FUNCTION_NOT_FOUND
				}
			}
		})
		r, err := sim.Topology()
		if err != nil {
			t.Fatal(err)
		}
		got := topology.Links(r)
		if profile == TopologyMixed && (got[0].NVLinks != 4 || got[5].NVLinks != 2 || got[1].NVLinks != 0 || r.NVSwitch()) {
			t.Errorf("mixed: %+v", got)
		}
		if profile == TopologyNVSwitch && (!r.NVSwitch() || slices.ContainsFunc(got, func(l gpushare.GPULink) bool { return l.NVLinks != 12 })) {
			t.Errorf("nvswitch: %+v", got)
		}
	}
}

func TestTopologyUnsupported(t *testing.T) {
	// No NVLink and no common ancestor: every pair unknown, score 0.
	sim := simServer(t, "simulated:mixed", func(devs []*server.Device) {
		for _, d := range devs {
			d.GetNvLinkStateFunc = func(int) (nvml.EnableState, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
			d.GetTopologyCommonAncestorFunc = func(nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
				return 0, nvml.ERROR_NOT_SUPPORTED
			}
		}
	})
	r, err := sim.Topology()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range topology.Links(r) {
		if l.Score != 0 || l.NVLinks != 0 {
			t.Errorf("link %+v, want score 0", l)
		}
	}
}

func TestTopologyErrors(t *testing.T) {
	// A link seen from one end only does not count.
	sim := simServer(t, "simulated:mixed", func(devs []*server.Device) {
		devs[1].GetNvLinkStateFunc = func(int) (nvml.EnableState, nvml.Return) { return nvml.FEATURE_DISABLED, nvml.SUCCESS }
	})
	r, err := sim.Topology()
	if err != nil || topology.Links(r)[0].NVLinks != 0 {
		t.Errorf("one-sided links: %+v, %v", r, err)
	}
	for name, change := range map[string]func(d *server.Device){
		"state": func(d *server.Device) {
			d.GetNvLinkStateFunc = func(int) (nvml.EnableState, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
		},
		"remote PCI": func(d *server.Device) {
			d.GetNvLinkRemotePciInfoFunc = func(int) (nvml.PciInfo, nvml.Return) { return nvml.PciInfo{}, nvml.ERROR_GPU_IS_LOST }
		},
		"remote type": func(d *server.Device) {
			d.GetNvLinkRemoteDeviceTypeFunc = func(int) (nvml.IntNvLinkDeviceType, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
		},
		"ancestor": func(d *server.Device) {
			d.GetTopologyCommonAncestorFunc = func(nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
		},
	} {
		sim := simServer(t, "simulated:mixed", func(devs []*server.Device) { change(devs[0]) })
		if _, err := sim.Topology(); err == nil || !strings.Contains(err.Error(), "GPU 0") {
			t.Errorf("%s: err = %v, want one naming GPU 0", name, err)
		}
	}
	sim.Shutdown()
	if _, err := sim.Topology(); !errors.Is(err, ErrShutdown) {
		t.Errorf("after Shutdown: %v", err)
	}
}

func TestSimulatedTopologySyntax(t *testing.T) {
	good := map[string]string{
		"simulated:dgxh100:topology=pcie":           "pcie",
		"simulated:dgxh100:mig=1:topology=islands":  "islands",
		"simulated:dgxh100:topology=mixed:mig=2,1":  "mixed",
		"simulated:dgxh100:topology=nvswitch:mig=0": "nvswitch",
	}
	for in, want := range good {
		if got, err := parseSimulated(in); err != nil || got.topology != want {
			t.Errorf("parseSimulated(%q) = %+v, %v; want topology %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"simulated:dgxh100:topology=", "simulated:dgxh100:topology=ring",
		"simulated:dgxh100:topology=pcie:topology=pcie", "simulated:dgxh100:topology=pcie:", "simulated:dgxh100:mig=1:mig=2:topology=pcie"} {
		if _, err := NewSimulator(nil, bad); !errors.Is(err, ErrUnknownBackend) {
			t.Errorf("NewSimulator(%q) = %v, want ErrUnknownBackend", bad, err)
		}
	}
}

func TestReadSysfsNUMA(t *testing.T) {
	if n := readSysfsNUMA("no-such-device"); n != -1 {
		t.Errorf("readSysfsNUMA of a missing device = %d, want -1", n)
	}
}
