package preempt

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"sort"
	"testing"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

// hold builds an evictable holder named default/<name>, UID uid-<name>.
func hold(name string, priority int32, charges map[int]uint64) Holder {
	return Holder{UID: "uid-" + name, Name: "default/" + name, Priority: priority, Charges: charges, Evictable: true}
}

// nodeOf builds a healthy node of GPUs of the given sizes whose Used is the
// holders' charges, plus the in-flight entries.
func nodeOf(sizes []uint64, holders []Holder, inflight ...allocator.InFlight) *allocator.Node {
	n := &allocator.Node{Name: "n1", GPUShare: true, InFlight: inflight}
	for i, s := range sizes {
		n.GPUs = append(n.GPUs, allocator.GPU{Index: i, Units: s, Healthy: true})
	}
	for _, h := range holders {
		for g, u := range h.Charges {
			n.GPUs[g].Used += u
		}
	}
	return n
}

// req builds a request of regular containers with the given units.
func req(units ...uint64) allocator.Request {
	r := allocator.Request{Pod: "default/preemptor"}
	for i, u := range units {
		r.Containers = append(r.Containers, gpushare.ContainerRequest{Name: fmt.Sprintf("c%d", i), Index: i, Units: u})
	}
	r.Units = gpushare.PodUnits(r.Containers)
	return r
}

func names(v Victims) []string {
	out := make([]string, 0, len(v.Pods))
	for _, h := range v.Pods {
		out = append(out, h.Name)
	}
	sort.Strings(out)
	return out
}

func fitsOn(n *allocator.Node, r allocator.Request, policy allocator.Policy) bool {
	_, unfit := allocator.Place(n, r, policy)
	return unfit == nil
}

// e2eNode is the e2e node: 8 GPUs of 80 units, every one full.
// Low pods have priority 100, mid pods 200.
func e2eNode() (*allocator.Node, []Holder) {
	const low, mid = 100, 200
	hs := []Holder{
		hold("a0", low, map[int]uint64{0: 40}), hold("a1", low, map[int]uint64{0: 40}),
		hold("b0", mid, map[int]uint64{1: 40}), hold("b1", mid, map[int]uint64{1: 40}),
		hold("c0", low, map[int]uint64{2: 20}), hold("c1", low, map[int]uint64{2: 20}),
		hold("c2", low, map[int]uint64{2: 20}), hold("c3", low, map[int]uint64{2: 20}),
		hold("d0", low, map[int]uint64{3: 40}), hold("d1", mid, map[int]uint64{3: 20}), hold("d2", mid, map[int]uint64{3: 20}),
	}
	for g := 4; g < 8; g++ {
		hs = append(hs, hold(fmt.Sprintf("e%d", g), mid, map[int]uint64{g: 80}))
	}
	return nodeOf([]uint64{80, 80, 80, 80, 80, 80, 80, 80}, hs), hs
}

func TestChooseE2ENode(t *testing.T) {
	for _, policy := range []allocator.Policy{allocator.BestFit, allocator.Spread, allocator.FirstFit} {
		t.Run(policy.String(), func(t *testing.T) {
			n, hs := e2eNode()
			for i, g := range n.GPUs {
				if g.Used != 80 {
					t.Fatalf("GPU %d used %d, want a full node", i, g.Used)
				}
			}
			// 80 units: exactly GPU 0's two low pods.
			v, ok := Choose(n, hs, req(80), 1000, policy)
			if !ok || !reflect.DeepEqual(names(v), []string{"default/a0", "default/a1"}) {
				t.Fatalf("80 units at 1000: ok %v victims %v, want GPU 0's a0 and a1", ok, names(v))
			}
			// 20 units: one 20-unit low pod of GPU 2 (cheapest: low, one pod, 20 units).
			v, ok = Choose(n, hs, req(20), 1000, policy)
			if !ok || len(v.Pods) != 1 || v.Pods[0].Priority != 100 || v.Pods[0].Charges[2] != 20 || len(v.Pods[0].Charges) != 1 {
				t.Fatalf("20 units at 1000: ok %v victims %+v, want one 20-unit pod of GPU 2", ok, v.Pods)
			}
			if got := names(v)[0]; got != "default/c0" {
				t.Fatalf("20 units: victim %s, want default/c0 (name breaks the tie)", got)
			}
			// Only the low pods are below 150: GPU 0's two still free 80 units.
			v, ok = Choose(n, hs, req(80), 150, policy)
			if !ok || !reflect.DeepEqual(names(v), []string{"default/a0", "default/a1"}) {
				t.Fatalf("80 units at 150: ok %v victims %v, want a0 and a1", ok, names(v))
			}
			// Nothing is below 100: equal priority is never a victim.
			if v, ok := Choose(n, hs, req(20), 100, policy); ok {
				t.Fatalf("20 units at 100: victims %v, want none possible", names(v))
			}
			// Bigger than any GPU: no eviction helps.
			if v, ok := Choose(n, hs, req(81), 1000, policy); ok {
				t.Fatalf("81 units: victims %v, want none possible", names(v))
			}
			// The input node is left as it was.
			if n2, _ := e2eNode(); !reflect.DeepEqual(n, n2) {
				t.Fatal("Choose modified its node")
			}
		})
	}
}

// TestChooseE2ENoLowGPU: with GPU 0 and GPU 2 half mid, no GPU's low pods
// free 80 units, so a priority-150 pod of 80 units has no victims, while one
// of 40 units takes a single 40-unit low pod.
func TestChooseE2ENoLowGPU(t *testing.T) {
	_, hs := e2eNode()
	for i := range hs {
		switch hs[i].Name {
		case "default/a1", "default/c2", "default/c3":
			hs[i].Priority = 200
		}
	}
	n := nodeOf([]uint64{80, 80, 80, 80, 80, 80, 80, 80}, hs)
	if v, ok := Choose(n, hs, req(80), 150, allocator.BestFit); ok {
		t.Fatalf("80 units at 150: victims %v, want none possible", names(v))
	}
	v, ok := Choose(n, hs, req(40), 150, allocator.BestFit)
	if !ok || len(v.Pods) != 1 || (v.Pods[0].Name != "default/a0" && v.Pods[0].Name != "default/d0") {
		t.Fatalf("40 units at 150: ok %v victims %v, want a0 or d0 alone", ok, names(v))
	}
	v, ok = Choose(n, hs, req(80), 1000, allocator.BestFit)
	if !ok || len(v.Pods) != 1 || v.Pods[0].Priority != 200 || on(v.Pods[0], -1) != 80 {
		t.Fatalf("80 units at 1000: ok %v victims %v, want one 80-unit mid pod", ok, names(v))
	}
}

func TestChooseNeverEvictsProtectedPods(t *testing.T) {
	pinned := hold("pinned", 1, map[int]uint64{0: 8})
	pinned.Evictable = false
	hs := []Holder{pinned, hold("low", 1, map[int]uint64{0: 8}), hold("equal", 500, map[int]uint64{1: 16})}
	n := nodeOf([]uint64{16, 16}, hs)
	// 16 units: GPU 0 cannot be emptied (pinned), so GPU 1's pod goes.
	v, ok := Choose(n, hs, req(16), 1000, allocator.BestFit)
	if !ok || !reflect.DeepEqual(names(v), []string{"default/equal"}) {
		t.Fatalf("at 1000: ok %v victims %v, want equal", ok, names(v))
	}
	// At 500, equal is not below: nothing frees 16 units.
	if v, ok := Choose(n, hs, req(16), 500, allocator.BestFit); ok {
		t.Fatalf("at 500: victims %v, want none possible", names(v))
	}
	// 8 units fit by evicting low alone; pinned never appears.
	v, ok = Choose(n, hs, req(8), 500, allocator.BestFit)
	if !ok || !reflect.DeepEqual(names(v), []string{"default/low"}) {
		t.Fatalf("8 units at 500: ok %v victims %v, want low", ok, names(v))
	}
	// Higher priority pods are never victims either.
	high := []Holder{hold("h0", 2000, map[int]uint64{0: 16}), hold("h1", 2000, map[int]uint64{1: 16})}
	if v, ok := Choose(nodeOf([]uint64{16, 16}, high), high, req(1), 1000, allocator.BestFit); ok {
		t.Fatalf("higher priority: victims %v", names(v))
	}
}

// TestChooseSpares: eviction order takes the lowest priority first (x), which
// frees too little; once y is evicted, x is spared.
func TestChooseSpares(t *testing.T) {
	hs := []Holder{hold("x", 1, map[int]uint64{0: 4}), hold("y", 2, map[int]uint64{0: 12})}
	n := nodeOf([]uint64{16}, hs)
	v, ok := Choose(n, hs, req(12), 1000, allocator.BestFit)
	if !ok || !reflect.DeepEqual(names(v), []string{"default/y"}) {
		t.Fatalf("ok %v victims %v, want y alone", ok, names(v))
	}
	// 13 units need both.
	v, ok = Choose(n, hs, req(13), 1000, allocator.BestFit)
	if !ok || !reflect.DeepEqual(names(v), []string{"default/x", "default/y"}) {
		t.Fatalf("13 units: ok %v victims %v, want x and y", ok, names(v))
	}
}

// TestChooseSplitHolder: a pod whose containers sit on two GPUs frees its
// charge on each GPU.
func TestChooseSplitHolder(t *testing.T) {
	split := hold("split", 1, map[int]uint64{0: 4, 1: 12})
	keep0, keep1 := hold("keep0", 5000, map[int]uint64{0: 12}), hold("keep1", 5000, map[int]uint64{1: 4})
	hs := []Holder{split, keep0, keep1}
	n := nodeOf([]uint64{16, 16}, hs)
	v, ok := Choose(n, hs, req(12), 1000, allocator.BestFit)
	if !ok || !reflect.DeepEqual(names(v), []string{"default/split"}) {
		t.Fatalf("12 units: ok %v victims %v, want split", ok, names(v))
	}
	// Evicting split leaves 4 free on GPU 0 and 12 on GPU 1: 13 never fits.
	if v, ok := Choose(n, hs, req(13), 1000, allocator.BestFit); ok {
		t.Fatalf("13 units: victims %v, want none possible", names(v))
	}
	// 4 units: a 6-unit pod on GPU 0 costs fewer units than split's 16 in all.
	small := hold("small", 1, map[int]uint64{0: 6})
	keep0 = hold("keep0", 5000, map[int]uint64{0: 6})
	hs = []Holder{split, small, keep0, keep1}
	n = nodeOf([]uint64{16, 16}, hs)
	v, ok = Choose(n, hs, req(6), 1000, allocator.BestFit)
	if !ok || !reflect.DeepEqual(names(v), []string{"default/small"}) {
		t.Fatalf("6 units: ok %v victims %v, want small (6 units, not split's 16)", ok, names(v))
	}
}

// TestChooseMultiGPU: a pod spanning two GPUs needs room on both; no single
// GPU's eviction gives it, the whole-node pass does.
func TestChooseMultiGPU(t *testing.T) {
	hs := []Holder{hold("a", 1, map[int]uint64{0: 12}), hold("b", 1, map[int]uint64{1: 12})}
	n := nodeOf([]uint64{16, 16}, hs)
	r := req(16)
	r.GPUs = gpushare.MultiGPU{Count: 2}
	if fitsOn(n, r, allocator.BestFit) {
		t.Fatal("the two-GPU pod fits before any eviction")
	}
	v, ok := Choose(n, hs, r, 1000, allocator.BestFit)
	if !ok || !reflect.DeepEqual(names(v), []string{"default/a", "default/b"}) {
		t.Fatalf("ok %v victims %v, want a and b", ok, names(v))
	}
	if !fitsOn(Without(n, v.Pods), r, allocator.BestFit) {
		t.Fatal("does not fit without the victims")
	}
	// Per GPU 8 units: a third GPU with 8 free makes one eviction enough.
	hs = append(hs, hold("keep", 5000, map[int]uint64{2: 8}))
	n = nodeOf([]uint64{16, 16, 16}, hs)
	v, ok = Choose(n, hs, r, 1000, allocator.BestFit)
	if !ok || len(v.Pods) != 1 || v.Pods[0].Name == "default/keep" {
		t.Fatalf("three GPUs: ok %v victims %v, want a or b alone", ok, names(v))
	}
}

// TestChooseHoldBack: an in-flight pod of the preemptor's container size
// forces the preemptor onto its GPU, so victims are chosen there; when the
// in-flight pod is itself a victim, the constraint goes with it.
func TestChooseHoldBack(t *testing.T) {
	flight := allocator.InFlight{Pod: "default/f", PodUnits: 8, Slots: []allocator.Slot{{Units: 8, GPUs: gpushare.NewGPUSet(3)}}}
	f := hold("f", 2000, map[int]uint64{3: 8})
	hs := []Holder{
		hold("z", 1, map[int]uint64{0: 16}),
		hold("w1", 2000, map[int]uint64{1: 16}), hold("w2", 2000, map[int]uint64{2: 16}),
		f, hold("g", 10, map[int]uint64{3: 8}),
	}
	n := nodeOf([]uint64{16, 16, 16, 16}, hs, flight)
	// Without the in-flight entry z (priority 1) would be the cheapest.
	free := Without(n, nil)
	free.InFlight = nil
	if v, ok := Choose(free, hs, req(8), 1000, allocator.BestFit); !ok || !reflect.DeepEqual(names(v), []string{"default/z"}) {
		t.Fatalf("no hold-back: ok %v victims %v, want z", ok, names(v))
	}
	v, ok := Choose(n, hs, req(8), 1000, allocator.BestFit)
	if !ok || !reflect.DeepEqual(names(v), []string{"default/g"}) {
		t.Fatalf("hold-back: ok %v victims %v, want g on GPU 3", ok, names(v))
	}
	if p, unfit := allocator.Place(Without(n, v.Pods), req(8), allocator.BestFit); unfit != nil || p.Home != 3 {
		t.Fatalf("after evicting g: %+v %v, want GPU 3", p, unfit)
	}
	// A request of another size is not held: z is cheapest again.
	if v, ok := Choose(n, hs, req(16), 1000, allocator.BestFit); !ok || !reflect.DeepEqual(names(v), []string{"default/z"}) {
		t.Fatalf("16 units: ok %v victims %v, want z", ok, names(v))
	}

	// The in-flight pod itself is the cheapest victim: evicting it lifts the
	// constraint, and the preemptor fits on the empty GPU 0.
	f = hold("f", 1, map[int]uint64{1: 8})
	flight.Slots[0].GPUs = gpushare.NewGPUSet(1)
	hs = []Holder{f, hold("g", 2000, map[int]uint64{1: 8})}
	n = nodeOf([]uint64{16, 16}, hs, flight)
	if fitsOn(n, req(8), allocator.BestFit) {
		t.Fatal("fits despite the hold-back")
	}
	v, ok = Choose(n, hs, req(8), 1000, allocator.BestFit)
	if !ok || !reflect.DeepEqual(names(v), []string{"default/f"}) {
		t.Fatalf("in-flight victim: ok %v victims %v, want f", ok, names(v))
	}
	if w := Without(n, v.Pods); len(w.InFlight) != 0 {
		t.Fatalf("in-flight entries left: %+v", w.InFlight)
	}
	// Not evictable (assumed): nothing else helps.
	hs[0].Evictable = false
	if v, ok := Choose(n, hs, req(8), 1000, allocator.BestFit); ok {
		t.Fatalf("unevictable in-flight pod: victims %v", names(v))
	}
}

func TestWithout(t *testing.T) {
	a := hold("a", 1, map[int]uint64{0: 4, 1: 6})
	b := hold("b", 1, map[int]uint64{1: 20, 7: 5}) // more than GPU 1 holds; GPU 7 absent
	flights := []allocator.InFlight{
		{Pod: "default/a", PodUnits: 10, Slots: []allocator.Slot{{Units: 10, GPUs: gpushare.NewGPUSet(0)}}},
		{Pod: "default/other", PodUnits: 2, Slots: []allocator.Slot{{Units: 2, GPUs: gpushare.NewGPUSet(1)}}},
	}
	n := &allocator.Node{Name: "n1", GPUShare: true, InFlight: flights, GPUs: []allocator.GPU{
		{Index: 0, Units: 16, Used: 10, Healthy: true},
		{Index: 1, Units: 16, Used: 12, Healthy: true},
		{Index: 2, Units: 16, Used: 3, Healthy: false},
	}}
	before := &allocator.Node{Name: n.Name, GPUShare: true, GPUs: slices.Clone(n.GPUs), InFlight: slices.Clone(n.InFlight)}

	w := Without(n, []Holder{a, b})
	if !reflect.DeepEqual(n, before) {
		t.Fatalf("Without modified its input: %+v", n)
	}
	want := []allocator.GPU{
		{Index: 0, Units: 16, Used: 6, Healthy: true},
		{Index: 1, Units: 16, Used: 0, Healthy: true},
		{Index: 2, Units: 16, Used: 3, Healthy: false},
	}
	if !reflect.DeepEqual(w.GPUs, want) {
		t.Fatalf("GPUs = %+v, want %+v", w.GPUs, want)
	}
	if len(w.InFlight) != 1 || w.InFlight[0].Pod != "default/other" {
		t.Fatalf("in-flight = %+v, want default/other alone", w.InFlight)
	}
	if w.Name != "n1" || !w.GPUShare {
		t.Fatalf("node fields lost: %+v", w)
	}
	// Without nothing: an equal node, not the same slices.
	w = Without(n, nil)
	if !reflect.DeepEqual(w.GPUs, n.GPUs) || !reflect.DeepEqual(w.InFlight, n.InFlight) {
		t.Fatalf("Without(nil) = %+v", w)
	}
	w.GPUs[0].Used = 99
	if n.GPUs[0].Used != 10 {
		t.Fatal("Without shares its GPUs with its input")
	}
}

// randomCase builds a node whose Used is exactly its holders' charges, some
// holders in flight, and a request.
func randomCase(rng *rand.Rand) (*allocator.Node, []Holder, allocator.Request, int32, allocator.Policy) {
	sizes := []uint64{8, 16, 24}
	ng := 1 + rng.IntN(4)
	var gs []uint64
	for range ng {
		gs = append(gs, sizes[rng.IntN(len(sizes))])
	}
	used := make([]uint64, ng)
	var hs []Holder
	var flights []allocator.InFlight
	for i := range rng.IntN(9) {
		charges := map[int]uint64{}
		parts := 1
		if ng > 1 && rng.IntN(4) == 0 {
			parts = 2
		}
		for _, g := range rng.Perm(ng)[:parts] {
			room := gs[g] - used[g]
			if room == 0 {
				continue
			}
			u := 1 + rng.Uint64N(room)
			charges[g] = u
			used[g] += u
		}
		if len(charges) == 0 {
			continue
		}
		h := hold(fmt.Sprintf("p%d", i), int32(rng.IntN(5))*100, charges)
		h.Evictable = rng.IntN(5) != 0
		hs = append(hs, h)
		if rng.IntN(4) == 0 {
			f := allocator.InFlight{Pod: h.Name}
			for g, u := range charges {
				f.PodUnits += u
				f.Slots = append(f.Slots, allocator.Slot{Units: u, GPUs: gpushare.NewGPUSet(g)})
			}
			flights = append(flights, f)
		}
	}
	n := nodeOf(gs, hs, flights...)
	if rng.IntN(6) == 0 {
		n.GPUs[rng.IntN(ng)].Healthy = false
	}
	var r allocator.Request
	switch rng.IntN(4) {
	case 0:
		r = req(1+rng.Uint64N(8), 1+rng.Uint64N(8)) // may split
	case 1:
		if ng >= 2 {
			r = req(2 * (1 + rng.Uint64N(10)))
			r.GPUs = gpushare.MultiGPU{Count: 2}
			break
		}
		fallthrough
	default:
		r = req(1 + rng.Uint64N(24))
	}
	policies := []allocator.Policy{allocator.BestFit, allocator.Spread, allocator.FirstFit}
	return n, hs, r, int32(rng.IntN(6)) * 100, policies[rng.IntN(len(policies))]
}

func TestChooseProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(16, 2))
	oks, noes := 0, 0
	for i := range 20000 {
		n, hs, r, prio, policy := randomCase(rng)
		desc := func() string {
			return fmt.Sprintf("case %d: node %+v holders %+v request %+v priority %d policy %s", i, n, hs, r, prio, policy)
		}
		if fitsOn(n, r, policy) {
			continue // the server asks only when the pod does not fit already
		}
		v, ok := Choose(n, hs, r, prio, policy)
		if !ok {
			noes++
			var pool []Holder
			for _, h := range hs {
				if h.Evictable && h.Priority < prio {
					pool = append(pool, h)
				}
			}
			if fitsOn(Without(n, pool), r, policy) {
				t.Fatalf("%s: not ok, but it fits without every evictable lower-priority pod", desc())
			}
			continue
		}
		oks++
		if !fitsOn(Without(n, v.Pods), r, policy) {
			t.Fatalf("%s: victims %v, and it does not fit without them", desc(), names(v))
		}
		seen := map[string]bool{}
		for j, h := range v.Pods {
			if !h.Evictable || h.Priority >= prio {
				t.Fatalf("%s: victim %+v is not evictable below %d", desc(), h, prio)
			}
			if seen[h.UID] {
				t.Fatalf("%s: victim %s twice", desc(), h.UID)
			}
			seen[h.UID] = true
			if !slices.ContainsFunc(hs, func(x Holder) bool { return x.UID == h.UID }) {
				t.Fatalf("%s: victim %s is no holder", desc(), h.UID)
			}
			rest := slices.Delete(slices.Clone(v.Pods), j, j+1)
			if fitsOn(Without(n, rest), r, policy) {
				t.Fatalf("%s: victims %v are not minimal: fits without %s", desc(), names(v), h.Name)
			}
		}
	}
	// The generator must exercise both answers.
	if oks < 1000 || noes < 1000 {
		t.Fatalf("ok %d, not ok %d: the generator is lopsided", oks, noes)
	}
}
