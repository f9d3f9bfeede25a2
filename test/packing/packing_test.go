package packing

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/gpushare/gpushare/extender/allocator"
)

// smallSpec is a quick workload for the small fleet.
func smallSpec(m Mix, seed uint64, load float64) (Fleet, GenSpec) {
	f := SmallFleet()
	return f, GenSpec{Mix: m, Seed: seed, CapacityGiB: f.CapacityGiB(), Load: load, Horizon: 20 * m.Life.Mean}
}

func allRuns() []Run {
	return append(Runs(), Run{Policy: allocator.Spread, Ties: TieRandom}, Run{Policy: allocator.FirstFit, Ties: TieRandom})
}

func TestFFDHandChecked(t *testing.T) {
	tests := []struct {
		name        string
		bins, items []uint64
		want        FFDResult
	}{
		{name: "nothing", bins: []uint64{10}, want: FFDResult{}},
		// 7 -> bin0 (3 left), 5 -> bin1 (5 left), 4 -> bin1 (1 left), 3 -> bin0 (0 left), 1 -> bin1 (0 left).
		{name: "perfect", bins: []uint64{10, 10}, items: []uint64{3, 5, 1, 7, 4}, want: FFDResult{PlacedGiB: 20, Placed: 5, BinsUsed: 2}},
		// Sorted 6,6,6,2,2: 6 -> bin0, 6 -> bin1, 6 -> none, 2 -> bin0, 2 -> bin0 (0 left).
		{name: "one left out, smaller ones still placed", bins: []uint64{10, 10}, items: []uint64{2, 6, 6, 2, 6}, want: FFDResult{PlacedGiB: 16, Placed: 4, Unplaced: 1, BinsUsed: 2}},
		// Decreasing order beats arrival order: first fit in arrival order (1,1,1,1 then 8) would fail the 8.
		{name: "decreasing", bins: []uint64{8, 4}, items: []uint64{1, 1, 1, 1, 8}, want: FFDResult{PlacedGiB: 12, Placed: 5, BinsUsed: 2}},
		// Bins are tried in order even when a later one fits better.
		{name: "first bin, not best bin", bins: []uint64{80, 24}, items: []uint64{24, 60}, want: FFDResult{PlacedGiB: 84, Placed: 2, BinsUsed: 2}},
		{name: "too big for every bin", bins: []uint64{16, 16}, items: []uint64{17, 4}, want: FFDResult{PlacedGiB: 4, Placed: 1, Unplaced: 1, BinsUsed: 1}},
		// 3,3 -> bin0; 2,2,2 -> bin1.
		{name: "exact", bins: []uint64{6, 6}, items: []uint64{2, 3, 2, 3, 2}, want: FFDResult{PlacedGiB: 12, Placed: 5, BinsUsed: 2}},
		// FFD is not optimal: 4,4 -> bin0 (1 left); 3,3,2 -> bin1 (1 left); the last 2 fits nowhere,
		// though 4+3+2 twice fills both bins.
		{name: "not optimal", bins: []uint64{9, 9}, items: []uint64{4, 4, 3, 3, 2, 2}, want: FFDResult{PlacedGiB: 16, Placed: 5, Unplaced: 1, BinsUsed: 2}},
		// 5 -> bin0, 5 -> bin1, 4 -> none (1 left each)... 1 -> bin0.
		{name: "holes of one", bins: []uint64{6, 6}, items: []uint64{5, 5, 4, 1}, want: FFDResult{PlacedGiB: 11, Placed: 3, Unplaced: 1, BinsUsed: 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := FFD(tt.bins, tt.items); got != tt.want {
				t.Fatalf("FFD(%v, %v) = %+v, want %+v", tt.bins, tt.items, got, tt.want)
			}
		})
	}
}

func TestFFDPrefix(t *testing.T) {
	// Two bins of 10: 4,4,4 pack (4+4, 4); 4,4,4,9 do not (9 needs a bin).
	k, r := FFDPrefix([]uint64{10, 10}, []uint64{4, 4, 4, 9, 1})
	if k != 3 || r.PlacedGiB != 12 || r.Unplaced != 0 {
		t.Fatalf("FFDPrefix = %d, %+v; want 3 pods, 12 GiB", k, r)
	}
	if k, r := FFDPrefix([]uint64{10}, []uint64{5, 5}); k != 2 || r.PlacedGiB != 10 {
		t.Fatalf("all fit: %d %+v", k, r)
	}
	if k, _ := FFDPrefix([]uint64{4}, []uint64{5, 1}); k != 0 {
		t.Fatalf("first too big: %d", k)
	}
}

func TestFragmented(t *testing.T) {
	free := []uint64{0, 3, 7, 12, 1}
	tests := []struct {
		smallest, want uint64
	}{
		{0, 0},               // nothing pending: nothing wanted
		{1, 0},               // a 1 GiB pod uses any hole
		{2, 1},               // the 1 GiB hole
		{4, 1 + 3},           // holes of 1 and 3
		{8, 1 + 3 + 7},       // and 7
		{13, 1 + 3 + 7 + 12}, // all the free memory
	}
	for _, tt := range tests {
		if got := Fragmented(free, tt.smallest); got != tt.want {
			t.Errorf("Fragmented(%v, %d) = %d, want %d", free, tt.smallest, got, tt.want)
		}
	}
	sizes := SizeShares([]Pod{{GiB: 2}, {GiB: 8}, {GiB: 8}, {GiB: 4}})
	if want := []SizeShare{{2, 0.25}, {4, 0.25}, {8, 0.5}}; !reflect.DeepEqual(sizes, want) {
		t.Fatalf("SizeShares = %v, want %v", sizes, want)
	}
	// 2 GiB pods cannot use the 1; 4 GiB pods the 1 and 3; 8 GiB pods the 1, 3 and 7.
	if got, want := Stranded(free, sizes), 0.25*1+0.25*4+0.5*11; math.Abs(got-want) > 1e-9 {
		t.Fatalf("Stranded = %v, want %v", got, want)
	}
}

func TestFillHandChecked(t *testing.T) {
	f := Fleet{Name: "2x1x10", Types: []NodeType{{Count: 2, GPUs: 1, GiB: 10}}}
	pods := []Pod{{ID: 0, GiB: 6, Life: 1}, {ID: 1, GiB: 3, Life: 1}, {ID: 2, GiB: 5, Life: 1}, {ID: 3, GiB: 4, Life: 1}}
	// Best fit: 6 -> n0 (4 left); 3 -> n0, the fuller card (1 left); 5 -> n1 (5 left); 4 -> n1 (1 left). All fit.
	r, err := Fill(f, pods, Options{Policy: allocator.BestFit})
	if err != nil || !r.Complete || r.PlacedGiB != 18 || r.CardsOpened != 2 {
		t.Fatalf("bestfit fill = %+v, %v", r, err)
	}
	// Spread: 6 -> n0; 3 -> n1 (emptier); 5 -> n1 (7 free vs 4); 4 -> n0 (4 free vs 2): all fit too.
	// With a 5 next, spread has 0 and 2 left, best fit 1 and 1: both fail at 5.
	pods = append(pods, Pod{ID: 4, GiB: 5, Life: 1})
	r, err = Fill(f, pods, Options{Policy: allocator.Spread})
	if err != nil || r.Complete || r.Pods != 4 || r.FailedGiB != 5 || r.LargestFree != 2 {
		t.Fatalf("spread fill = %+v, %v", r, err)
	}
	// Spread strands more than best fit: 4,4 then 6 fits best fit (4+4 on n0), not spread (4 | 4).
	pods = []Pod{{ID: 0, GiB: 4, Life: 1}, {ID: 1, GiB: 4, Life: 1}, {ID: 2, GiB: 8, Life: 1}}
	if r, _ := Fill(f, pods, Options{Policy: allocator.BestFit}); !r.Complete {
		t.Fatalf("bestfit should place 4,4,8: %+v", r)
	}
	if r, _ := Fill(f, pods, Options{Policy: allocator.Spread}); r.Complete || r.Pods != 2 {
		t.Fatalf("spread should stop at the 8: %+v", r)
	}
	if r := FillReference(f, pods); !r.Complete || r.PlacedGiB != 16 {
		t.Fatalf("FFD reference = %+v", r)
	}
}

// checkBookkeeping replays with the invariants checked at every step.
func TestChurnBookkeeping(t *testing.T) {
	for _, m := range []Mix{UniformMix(), NotebookMix()} {
		f, spec := smallSpec(m, 11, 1.3)
		pods, err := Generate(spec)
		if err != nil {
			t.Fatal(err)
		}
		for _, run := range allRuns() {
			// Drain: every departure runs, so every pod is eventually placed and gone.
			res, err := Churn(f, pods, ChurnOptions{Options: Options{Policy: run.Policy, Ties: run.Ties, Seed: 1}, SampleEvery: 600})
			if err != nil {
				t.Fatalf("%s %s: %v", m.Name, run.Name(), err)
			}
			if res.Placements != len(pods) || res.Departures != len(pods) || res.EndRunning != 0 || res.EndPending != 0 || res.EndAllocatedGiB != 0 {
				t.Fatalf("%s %s: drained run left %+v", m.Name, run.Name(), res)
			}
			var sawPending bool
			for _, s := range res.Samples {
				if s.AllocatedGiB > res.Capacity || s.FragmentedGiB+s.AllocatedGiB > res.Capacity {
					t.Fatalf("%s %s: sample %+v over capacity", m.Name, run.Name(), s)
				}
				sawPending = sawPending || s.Pending > 0
			}
			if !sawPending {
				t.Fatalf("%s %s: load 1.3 never left a pod waiting", m.Name, run.Name())
			}
		}
	}
}

func TestClusterRefusesOvercommit(t *testing.T) {
	c, err := newCluster(SmallFleet(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.apply(placed{node: 0, charges: map[int]uint64{0: 20}}, true); err != nil {
		t.Fatal(err)
	}
	if err := c.apply(placed{node: 0, charges: map[int]uint64{0: 5}}, true); !errors.Is(err, ErrBookkeeping) {
		t.Fatalf("25 GiB on a 24 GiB GPU: %v", err)
	}
	if err := c.apply(placed{node: 0, charges: map[int]uint64{0: 21}}, false); !errors.Is(err, ErrBookkeeping) {
		t.Fatalf("releasing more than charged: %v", err)
	}
	if err := c.apply(placed{node: 0, charges: map[int]uint64{0: 20}}, false); err != nil || c.allocated != 0 || c.cards != 0 || c.usedSum() != 0 {
		t.Fatalf("release: %v, allocated %d, cards %d", err, c.allocated, c.cards)
	}
}

// Every GPU stays within its size at every step: checked by the cluster
// itself (apply fails), and here against the placements it makes.
func TestPlacementsFitGPUs(t *testing.T) {
	f := MixedFleet()
	spec := GenSpec{Mix: BimodalMix(), Seed: 3, CapacityGiB: f.CapacityGiB(), Load: 1.2, Horizon: 2 * 1800}
	pods, err := Generate(spec)
	if err != nil {
		t.Fatal(err)
	}
	for _, run := range allRuns() {
		c, err := newCluster(f, Options{Policy: run.Policy, Ties: run.Ties, Seed: 9})
		if err != nil {
			t.Fatal(err)
		}
		var held []placed
		for i, p := range pods {
			pl, ok, err := c.place(p)
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				held = append(held, pl)
			}
			for _, n := range c.nodes {
				for _, g := range n.GPUs {
					if g.Used > g.Units {
						t.Fatalf("%s: GPU %d of %s has %d of %d", run.Name(), g.Index, n.Name, g.Used, g.Units)
					}
				}
			}
			if i%3 == 2 && len(held) > 0 { // some departures, oldest first
				if err := c.apply(held[0], false); err != nil {
					t.Fatal(err)
				}
				held = held[1:]
			}
		}
		for _, pl := range held {
			if err := c.apply(pl, false); err != nil {
				t.Fatal(err)
			}
		}
		if c.allocated != 0 || c.usedSum() != 0 || c.cards != 0 {
			t.Fatalf("%s: after every departure %d GiB, %d cards still charged", run.Name(), c.usedSum(), c.cards)
		}
	}
}

// The shortcuts (skipping nodes and pods that cannot fit) change nothing.
func TestShortcutsExact(t *testing.T) {
	f, spec := smallSpec(UniformMix(), 21, 1.3)
	spec.Horizon = 8 * 3600
	pods, err := Generate(spec)
	if err != nil {
		t.Fatal(err)
	}
	for _, run := range allRuns() {
		opt := ChurnOptions{Options: Options{Policy: run.Policy, Ties: run.Ties, Seed: 5}, Horizon: spec.Horizon, SampleEvery: 300, RefEvery: 3}
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
	}
}

func TestDeterministic(t *testing.T) {
	s := Scenario{Name: "t", Fleet: SmallFleet(), Warmup: 4 * 3600, SampleEvery: 900, RefEvery: 2}
	_, s.Gen = smallSpec(BimodalMix(), 8, 1.2)
	s.Gen.Mix.Sizes[1] = SizeBand{Weight: 0.1, Min: 20, Max: 20} // the small fleet's cards are 24 GiB
	pods, err := Generate(s.Gen)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := Generate(s.Gen)
	if !reflect.DeepEqual(pods, again) {
		t.Fatal("same seed, different workload")
	}
	if other, _ := Generate(GenSpec{Mix: s.Gen.Mix, Seed: 9, CapacityGiB: s.Gen.CapacityGiB, Load: s.Gen.Load, Horizon: s.Gen.Horizon}); reflect.DeepEqual(pods, other) {
		t.Fatal("different seeds, same workload")
	}
	a, err := RunScenario(s, pods, Runs())
	if err != nil {
		t.Fatal(err)
	}
	b, err := RunScenario(s, pods, Runs())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a, b) {
		t.Fatal("same workload, different result")
	}
	// Through a file and back: the same pods, the same result.
	var buf bytes.Buffer
	if err := WriteWorkload(&buf, s.Gen, pods); err != nil {
		t.Fatal(err)
	}
	spec, back, err := ReadWorkload(&buf)
	if err != nil || !reflect.DeepEqual(spec, s.Gen) || !reflect.DeepEqual(back, pods) {
		t.Fatalf("round trip: %v", err)
	}
	for _, c := range a.Churn {
		if c.Steady.RefSamples == 0 || c.Steady.RatioFFD <= 0 || c.Steady.RatioBound <= 0 || c.Steady.RatioBound > 1+1e-9 {
			t.Fatalf("%s: steady %+v", c.Run, c.Steady)
		}
	}
}

func TestGenerate(t *testing.T) {
	f := LargeFleet()
	spec := GenSpec{Mix: UniformMix(), Seed: 1, CapacityGiB: f.CapacityGiB(), Load: 0.8, Horizon: 3600}
	pods, err := Generate(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckWorkload(pods); err != nil {
		t.Fatal(err)
	}
	// Expected arrivals: 0.8 x 64000 GiB / (8.5 GiB x 3600 s) x 3600 s = 6024; Poisson sd ~ 78.
	if n := len(pods); n < 5700 || n > 6350 {
		t.Fatalf("%d pods, want about 6024", n)
	}
	var sum float64
	for _, p := range pods {
		if p.GiB < 1 || p.GiB > 16 {
			t.Fatalf("pod %+v outside 1-16 GiB", p)
		}
		sum += float64(p.GiB)
	}
	if mean := sum / float64(len(pods)); math.Abs(mean-8.5) > 0.3 {
		t.Fatalf("mean size %v, want about 8.5", mean)
	}
	if _, err := Generate(GenSpec{Mix: Mix{Name: "bad"}, CapacityGiB: 1, Load: 1, Horizon: 1}); err == nil {
		t.Fatal("a mix without sizes generated")
	}
}

func TestReadWorkloadRejects(t *testing.T) {
	for name, in := range map[string]string{
		"empty":         "",
		"no header":     `{"id":0,"at":0,"gib":1,"life":1}` + "\n",
		"ids":           `{"format":"gpushare-packing-workload/v1"}` + "\n" + `{"id":1,"at":0,"gib":1,"life":1}` + "\n",
		"out of order":  `{"format":"gpushare-packing-workload/v1"}` + "\n" + `{"id":0,"at":5,"gib":1,"life":1}` + "\n" + `{"id":1,"at":4,"gib":1,"life":1}` + "\n",
		"zero size":     `{"format":"gpushare-packing-workload/v1"}` + "\n" + `{"id":0,"at":0,"gib":0,"life":1}` + "\n",
		"not json":      `{"format":"gpushare-packing-workload/v1"}` + "\nnope\n",
		"zero lifetime": `{"format":"gpushare-packing-workload/v1"}` + "\n" + `{"id":0,"at":0,"gib":1,"life":0}` + "\n",
	} {
		if _, _, err := ReadWorkload(strings.NewReader(in)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestScenariosValid(t *testing.T) {
	seen := map[string]bool{}
	for _, s := range Scenarios() {
		if err := s.Validate(); err != nil {
			t.Error(err)
		}
		if seen[s.Name] {
			t.Errorf("two scenarios named %s", s.Name)
		}
		seen[s.Name] = true
	}
}
