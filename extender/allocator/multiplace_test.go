package allocator

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

// Scores of the two-island node: NVLink pairs far above PCIe.
const (
	islandNVScore   = 200
	islandNVLinks   = 2
	islandPCIeScore = 20
)

// islandNode is a node of four 16-unit GPUs with the given used units, in
// two NVLink islands {0,1} and {2,3}, PCIe between the islands.
func islandNode(used ...uint64) *Node {
	g := gpusOf(repeatUnits(4, 16), used)
	n := node(g)
	n.Links = NewLinkScores(g, linksBy(4, func(a, b int) (int, int) {
		if a/2 == b/2 {
			return islandNVScore, islandNVLinks
		}
		return islandPCIeScore, 0
	}))
	return n
}

// multi makes r a multi-GPU request of count GPUs.
func multi(r Request, count int, required bool) Request {
	r.GPUs = gpushare.MultiGPU{Count: count, LinksRequired: required}
	return r
}

// placeSet places r under policy and fails the test unless it is a
// multi-GPU placement; it returns the set.
func placeSet(t *testing.T, n *Node, r Request, policy Policy) Placement {
	t.Helper()
	p, unfit := Place(n, r, policy)
	if unfit != nil {
		t.Fatalf("unfit: %+v", unfit)
	}
	if p.Set == 0 || p.Split || p.Home != p.Set.First() {
		t.Fatalf("placement %+v is not a multi-GPU placement homed on its first GPU", p)
	}
	return p
}

func TestPlaceMultiIslands(t *testing.T) {
	tests := []struct {
		name     string
		used     []uint64
		req      Request
		policy   Policy
		want     gpushare.GPUSet
		reason   string // substring, when it must not fit
		unresolv bool
	}{
		{name: "empty node: the lowest NVLink pair", used: []uint64{0, 0, 0, 0}, req: multi(req(8), 2, false), want: gpushare.NewGPUSet(0, 1)},
		{name: "spread does not change the set", used: []uint64{0, 0, 0, 0}, req: multi(req(8), 2, false), policy: Spread, want: gpushare.NewGPUSet(0, 1)},
		{name: "firstfit does not change the set", used: []uint64{0, 0, 0, 0}, req: multi(req(8), 2, false), policy: FirstFit, want: gpushare.NewGPUSet(0, 1)},
		{name: "GPU 0 too full: the other island", used: []uint64{14, 0, 0, 0}, req: multi(req(8), 2, false), want: gpushare.NewGPUSet(2, 3)},
		{name: "GPU 0 too full, spread: the other island", used: []uint64{14, 0, 0, 0}, req: multi(req(8), 2, false), policy: Spread, want: gpushare.NewGPUSet(2, 3)},
		{name: "links before best fit", used: []uint64{0, 10, 10, 0}, req: multi(req(8), 2, false), want: gpushare.NewGPUSet(0, 1)},
		{name: "best fit among NVLink pairs", used: []uint64{2, 2, 8, 8}, req: multi(req(8), 2, false), want: gpushare.NewGPUSet(2, 3)},
		{name: "preferred falls back to PCIe", used: []uint64{14, 0, 14, 0}, req: multi(req(8), 2, false), want: gpushare.NewGPUSet(1, 3)},
		{name: "required takes a free NVLink pair", used: []uint64{14, 0, 0, 0}, req: multi(req(8), 2, true), want: gpushare.NewGPUSet(2, 3)},
		{name: "required without a free NVLink pair", used: []uint64{14, 0, 14, 0}, req: multi(req(8), 2, true), reason: "NVLink"},
		{name: "required: no NVLink four", used: []uint64{0, 0, 0, 0}, req: multi(req(8), 4, true), reason: "NVLink", unresolv: true},
		{name: "four GPUs: all of them", used: []uint64{0, 0, 0, 0}, req: multi(req(8), 4, false), want: gpushare.NewGPUSet(0, 1, 2, 3)},
		{name: "more GPUs than the node has", used: []uint64{0, 0, 0, 0}, req: multi(req(8), 8, false), reason: "the node has 4", unresolv: true},
		{name: "more per GPU than any GPU holds", used: []uint64{0, 0, 0, 0}, req: multi(req(40), 2, false), reason: "units on each of 2 GPUs", unresolv: true},
		{name: "no pair with room", used: []uint64{14, 14, 14, 0}, req: multi(req(8), 2, false), reason: "no 2 GPUs with 4 free units each"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := islandNode(tt.used...)
			if tt.reason != "" {
				p, unfit := Place(n, tt.req, tt.policy)
				if unfit == nil {
					t.Fatalf("placed on %v, want unfit %q", p.Set, tt.reason)
				}
				if !strings.Contains(unfit.Reason, tt.reason) || unfit.Unresolvable != tt.unresolv {
					t.Fatalf("unfit = %+v, want reason containing %q, unresolvable %v", unfit, tt.reason, tt.unresolv)
				}
				if Score(n, tt.req, tt.policy) != 0 {
					t.Fatal("an unfit node scored above 0")
				}
				return
			}
			p := placeSet(t, n, tt.req, tt.policy)
			if p.Set != tt.want {
				t.Fatalf("set %v, want %v", p.Set, tt.want)
			}
			if p.DevUnits != 16 {
				t.Fatalf("DevUnits %d, want 16", p.DevUnits)
			}
			assertNoOvercommit(t, n, tt.req, p)
		})
	}
}

func TestPlaceMultiCharges(t *testing.T) {
	tests := []struct {
		name string
		req  Request
		used []uint64
		want map[int]uint64
	}{
		{name: "one container: units / count on each GPU", req: multi(req(8), 2, false), used: []uint64{0, 0, 0, 0}, want: map[int]uint64{0: 4, 1: 4}},
		{name: "two containers add up per GPU", req: multi(req(8, 4), 2, false), used: []uint64{0, 0, 0, 0}, want: map[int]uint64{0: 6, 1: 6}},
		{name: "an init peak above the regular containers", req: multi(withInit(req(8), 12, false), 2, false), used: []uint64{11, 0, 0, 0}, want: map[int]uint64{2: 6, 3: 6}},
		{name: "a sidecar beside the regular containers", req: multi(withInit(req(8), 4, true), 2, false), used: []uint64{0, 0, 0, 0}, want: map[int]uint64{0: 6, 1: 6}},
		{name: "four GPUs", req: multi(req(16, 8), 4, false), used: []uint64{0, 0, 0, 0}, want: map[int]uint64{0: 6, 1: 6, 2: 6, 3: 6}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := islandNode(tt.used...)
			p := placeSet(t, n, tt.req, BestFit)
			got := Charges(tt.req, p)
			if !maps.Equal(got, tt.want) {
				t.Fatalf("charges %v, want %v", got, tt.want)
			}
			var sum uint64
			for _, u := range got {
				if u != tt.req.Units/uint64(tt.req.GPUs.Count) {
					t.Fatalf("charges %v: not pod units %d / %d on each GPU", got, tt.req.Units, tt.req.GPUs.Count)
				}
				sum += u
			}
			if sum != tt.req.Units {
				t.Fatalf("charges %v sum to %d, pod asks %d", got, sum, tt.req.Units)
			}
			assertNoOvercommit(t, n, tt.req, p)
			// Every container, init ones included, runs on the whole set.
			for _, s := range Slots(tt.req, p) {
				if s.GPUs != p.Set {
					t.Fatalf("slot %+v not on the set %v", s, p.Set)
				}
			}
		})
	}
}

func TestPlaceMultiAssignmentRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		req  Request
		used []uint64
	}{
		{"pair", multi(req(8, 4), 2, false), []uint64{14, 0, 0, 0}},
		{"four", multi(req(8), 4, false), []uint64{0, 0, 0, 0}},
		{"with an init container", multi(withInit(req(6), 2, false), 2, false), []uint64{0, 0, 0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := islandNode(tc.used...)
			p := placeSet(t, n, tc.req, BestFit)
			a := p.Assignment(tc.req, 42)
			if a.GPUIndex != p.Set.First() || a.PodUnits != tc.req.Units || a.DevUnits != p.DevUnits || a.AssumeTime != 42 {
				t.Fatalf("assignment %+v: want index %d (the set's first), pod units %d, dev units %d", a, p.Set.First(), tc.req.Units, p.DevUnits)
			}
			want := gpushare.Allocation{}
			for _, c := range tc.req.Containers {
				if c.Init {
					continue
				}
				per := gpushare.GPUUnits{}
				for _, g := range p.Set.Indices() {
					per[g] = c.Units / uint64(tc.req.GPUs.Count)
				}
				want[c.Index] = per
			}
			if !reflect.DeepEqual(a.Allocation, want) {
				t.Fatalf("allocation %v, want %v", a.Allocation, want)
			}
			enc, err := a.Encode()
			if err != nil {
				t.Fatal(err)
			}
			dec, ok, err := gpushare.DecodePodAssignment(enc)
			if err != nil || !ok {
				t.Fatalf("decode: %v %v", ok, err)
			}
			for name, as := range map[string]gpushare.PodAssignment{"assignment": a, "decoded": dec} {
				back, err := PlacementFromAssignment(as, tc.req)
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				if !reflect.DeepEqual(back, p) {
					t.Fatalf("%s round trip = %+v, want %+v", name, back, p)
				}
				if got := Charges(tc.req, back); !maps.Equal(got, Charges(tc.req, p)) {
					t.Fatalf("%s: charges %v after the round trip, %v before", name, got, Charges(tc.req, p))
				}
			}
		})
	}
}

func TestPlaceMultiUnhealthy(t *testing.T) {
	n := islandNode(0, 0, 0, 0)
	n.GPUs[1].Healthy = false
	r := multi(req(8), 2, false)
	p := placeSet(t, n, r, BestFit)
	if p.Set != gpushare.NewGPUSet(2, 3) {
		t.Fatalf("set %v, want 2,3 (GPU 1 is unhealthy)", p.Set)
	}
	n.GPUs[3].Healthy = false
	p = placeSet(t, n, r, BestFit)
	if p.Set != gpushare.NewGPUSet(0, 2) {
		t.Fatalf("set %v, want 0,2 (GPUs 1 and 3 are unhealthy)", p.Set)
	}
	if _, unfit := Place(n, multi(req(8), 2, true), BestFit); unfit == nil || !strings.Contains(unfit.Reason, "NVLink") || !unfit.Unresolvable {
		t.Fatalf("required with only a PCIe pair healthy: %+v; want unresolvable naming NVLink", unfit)
	}
	if _, unfit := Place(n, multi(req(12), 3, false), BestFit); unfit == nil || !unfit.Unresolvable {
		t.Fatalf("three GPUs with two healthy: %+v; want unresolvable", unfit)
	}
}

func TestPlaceMultiTiers(t *testing.T) {
	mps, none := gpushare.IsolationMPS, gpushare.IsolationNone
	// Islands {0,1} and {2,3}, but the tiers alternate: every NVLink pair
	// mixes tiers.
	mixed := func(used ...uint64) *Node {
		n := islandNode(used...)
		n.Tiers = []Tier{TierOf(mps), TierOf(none), TierOf(mps), TierOf(none)}
		return n
	}
	tests := []struct {
		name   string
		node   *Node
		req    Request
		want   gpushare.GPUSet
		reason string
		unres  bool
	}{
		{name: "any: the first tier's GPUs, not the NVLink pair", node: mixed(0, 0, 0, 0), req: multi(req(8), 2, false), want: gpushare.NewGPUSet(0, 2)},
		{name: "any: the other tier when the first is full", node: mixed(14, 0, 0, 0), req: multi(req(8), 2, false), want: gpushare.NewGPUSet(1, 3)},
		{name: "mps: its GPUs", node: mixed(0, 0, 0, 0), req: multi(withIso(req(8), "mps", ""), 2, false), want: gpushare.NewGPUSet(0, 2)},
		{name: "none: its GPUs", node: mixed(0, 0, 0, 0), req: multi(withIso(req(8), "none", ""), 2, false), want: gpushare.NewGPUSet(1, 3)},
		{name: "a share: the GPUs that limit it", node: mixed(0, 0, 0, 0), req: multi(withIso(req(8), "", "30"), 2, false), want: gpushare.NewGPUSet(0, 2)},
		{name: "required: no NVLink pair within a tier", node: mixed(0, 0, 0, 0), req: multi(req(8), 2, true), reason: "NVLink", unres: true},
		{name: "three GPUs: no tier has them", node: mixed(0, 0, 0, 0), req: multi(req(12), 3, false), reason: "among the GPUs of isolation tier", unres: true},
		{name: "both tiers too full", node: mixed(14, 0, 0, 14), req: multi(req(8), 2, false), reason: "among the GPUs of isolation tier"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.reason != "" {
				p, unfit := Place(tt.node, tt.req, BestFit)
				if unfit == nil || !strings.Contains(unfit.Reason, tt.reason) || unfit.Unresolvable != tt.unres {
					t.Fatalf("Place = %+v, %+v; want reason containing %q, unresolvable %v", p, unfit, tt.reason, tt.unres)
				}
				return
			}
			p := placeSet(t, tt.node, tt.req, BestFit)
			if p.Set != tt.want {
				t.Fatalf("set %v, want %v", p.Set, tt.want)
			}
			assertOneTier(t, tt.node, p)
			assertAllowed(t, tt.node, tt.req, p)
		})
	}
}

// assertOneTier checks that a multi-GPU placement's GPUs share one effective tier.
func assertOneTier(t *testing.T, n *Node, p Placement) {
	t.Helper()
	var tiers []Tier
	for i, g := range n.GPUs {
		if p.Set.Has(g.Index) && !slices.Contains(tiers, n.TierAt(i)) {
			tiers = append(tiers, n.TierAt(i))
		}
	}
	if len(tiers) != 1 {
		t.Fatalf("set %v mixes tiers %v", p.Set, tiers)
	}
}

func TestHoldBackMulti(t *testing.T) {
	pair := gpushare.NewGPUSet(0, 1)
	inflight := func(podUnits uint64, isolation PodIsolation, slots ...Slot) InFlight {
		return InFlight{Pod: "default/p", PodUnits: podUnits, Isolation: isolation, Slots: slots}
	}
	// Without anything in flight a 2-GPU 8-unit pod goes to 2,3 by best fit.
	if p := placeSet(t, islandNode(4, 4, 8, 8), multi(req(8), 2, false), BestFit); p.Set != gpushare.NewGPUSet(2, 3) {
		t.Fatalf("baseline set %v, want 2,3", p.Set)
	}
	tests := []struct {
		name     string
		used     []uint64
		inflight InFlight
		req      Request
		want     gpushare.GPUSet // 0: must wait
		reason   string
	}{
		{
			name: "same size, pod units and isolation: exactly the in-flight set", used: []uint64{4, 4, 8, 8},
			inflight: inflight(8, PodIsolation{}, Slot{8, pair}), req: multi(req(8), 2, false), want: pair,
		},
		{
			name: "same set forced under required", used: []uint64{4, 4, 8, 8},
			inflight: inflight(8, PodIsolation{}, Slot{8, pair}), req: multi(req(8), 2, true), want: pair,
		},
		{
			name: "two sizes of one in-flight pod: the same set", used: []uint64{4, 4, 8, 8},
			inflight: inflight(12, PodIsolation{}, Slot{8, pair}, Slot{4, pair}), req: multi(req(8, 4), 2, false), want: pair,
		},
		{
			name: "other pod units wait", used: []uint64{4, 4, 8, 8},
			inflight: inflight(12, PodIsolation{}, Slot{8, pair}, Slot{4, pair}), req: multi(req(8), 2, false),
			reason: "waiting for pod default/p",
		},
		{
			name: "other isolation waits", used: []uint64{4, 4, 8, 8},
			inflight: inflight(8, withIso(req(1), "", "30").Isolation, Slot{8, pair}), req: multi(req(8), 2, false),
			reason: "waiting for pod default/p",
		},
		{
			name: "the in-flight set too full waits", used: []uint64{14, 4, 0, 0},
			inflight: inflight(8, PodIsolation{}, Slot{8, pair}), req: multi(req(8), 2, false),
			reason: "waiting",
		},
		{
			name: "a single-GPU pod of the size waits", used: []uint64{4, 4, 8, 8},
			inflight: inflight(8, PodIsolation{}, Slot{8, pair}), req: req(8),
			reason: "waiting",
		},
		{
			name: "a split pod of the size waits", used: []uint64{8, 8, 8, 8},
			inflight: inflight(8, PodIsolation{}, Slot{8, pair}), req: req(8, 8),
			reason: "waiting",
		},
		{
			name: "a multi-GPU pod of an in-flight single-GPU size waits", used: []uint64{4, 4, 8, 8},
			inflight: inflight(8, PodIsolation{}, Slot{8, gpushare.NewGPUSet(1)}), req: multi(req(8), 2, false),
			reason: "waiting",
		},
		{
			name: "a 4-GPU pod of an in-flight pair's size waits", used: []uint64{0, 0, 0, 0},
			inflight: inflight(8, PodIsolation{}, Slot{8, pair}), req: multi(req(8), 4, false),
			reason: "waiting",
		},
		{
			name: "other sizes are free", used: []uint64{4, 4, 8, 8},
			inflight: inflight(8, PodIsolation{}, Slot{8, pair}), req: multi(req(6), 2, false), want: gpushare.NewGPUSet(2, 3),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := islandNode(tt.used...)
			n.InFlight = []InFlight{tt.inflight}
			p, unfit := Place(n, tt.req, BestFit)
			if tt.reason != "" {
				if unfit == nil || !strings.Contains(unfit.Reason, tt.reason) || unfit.Unresolvable {
					t.Fatalf("Place = %+v, %+v; want resolvable reason containing %q", p, unfit, tt.reason)
				}
				return
			}
			if unfit != nil {
				t.Fatalf("unfit: %+v", unfit)
			}
			if p.Set != tt.want {
				t.Fatalf("set %v, want %v", p.Set, tt.want)
			}
			assertSignatures(t, n, tt.req, p)
			assertNoOvercommit(t, n, tt.req, p)
		})
	}
}

func TestPlacePreferSingleWiring(t *testing.T) {
	// GPUs 0, 1, 2 NVLink-connected to each other, GPU 3 on PCIe only.
	mixed := func(used ...uint64) *Node {
		g := gpusOf(repeatUnits(4, 16), used)
		n := node(g)
		n.Links = NewLinkScores(g, linksBy(4, func(a, b int) (int, int) {
			if b == 3 {
				return islandPCIeScore, 0
			}
			return islandNVScore, islandNVLinks
		}))
		return n
	}
	for _, tc := range []struct {
		name   string
		node   *Node
		policy Policy
		want   int
	}{
		{"bestfit ties: the least connected GPU", mixed(0, 0, 0, 0), BestFit, 3},
		{"spread ties: the least connected GPU", mixed(0, 0, 0, 0), Spread, 3},
		{"firstfit: the lowest index", mixed(0, 0, 0, 0), FirstFit, 0},
		{"bestfit: free units first", mixed(0, 4, 0, 0), BestFit, 1},
		{"bestfit ties among the fullest", mixed(4, 4, 0, 4), BestFit, 3},
		{"islands: equally connected, the lowest index", islandNode(0, 0, 0, 0), BestFit, 0},
		{"islands: a GPU whose partner is full", islandNode(0, 0, 16, 0), BestFit, 3},
		{"no topology: the lowest index", node(gpus(16, 0, 16, 0, 16, 0, 16, 0)), BestFit, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, unfit := Place(tc.node, req(4), tc.policy)
			if unfit != nil {
				t.Fatal(unfit.Reason)
			}
			if p.Home != tc.want || p.Set != 0 || p.Split {
				t.Fatalf("placement %+v, want GPU %d alone", p, tc.want)
			}
		})
	}
}

// randomLinks is a random topology of n GPUs: none, NVSwitch, NVLink
// islands of 2 or 4, PCIe only, or random pairs.
func randomLinks(rng *rand.Rand, n int) []gpushare.GPULink {
	switch rng.IntN(6) {
	case 0:
		return nil
	case 1:
		return nvswitchLinks(n)
	case 2:
		return islandLinks(n, 2)
	case 3:
		return islandLinks(n, 4)
	case 4:
		return pcieLinks(n)
	}
	return linksBy(n, func(a, b int) (int, int) {
		if rng.IntN(3) == 0 {
			k := 1 + rng.IntN(4)
			return 50 * k, k
		}
		return []int{scoreCrossCPU, scoreSameCPU, scoreSwitch}[rng.IntN(3)], 0
	})
}

// TestBindsKeepInvariantsMulti binds random one-, two- and four-GPU pods
// one after another on random 8-GPU nodes of random topologies and tiers,
// and checks after every bind what the device plugin and the accounting
// rely on.
func TestBindsKeepInvariantsMulti(t *testing.T) {
	tiers := []gpushare.Isolation{gpushare.IsolationNone, gpushare.IsolationMPS, gpushare.IsolationHAMiCore}
	asks := []PodIsolation{{}, {}, {}, iso(t, "mps", ""), iso(t, "", "30"), iso(t, "none", "")}
	rng := rand.New(rand.NewPCG(15, 8))
	placed := map[int]int{}
	forced := 0 // multi-GPU pods placed beside an in-flight container of one of their sizes
	for round := range 400 {
		g := make([]GPU, 8)
		for i := range g {
			g[i] = GPU{Index: i, Units: []uint64{16, 16, 24, 32}[rng.IntN(4)], Healthy: rng.IntN(10) != 0}
		}
		n := node(g)
		n.Links = NewLinkScores(g, randomLinks(rng, len(g)))
		if rng.IntN(2) == 0 {
			n.Tiers = make([]Tier, len(g))
			for i := range n.Tiers {
				n.Tiers[i] = TierOf(tiers[rng.IntN(len(tiers))])
			}
		}
		for i := range 16 {
			// The device plugin allocates an in-flight pod now and then.
			if len(n.InFlight) > 0 && rng.IntN(4) == 0 {
				next := *n
				k := rng.IntN(len(n.InFlight))
				next.InFlight = slices.Delete(slices.Clone(n.InFlight), k, k+1)
				n = &next
			}
			count := []int{0, 0, 2, 2, 4}[rng.IntN(5)]
			per := uint64(max(count, 1))
			size := func() uint64 { return per * []uint64{1, 2, 2, 3, 4, 6}[rng.IntN(6)] }
			var r Request
			switch rng.IntN(6) {
			case 0:
				r = req(size(), size())
			case 1:
				r = withInit(req(size()), size(), rng.IntN(2) == 0)
			default:
				r = req(size())
			}
			r.Pod = fmt.Sprintf("default/p%d-%d", round, i)
			r.Isolation = asks[rng.IntN(len(asks))]
			if count > 1 {
				r.GPUs = gpushare.MultiGPU{Count: count, LinksRequired: rng.IntN(4) == 0}
			}
			policy := Policy(rng.IntN(3))
			p, unfit := Place(n, r, policy)
			if unfit != nil {
				if unfit.Reason == "" {
					t.Fatalf("round %d pod %d: unfit without a reason", round, i)
				}
				if Score(n, r, policy) != 0 {
					t.Fatalf("round %d pod %d: an unfit node scored above 0", round, i)
				}
				continue
			}
			placed[count]++
			if count > 1 && sharesSize(n, r) {
				forced++
			}
			checkMultiPlacement(t, n, r, p)
			assertAllowed(t, n, r, p)
			assertSignatures(t, n, r, p)
			// Bind: charge it and put it in flight, as the cache's next snapshot does.
			next := *n
			next.GPUs = slices.Clone(n.GPUs)
			for gi, u := range Charges(r, p) {
				next.GPUs[slices.IndexFunc(next.GPUs, func(x GPU) bool { return x.Index == gi })].Used += u
			}
			next.InFlight = append(slices.Clone(n.InFlight), InFlight{Pod: r.Pod, PodUnits: r.Units, Isolation: r.Isolation, Slots: Slots(r, p)})
			n = &next
			for _, x := range n.GPUs {
				if x.Used > x.Units {
					t.Fatalf("round %d pod %d: GPU %d holds %d of %d units", round, i, x.Index, x.Used, x.Units)
				}
			}
			checkInFlightSignatures(t, n)
		}
	}
	t.Logf("placed by gpu-count: %v; multi-GPU beside an in-flight size: %d", placed, forced)
	if forced < 50 {
		t.Fatalf("only %d multi-GPU pods placed under the hold-back rule: the test exercises too little", forced)
	}
	for _, c := range []int{0, 2, 4} {
		if placed[c] < 300 {
			t.Fatalf("only %d pods of gpu-count %d placed (%v): the test exercises too little", placed[c], c, placed)
		}
	}
}

// sharesSize reports whether a container of r has the size of an in-flight container on n.
func sharesSize(n *Node, r Request) bool {
	for _, f := range n.InFlight {
		for _, s := range f.Slots {
			if slices.ContainsFunc(r.Containers, func(c gpushare.ContainerRequest) bool { return c.Units == s.Units }) {
				return true
			}
		}
	}
	return false
}

// checkMultiPlacement checks a placement's shape against its request: a
// multi-GPU pod gets Count distinct healthy GPUs of one tier, all
// NVLink-connected when it requires it, each charged Units / Count; any
// other pod gets no set.
func checkMultiPlacement(t *testing.T, n *Node, r Request, p Placement) {
	t.Helper()
	charges := Charges(r, p)
	for gi := range charges {
		i := slices.IndexFunc(n.GPUs, func(x GPU) bool { return x.Index == gi })
		if i < 0 || !n.GPUs[i].Healthy {
			t.Fatalf("pod %s placed on GPU %d, unhealthy or unknown (%+v)", r.Pod, gi, p)
		}
	}
	if r.GPUs.Count <= 1 {
		if p.Set != 0 {
			t.Fatalf("single-GPU pod %s given the set %v", r.Pod, p.Set)
		}
		return
	}
	if p.Set.Len() != r.GPUs.Count || len(charges) != r.GPUs.Count || p.Home != p.Set.First() || p.Split {
		t.Fatalf("pod %s of gpu-count %d: placement %+v charges %v", r.Pod, r.GPUs.Count, p, charges)
	}
	var pos []int
	for i, g := range n.GPUs {
		if p.Set.Has(g.Index) {
			pos = append(pos, i)
		}
	}
	if len(pos) != r.GPUs.Count {
		t.Fatalf("pod %s: set %v names GPUs the node lacks", r.Pod, p.Set)
	}
	for _, i := range pos {
		if charges[n.GPUs[i].Index] != r.Units/uint64(r.GPUs.Count) {
			t.Fatalf("pod %s of %d units over %d GPUs: charges %v", r.Pod, r.Units, r.GPUs.Count, charges)
		}
		if n.TierAt(i) != n.TierAt(pos[0]) {
			t.Fatalf("pod %s: set %v mixes tiers %v and %v", r.Pod, p.Set, n.TierAt(pos[0]), n.TierAt(i))
		}
		for _, j := range pos {
			if r.GPUs.LinksRequired && i != j && !n.Links.NVLink(i, j) {
				t.Fatalf("pod %s requires NVLink: GPUs %d and %d of %v are not connected", r.Pod, n.GPUs[i].Index, n.GPUs[j].Index, p.Set)
			}
		}
	}
	if p.DevUnits != n.GPUs[pos[0]].Units {
		t.Fatalf("pod %s: DevUnits %d, GPU %d has %d", r.Pod, p.DevUnits, p.Home, n.GPUs[pos[0]].Units)
	}
}

// checkInFlightSignatures is the invariant of extender/server's
// checkSignatures: any two in-flight containers of one size in different
// pods share GPUs, pod total and isolation annotations.
func checkInFlightSignatures(t *testing.T, n *Node) {
	t.Helper()
	type signature struct {
		gpus     gpushare.GPUSet
		podUnits uint64
		iso      PodIsolation
	}
	for i, a := range n.InFlight {
		for _, b := range n.InFlight[i+1:] {
			for _, sa := range a.Slots {
				for _, sb := range b.Slots {
					x, y := signature{sa.GPUs, a.PodUnits, a.Isolation}, signature{sb.GPUs, b.PodUnits, b.Isolation}
					if sa.Units == sb.Units && x != y {
						t.Fatalf("in-flight %d-unit containers of %s %+v and %s %+v", sa.Units, a.Pod, x, b.Pod, y)
					}
				}
			}
		}
	}
}
