package packing

import (
	"bytes"
	"reflect"
	"testing"

	"github.com/gpushare/gpushare/extender/allocator"
)

// islandsSpec is a quick multi-GPU workload for 8 islands nodes.
func islandsSpec(seed uint64, load float64) (Fleet, GenSpec) {
	f := Fleet{Name: "8x8x80GiB-islands", Types: []NodeType{{Count: 8, GPUs: 8, GiB: 80, Topology: TopologyIslands}}}
	m := MultiGPUMix()
	return f, GenSpec{Mix: m, Seed: seed, CapacityGiB: f.CapacityGiB(), Load: load, Horizon: 4 * m.Life.Mean}
}

func TestProfileLinks(t *testing.T) {
	if ProfileLinks("", 8) != nil {
		t.Fatal("no profile published links")
	}
	gpus := Fleet{Types: []NodeType{{Count: 1, GPUs: 8, GiB: 80}}}.Nodes()[0].GPUs
	nv := func(profile string, a, b int) (bool, int) {
		l := allocator.NewLinkScores(gpus, ProfileLinks(profile, 8))
		return l.NVLink(a, b), l.Score(a, b)
	}
	for _, c := range []struct {
		profile string
		a, b    int
		nvlink  bool
		score   int
	}{
		{TopologyIslands, 0, 1, true, 50 + 400}, // one PCIe switch, 4 links
		{TopologyIslands, 0, 3, true, 20 + 400}, // same NUMA node
		{TopologyIslands, 3, 4, false, 10},      // across islands and sockets
		{TopologyIslands, 4, 7, true, 20 + 400},
		{TopologyNVSwitch, 0, 7, true, 10 + 1800},
		{TopologyPCIe, 0, 1, false, 50},
		{TopologyMixed, 2, 3, true, 50 + 200},
		{TopologyMixed, 4, 5, false, 50},
	} {
		if ok, s := nv(c.profile, c.a, c.b); ok != c.nvlink || s != c.score {
			t.Errorf("%s %d-%d: nvlink %v score %d, want %v %d", c.profile, c.a, c.b, ok, s, c.nvlink, c.score)
		}
	}
	if err := (Fleet{Name: "x", Types: []NodeType{{Count: 1, GPUs: 8, GiB: 80, Topology: "torus"}}}).Validate(); err == nil {
		t.Error("an unknown profile validated")
	}
}

func TestGenerateMultiGPU(t *testing.T) {
	f, spec := islandsSpec(3, 1)
	pods, err := Generate(spec)
	if err != nil {
		t.Fatal(err)
	}
	multi := 0
	for _, p := range pods {
		switch p.GPUs {
		case 0:
			if p.GiB < 1 || p.GiB > 16 {
				t.Fatalf("single-GPU pod %+v outside 1-16 GiB", p)
			}
		case 2, 4:
			multi++
			if p.GiB%uint64(p.GPUs) != 0 || p.PerGPU() < 8 || p.PerGPU() > 32 {
				t.Fatalf("pod %+v: not 8-32 GiB on each GPU", p)
			}
		default:
			t.Fatalf("pod %+v spans %d GPUs", p, p.GPUs)
		}
	}
	if share := float64(multi) / float64(len(pods)); share < 0.07 || share > 0.13 {
		t.Fatalf("%d of %d pods multi-GPU, want about 10%%", multi, len(pods))
	}
	var buf bytes.Buffer
	if err := WriteWorkload(&buf, spec, pods); err != nil {
		t.Fatal(err)
	}
	back, got, err := ReadWorkload(&buf)
	if err != nil || !reflect.DeepEqual(back, spec) || !reflect.DeepEqual(got, pods) {
		t.Fatalf("round trip: %v", err)
	}
	if err := (Scenario{Name: "s", Fleet: f, Gen: spec, Warmup: 1, SampleEvery: 60}).Validate(); err != nil {
		t.Fatal(err)
	}
	small := spec
	small.CapacityGiB = SmallFleet().CapacityGiB()
	if err := (Scenario{Name: "s", Fleet: SmallFleet(), Gen: small, Warmup: 1, SampleEvery: 60}).Validate(); err == nil {
		t.Error("32 GiB per GPU validated on 24 GiB GPUs")
	}
	bad := Mix{Name: "odd", Sizes: []SizeBand{{Weight: 1, Min: 3, Max: 9, GPUs: 2}}, Life: Lifetime{Kind: "exp", Mean: 1}}
	if bad.Validate() == nil {
		t.Error("odd sizes over two GPUs validated")
	}
	if CheckWorkload([]Pod{{ID: 0, GiB: 5, Life: 1, GPUs: 2}}) == nil {
		t.Error("5 GiB over two GPUs accepted")
	}
}

// Every multi-GPU placement is a set of its size on one node, each GPU
// charged its share, and no GPU is ever over-committed.
func TestMultiGPUPlacements(t *testing.T) {
	f, spec := islandsSpec(5, 1.3)
	spec.Horizon = 3600
	pods, err := Generate(spec)
	if err != nil {
		t.Fatal(err)
	}
	for _, blind := range []bool{false, true} {
		c, err := newCluster(f, Options{Policy: allocator.BestFit, Blind: blind})
		if err != nil {
			t.Fatal(err)
		}
		var held []placed
		multi := 0
		for i, p := range pods {
			pl, ok, err := c.place(p)
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				held = append(held, pl)
				want := max(1, p.GPUs)
				if len(pl.charges) != want || p.GPUs > 1 && pl.set.Len() != want {
					t.Fatalf("pod %+v got %v on %v", p, pl.charges, pl.set)
				}
				for g, units := range pl.charges {
					if units != p.PerGPU() || p.GPUs > 1 && !pl.set.Has(g) {
						t.Fatalf("pod %+v charged %v", p, pl.charges)
					}
				}
				if p.GPUs > 1 {
					multi++
				}
			}
			for _, n := range c.nodes {
				for _, g := range n.GPUs {
					if g.Used > g.Units {
						t.Fatalf("GPU %d of %s has %d of %d", g.Index, n.Name, g.Used, g.Units)
					}
				}
				if blind == n.Links.Known() {
					t.Fatalf("blind %v, node %s publishes links %v", blind, n.Name, n.Links.Known())
				}
			}
			if i%3 == 2 && len(held) > 0 {
				if err := c.apply(held[0], false); err != nil {
					t.Fatal(err)
				}
				held = held[1:]
			}
		}
		if multi == 0 || c.topo.Placed != multi {
			t.Fatalf("blind %v: %d multi-GPU placements, stats say %d", blind, multi, c.topo.Placed)
		}
	}
}

// On islands nodes the topology-aware choice honours the topology more often
// than the blind one, at the same utilisation (within a point).
func TestTopologyAwareBeatsBlind(t *testing.T) {
	for _, seed := range []uint64{1, 2} {
		f, spec := islandsSpec(seed, 1)
		pods, err := Generate(spec)
		if err != nil {
			t.Fatal(err)
		}
		s := Scenario{Name: "islands", Fleet: f, Gen: spec, Warmup: 3600, SampleEvery: 600, RefEvery: 4}
		runs := []Run{{Policy: allocator.BestFit}, {Policy: allocator.BestFit, Blind: true}}
		if got := RunsFor(s); !reflect.DeepEqual(got, append(Runs(), runs[1])) {
			t.Fatalf("runs for a multi-GPU scenario: %v", got)
		}
		rep, err := RunScenario(s, pods, runs)
		if err != nil {
			t.Fatal(err)
		}
		aware, blind := rep.Churn[0], rep.Churn[1]
		if blind.Run != "bestfit/blind" {
			t.Fatalf("run named %q", blind.Run)
		}
		at, bt := aware.Result.Topology, blind.Result.Topology
		if at == nil || bt == nil || at.Placed == 0 || bt.Placed == 0 {
			t.Fatalf("seed %d: no multi-GPU placements: %+v %+v", seed, at, bt)
		}
		for _, x := range []*TopologyStats{at, bt} {
			if x.Honoured > x.Available || x.Available > x.Placed || len(x.ByCount) != 2 || x.ByCount[0].GPUs != 2 || x.ByCount[1].GPUs != 4 ||
				x.ByCount[0].Placed+x.ByCount[1].Placed != x.Placed || x.ByCount[0].Honoured+x.ByCount[1].Honoured != x.Honoured {
				t.Fatalf("seed %d: inconsistent %+v", seed, x)
			}
		}
		t.Logf("seed %d: honoured %d/%d (%.1f%%) aware, %d/%d (%.1f%%) blind; allocated %.2f%% / %.2f%%", seed,
			at.Honoured, at.Placed, 100*at.Rate, bt.Honoured, bt.Placed, 100*bt.Rate, 100*aware.Steady.Allocated, 100*blind.Steady.Allocated)
		if at.Rate <= bt.Rate {
			t.Errorf("seed %d: aware honours %.3f, blind %.3f", seed, at.Rate, bt.Rate)
		}
		if d := aware.Steady.Allocated - blind.Steady.Allocated; d < -0.01 || d > 0.01 {
			t.Errorf("seed %d: allocated %.4f aware, %.4f blind", seed, aware.Steady.Allocated, blind.Steady.Allocated)
		}
		if rep.Fill.Runs[0].Topology.Rate <= rep.Fill.Runs[1].Topology.Rate {
			t.Errorf("seed %d: fill honours %.3f aware, %.3f blind", seed, rep.Fill.Runs[0].Topology.Rate, rep.Fill.Runs[1].Topology.Rate)
		}
		if rep.Fill.FFD.Pods == 0 || rep.Fill.Runs[0].RatioFFD <= 0 {
			t.Fatalf("seed %d: FFD reference %+v", seed, rep.Fill.FFD)
		}
	}
}

// Where every pair is NVLink-connected every set honours the topology; where
// none is, none does, aware or blind.
func TestTopologyExtremes(t *testing.T) {
	for _, c := range []struct {
		profile string
		rate    float64
	}{{TopologyNVSwitch, 1}, {TopologyPCIe, 0}} {
		f := Fleet{Name: c.profile, Types: []NodeType{{Count: 4, GPUs: 8, GiB: 80, Topology: c.profile}}}
		m := MultiGPUMix()
		pods, err := Generate(GenSpec{Mix: m, Seed: 4, CapacityGiB: f.CapacityGiB(), Load: 1, Horizon: 2 * m.Life.Mean})
		if err != nil {
			t.Fatal(err)
		}
		for _, blind := range []bool{false, true} {
			res, err := Churn(f, pods, ChurnOptions{Options: Options{Policy: allocator.BestFit, Blind: blind}})
			if err != nil {
				t.Fatal(err)
			}
			if x := res.Topology; x == nil || x.Placed == 0 || x.Rate != c.rate || c.rate == 1 && x.Available != x.Placed {
				t.Fatalf("%s blind %v: %+v", c.profile, blind, x)
			}
		}
	}
	// Single-GPU workloads report no topology.
	f, spec := smallSpec(UniformMix(), 1, 1)
	pods, _ := Generate(spec)
	if res, err := Churn(f, pods, ChurnOptions{Options: Options{Policy: allocator.BestFit}, Horizon: 3600}); err != nil || res.Topology != nil {
		t.Fatalf("single-GPU churn: %v, topology %+v", err, res.Topology)
	}
}

// The shortcuts change nothing with multi-GPU pods either.
func TestShortcutsExactMultiGPU(t *testing.T) {
	f, spec := islandsSpec(9, 1.3)
	spec.Horizon = 2 * 3600
	pods, err := Generate(spec)
	if err != nil {
		t.Fatal(err)
	}
	for _, run := range []Run{{Policy: allocator.BestFit}, {Policy: allocator.FirstFit}, {Policy: allocator.BestFit, Blind: true}} {
		opt := ChurnOptions{Options: Options{Policy: run.Policy, Blind: run.Blind, Seed: 5}, Horizon: spec.Horizon, SampleEvery: 600, RefEvery: 3}
		fast, err := Churn(f, pods, opt)
		if err != nil {
			t.Fatal(err)
		}
		opt.Exhaustive = true
		slow, err := Churn(f, pods, opt)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(fast, slow) {
			t.Fatalf("%s: shortcut changed the result", run.Name())
		}
		if fast.EndPending == 0 {
			t.Fatalf("%s: load 1.3 left nothing waiting", run.Name())
		}
	}
}
