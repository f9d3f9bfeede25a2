package allocator

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

// Link scores in the tests follow the shape of the contract's scale: PCIe
// levels well below NVLink, NVLink by link count.
const (
	scoreCrossCPU   = 10 // PCIe through the CPU interconnect
	scoreSameCPU    = 20 // PCIe under one CPU
	scoreSwitch     = 30 // PCIe under one switch
	scoreNVLink     = 100
	scoreNVSwitch   = 100
	nvlinksNVSwitch = 18
)

// gpusOf builds GPUs of the given sizes (free units), indices 0..n-1,
// healthy and empty but for used.
func gpusOf(units []uint64, used []uint64) []GPU {
	out := make([]GPU, len(units))
	for i, u := range units {
		out[i] = GPU{Index: i, Units: u, Healthy: true}
		if used != nil {
			out[i].Used = used[i]
		}
	}
	return out
}

func repeatUnits(n int, u uint64) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = u
	}
	return out
}

// linksBy builds the links of n GPUs from f(a, b) = score, nvlinks.
func linksBy(n int, f func(a, b int) (int, int)) []gpushare.GPULink {
	var out []gpushare.GPULink
	for a := range n {
		for b := a + 1; b < n; b++ {
			s, nv := f(a, b)
			out = append(out, gpushare.GPULink{A: a, B: b, Score: s, NVLinks: nv})
		}
	}
	return out
}

func nvswitchLinks(n int) []gpushare.GPULink {
	return linksBy(n, func(a, b int) (int, int) { return scoreNVSwitch, nvlinksNVSwitch })
}

// islandLinks: NVLink islands of size GPUs; between islands PCIe, under one
// CPU for neighbouring islands on the same socket (pairs of islands).
func islandLinks(n, size int) []gpushare.GPULink {
	return linksBy(n, func(a, b int) (int, int) {
		switch {
		case a/size == b/size:
			return scoreNVLink, 4
		case a/(2*size) == b/(2*size):
			return scoreSameCPU, 0
		}
		return scoreCrossCPU, 0
	})
}

// pcieLinks: no NVLink; pairs under one switch (0-1, 2-3, ...), under one
// CPU (0-3, 4-7), or across CPUs.
func pcieLinks(n int) []gpushare.GPULink {
	return linksBy(n, func(a, b int) (int, int) {
		switch {
		case a/2 == b/2:
			return scoreSwitch, 0
		case a/4 == b/4:
			return scoreSameCPU, 0
		}
		return scoreCrossCPU, 0
	})
}

func flatPCIeLinks(n int) []gpushare.GPULink {
	return linksBy(n, func(a, b int) (int, int) { return scoreSameCPU, 0 })
}

func TestChooseSet(t *testing.T) {
	tests := []struct {
		name     string
		units    []uint64
		used     []uint64
		sick     []int // unhealthy positions
		unusable []int // positions the usable predicate refuses
		links    []gpushare.GPULink
		m        int
		per      uint64
		required bool
		want     []int
		reason   string // exact, when want is nil
		unres    bool
	}{
		{
			name:  "nvswitch, all empty: lowest indices",
			units: repeatUnits(8, 16), links: nvswitchLinks(8),
			m: 2, per: 8, want: []int{0, 1},
		},
		{
			name:  "nvswitch: best fit then lowest indices",
			units: repeatUnits(8, 16), used: []uint64{0, 8, 4, 8, 0, 10, 8, 0}, links: nvswitchLinks(8),
			m: 3, per: 6, want: []int{1, 3, 5},
		},
		{
			name:  "nvswitch required: best fit",
			units: repeatUnits(8, 16), used: []uint64{0, 0, 0, 12, 0, 8, 0, 8}, links: nvswitchLinks(8),
			m: 2, per: 4, required: true, want: []int{3, 5},
		},
		{
			name:  "unknown topology: best fit then lowest indices",
			units: repeatUnits(4, 16), used: []uint64{4, 0, 4, 4},
			m: 2, per: 8, want: []int{0, 2},
		},
		{
			name:  "two islands of four, all empty: the first island",
			units: repeatUnits(8, 16), links: islandLinks(8, 4),
			m: 4, per: 4, want: []int{0, 1, 2, 3},
		},
		{
			name:  "two islands: GPU 0 full, the second island whole",
			units: repeatUnits(8, 16), used: []uint64{16, 0, 0, 0, 0, 0, 0, 0}, links: islandLinks(8, 4),
			m: 4, per: 4, want: []int{4, 5, 6, 7},
		},
		{
			name:  "two islands: within an island over a tighter cross-island fit",
			units: repeatUnits(8, 16), used: []uint64{0, 0, 0, 12, 12, 0, 0, 0}, links: islandLinks(8, 4),
			m: 2, per: 4, want: []int{0, 3},
		},
		{
			name:  "two islands: best fit within the island",
			units: repeatUnits(8, 16), used: []uint64{0, 0, 0, 12, 12, 4, 0, 0}, links: islandLinks(8, 4),
			m: 2, per: 4, want: []int{4, 5},
		},
		{
			name:  "two islands: a split set scores by its sum",
			units: repeatUnits(8, 16), used: []uint64{16, 16, 0, 0, 0, 0, 16, 16}, links: islandLinks(8, 4),
			// {2,3,4} scores 100+20+20, as does {2,4,5}; best fit is equal: lowest indices.
			m: 3, per: 4, want: []int{2, 3, 4},
		},
		{
			name:  "PCIe only, flat: best fit",
			units: repeatUnits(4, 16), used: []uint64{0, 8, 0, 8}, links: flatPCIeLinks(4),
			m: 2, per: 8, want: []int{1, 3},
		},
		{
			name:  "PCIe levels: the pair under one switch",
			units: repeatUnits(8, 16), used: []uint64{0, 8, 0, 8, 8, 8, 0, 0}, links: pcieLinks(8),
			m: 2, per: 8, want: []int{4, 5},
		},
		{
			name:  "PCIe only, required: refused with the fitting GPUs",
			units: repeatUnits(4, 16), used: []uint64{0, 4, 8, 16}, links: flatPCIeLinks(4),
			m: 2, per: 8, required: true, unres: true,
			reason: "no 2 GPUs with 8 free units each are all NVLink-connected (GPUs 0, 1, 2 fit; NVLink pairs among them: none)",
		},
		{
			name:  "islands, required: the free GPUs straddle islands",
			units: repeatUnits(8, 16), used: []uint64{0, 16, 16, 16, 0, 16, 16, 0}, links: islandLinks(8, 4),
			m: 3, per: 8, required: true,
			reason: "no 3 GPUs with 8 free units each are all NVLink-connected (GPUs 0, 4, 7 fit; NVLink pairs among them: 4-7)",
		},
		{
			name:  "islands, required: picks the NVLink pair",
			units: repeatUnits(8, 16), used: []uint64{0, 16, 16, 16, 0, 16, 16, 0}, links: islandLinks(8, 4),
			m: 2, per: 8, required: true, want: []int{4, 7},
		},
		{
			name:  "required without a published topology",
			units: repeatUnits(2, 16), m: 2, per: 8, required: true, unres: true,
			reason: "the pod requires NVLink-connected GPUs (gpushare.io/topology: required) but the node publishes no GPU topology",
		},
		{
			name:  "more GPUs than the node has",
			units: repeatUnits(2, 16), links: nvswitchLinks(2), m: 4, per: 4, unres: true,
			reason: "the pod asks for 4 GPUs (aliyun.com/gpu-count); the node has 2",
		},
		{
			name:  "unhealthy and unusable GPUs do not count",
			units: repeatUnits(4, 16), sick: []int{1}, unusable: []int{2, 3}, m: 2, per: 4, unres: true,
			reason: "the pod asks for 2 GPUs; only 1 of the node's 4 GPUs are healthy and usable by it (GPU 0)",
		},
		{
			name:  "GPUs too small",
			units: []uint64{16, 8, 16, 8}, m: 3, per: 12, unres: true,
			reason: "the pod asks for 12 units on each of 3 GPUs; only 2 usable GPUs of the node have that many (GPUs 0, 2)",
		},
		{
			name:  "not enough free",
			units: repeatUnits(4, 16), used: []uint64{4, 12, 12, 12}, m: 2, per: 8,
			reason: "no 2 GPUs with 8 free units each (only GPU 0 fits)",
		},
		{
			name:  "none free",
			units: repeatUnits(4, 16), used: []uint64{12, 12, 12, 12}, m: 2, per: 8,
			reason: "no 2 GPUs with 8 free units each (none fits)",
		},
		{
			name:  "unhealthy GPU skipped in an island",
			units: repeatUnits(8, 16), sick: []int{1}, links: islandLinks(8, 4),
			m: 4, per: 4, want: []int{4, 5, 6, 7},
		},
		{
			name:  "links for GPUs the node lacks are ignored",
			units: repeatUnits(2, 16), links: []gpushare.GPULink{{A: 0, B: 1, Score: 100, NVLinks: 2}, {A: 1, B: 7, Score: 100, NVLinks: 2}},
			m: 2, per: 8, required: true, want: []int{0, 1},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			gpus := gpusOf(tc.units, tc.used)
			for _, i := range tc.sick {
				gpus[i].Healthy = false
			}
			usable := func(i int) bool { return !slices.Contains(tc.unusable, i) }
			got, unfit := ChooseSet(gpus, usable, NewLinkScores(gpus, tc.links), tc.m, tc.per, tc.required)
			if tc.want != nil {
				if unfit != nil || !slices.Equal(got, tc.want) {
					t.Fatalf("ChooseSet = %v, %v; want %v", got, unfit, tc.want)
				}
				return
			}
			if unfit == nil {
				t.Fatalf("ChooseSet = %v; want the reason %q", got, tc.reason)
			}
			if unfit.Reason != tc.reason || unfit.Unresolvable != tc.unres {
				t.Fatalf("ChooseSet refused with %q (unresolvable %v); want %q (unresolvable %v)", unfit.Reason, unfit.Unresolvable, tc.reason, tc.unres)
			}
		})
	}
}

func TestChooseSetInvalid(t *testing.T) {
	gpus := gpusOf(repeatUnits(2, 16), nil)
	for _, tc := range []struct {
		m   int
		per uint64
	}{{0, 4}, {-1, 4}, {2, 0}} {
		if got, unfit := ChooseSet(gpus, nil, LinkScores{}, tc.m, tc.per, false); unfit == nil || !unfit.Unresolvable {
			t.Errorf("ChooseSet(m=%d, per=%d) = %v, %v; want an unresolvable refusal", tc.m, tc.per, got, unfit)
		}
	}
	// A table built for other GPUs is not trusted.
	links := NewLinkScores(gpusOf(repeatUnits(4, 16), nil), islandLinks(4, 2))
	if _, unfit := ChooseSet(gpus, nil, links, 2, 4, true); unfit == nil || !strings.Contains(unfit.Reason, "no GPU topology") {
		t.Errorf("ChooseSet with a foreign table = %v; want the unknown-topology refusal", unfit)
	}
}

// TestChooseSetGreedy covers nodes beyond exhaustiveLimit: 24 GPUs in
// three NVLink islands of eight.
func TestChooseSetGreedy(t *testing.T) {
	const n = 24
	if binomial(n, 6, exhaustiveLimit) <= exhaustiveLimit {
		t.Fatal("the test no longer reaches the greedy search")
	}
	gpus := gpusOf(repeatUnits(n, 16), nil)
	links := NewLinkScores(gpus, islandLinks(n, 8))
	check := func(name string, m int, per uint64, required bool, wantIsland int) {
		t.Helper()
		set, unfit := ChooseSet(gpus, nil, links, m, per, required)
		if unfit != nil {
			t.Fatalf("%s: ChooseSet refused: %s", name, unfit.Reason)
		}
		if len(set) != m || !slices.IsSorted(set) || len(slices.Compact(slices.Clone(set))) != m {
			t.Fatalf("%s: ChooseSet = %v; want %d distinct GPUs, ascending", name, set, m)
		}
		for _, i := range set {
			if gpus[i].Free() < per || !gpus[i].Healthy {
				t.Fatalf("%s: ChooseSet = %v; GPU %d cannot take %d units", name, set, i, per)
			}
			if i/8 != wantIsland {
				t.Fatalf("%s: ChooseSet = %v; want every GPU in island %d", name, set, wantIsland)
			}
		}
	}
	check("empty node", 6, 4, false, 0)
	// Three GPUs of the first island full: it cannot take six; the second can.
	for i := range 3 {
		gpus[i].Used = 14
	}
	check("first island short", 6, 4, false, 1)
	check("first island short, required", 6, 4, true, 1)
	// Best fit between islands: the third is fuller.
	for i := 16; i < 24; i++ {
		gpus[i].Used = 8
	}
	check("best fit between islands", 6, 4, false, 2)

	// Islands of four: no six GPUs are all NVLink-connected, on any node state.
	gpus = gpusOf(repeatUnits(n, 16), nil)
	links = NewLinkScores(gpus, islandLinks(n, 4))
	if set, unfit := ChooseSet(gpus, nil, links, 6, 4, true); unfit == nil || !unfit.Unresolvable {
		t.Fatalf("required six over islands of four = %v, %v; want an unresolvable refusal", set, unfit)
	} else if !strings.HasSuffix(unfit.Reason, "NVLink pairs among them: 0-1, 0-2, 0-3, 1-2, 1-3, 2-3, 4-5, 4-6, 4-7, 5-6, 5-7, 6-7, 8-9, 8-10, 8-11, 9-10, and 20 more)") {
		t.Errorf("reason %q: want the NVLink pairs cut at 16", unfit.Reason)
	}
	// Preferred: an island and the best connected GPU beside it.
	if set, unfit := ChooseSet(gpus, nil, links, 5, 4, false); unfit != nil || !slices.Equal(set, []int{0, 1, 2, 3, 4}) {
		t.Fatalf("five over islands of four = %v, %v; want [0 1 2 3 4]", set, unfit)
	}
}

// TestChooseSetGreedyMatchesExhaustive compares the greedy search with the
// exhaustive one on island nodes, where greedy is exact.
func TestChooseSetGreedyMatchesExhaustive(t *testing.T) {
	for _, n := range []int{8, 12, 16} {
		for _, m := range []int{3, 4, 6} {
			gpus := gpusOf(repeatUnits(n, 16), nil)
			for i := range gpus {
				gpus[i].Used = uint64((i * 7) % 9)
			}
			l := NewLinkScores(gpus, islandLinks(n, 4))
			cands := make([]int, n)
			for i := range cands {
				cands[i] = i
			}
			c := n
			sc, nv, left := make([]int32, c*c), make([]bool, c*c), make([]uint64, c)
			for x := range c {
				left[x] = gpus[x].Free() - 4
				for y := range c {
					sc[x*c+y], nv[x*c+y] = int32(l.Score(x, y)), l.NVLink(x, y)
				}
			}
			for _, req := range []bool{false, true} {
				e, g := exhaustive(sc, nv, left, c, m, req), greedy(sc, nv, left, c, m, req)
				if m <= 4 && !slices.Equal(e, g) {
					t.Errorf("n=%d m=%d required=%v: exhaustive %v, greedy %v", n, m, req, e, g)
				}
				if (e == nil) != (g == nil) {
					t.Errorf("n=%d m=%d required=%v: exhaustive %v, greedy %v", n, m, req, e, g)
				}
			}
		}
	}
}

func TestNewLinkScores(t *testing.T) {
	gpus := []GPU{{Index: 0}, {Index: 2}, {Index: 5}}
	l := NewLinkScores(gpus, []gpushare.GPULink{
		{A: 0, B: 2, Score: 40000, NVLinks: 1}, // clamped
		{A: 5, B: 2, Score: -7},                // order does not matter
		{A: 2, B: 2, Score: 9},                 // itself: ignored
		{A: 0, B: 9, Score: 9},                 // unknown GPU: ignored
	})
	if !l.Known() || l.Score(0, 1) != math.MaxInt16 || l.Score(1, 0) != math.MaxInt16 || !l.NVLink(1, 0) {
		t.Errorf("pair 0-2: score %d, nvlink %v", l.Score(0, 1), l.NVLink(0, 1))
	}
	if l.Score(1, 2) != -7 || l.NVLink(2, 1) || l.Score(0, 2) != 0 || l.Score(1, 1) != 0 || l.Score(0, 3) != 0 || l.NVLink(-1, 0) {
		t.Errorf("other pairs: %+v", l)
	}
	if NewLinkScores(gpus, nil).Known() {
		t.Error("no links: want the unknown topology")
	}
}

// TestPreferSingle is the M = 1 tie-break: among GPUs the policy finds equal,
// the least connected one, so NVLink pairs stay free.
func TestPreferSingle(t *testing.T) {
	// A mixed node: 0-1 and 2-3 NVLink pairs, GPU 4 on PCIe only.
	mixed := linksBy(5, func(a, b int) (int, int) {
		switch {
		case a/2 == b/2 && b < 4:
			return scoreNVLink, 2
		case b == 4:
			return scoreCrossCPU, 0
		}
		return scoreSameCPU, 0
	})
	pick := func(gpus []GPU, links []gpushare.GPULink, policy Policy, per uint64) int {
		l := NewLinkScores(gpus, links)
		best := -1
		for i, g := range gpus {
			if !g.Healthy || g.Free() < per {
				continue
			}
			if best < 0 || l.PreferSingle(gpus, policy, i, best) {
				best = i
			}
		}
		return best
	}
	for _, tc := range []struct {
		name   string
		used   []uint64
		links  []gpushare.GPULink
		policy Policy
		want   int
	}{
		{"bestfit ties: the PCIe-only GPU", []uint64{0, 0, 0, 0, 0}, mixed, BestFit, 4},
		{"spread ties: the PCIe-only GPU", []uint64{0, 0, 0, 0, 0}, mixed, Spread, 4},
		{"firstfit unchanged", []uint64{0, 0, 0, 0, 0}, mixed, FirstFit, 0},
		{"bestfit: free units first", []uint64{0, 0, 0, 8, 0}, mixed, BestFit, 3},
		{"spread: free units first", []uint64{8, 8, 8, 8, 0}, mixed, Spread, 4},
		// GPU 1's partner is full: 1 is worth less to pairs than 2 or 3.
		{"partner full: the orphaned GPU", []uint64{16, 0, 0, 0, 16}, mixed, BestFit, 1},
		{"unknown topology: lowest index", []uint64{0, 0, 0, 0, 0}, nil, BestFit, 0},
		{"nvswitch: lowest index", []uint64{0, 0, 0, 0, 0}, nvswitchLinks(5), BestFit, 0},
	} {
		gpus := gpusOf(repeatUnits(5, 16), tc.used)
		if got := pick(gpus, tc.links, tc.policy, 4); got != tc.want {
			t.Errorf("%s: picked GPU %d, want %d", tc.name, got, tc.want)
		}
	}
	gpus := gpusOf(repeatUnits(5, 16), nil)
	l := NewLinkScores(gpus, mixed)
	if got := l.Connectivity(gpus, 0); got != scoreNVLink+2*scoreSameCPU+scoreCrossCPU {
		t.Errorf("Connectivity(0) = %d", got)
	}
	gpus[1].Healthy = false
	if got := l.Connectivity(gpus, 0); got != 2*scoreSameCPU+scoreCrossCPU {
		t.Errorf("Connectivity(0) beside an unhealthy partner = %d", got)
	}
}

func TestBinomial(t *testing.T) {
	for _, tc := range []struct{ n, k, want int }{
		{16, 8, 12870}, {16, 4, 1820}, {8, 2, 28}, {5, 0, 1}, {5, 5, 1}, {3, 4, 0}, {160, 2, 12720}, {161, 2, exhaustiveLimit + 1}, {24, 6, exhaustiveLimit + 1},
	} {
		if got := binomial(tc.n, tc.k, exhaustiveLimit); got != tc.want {
			t.Errorf("binomial(%d, %d) = %d, want %d", tc.n, tc.k, got, tc.want)
		}
	}
}

// FuzzChooseSet checks ChooseSet on random small nodes against a brute
// force written independently: any set returned has m distinct usable GPUs
// with per free, all NVLink-connected under required, and no valid set
// beats it (higher score sum, then higher lowest pair, then less leftover,
// then lower indices); a refusal means no valid set exists.
func FuzzChooseSet(f *testing.F) {
	f.Add(uint8(8), uint8(2), uint8(8), false, false, []byte{})
	f.Add(uint8(8), uint8(4), uint8(4), true, false, []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20})
	f.Add(uint8(6), uint8(3), uint8(5), true, true, []byte{0xff, 0, 0x80, 7, 7, 7, 9, 200, 3, 3, 1})
	f.Add(uint8(10), uint8(5), uint8(2), false, false, []byte("islands and pcie and nvswitch and mixed topologies"))
	f.Fuzz(func(t *testing.T, nGPUs, m8, per8 uint8, required, unknown bool, data []byte) {
		n := 1 + int(nGPUs)%10
		m := int(m8)%(n+1) + 1 // sometimes more than the node has
		per := uint64(per8%16) + 1
		next := func() byte {
			if len(data) == 0 {
				return 0
			}
			b := data[0]
			data = data[1:]
			return b
		}
		gpus := make([]GPU, n)
		refused := make([]bool, n)
		for i := range gpus {
			b := next()
			gpus[i] = GPU{Index: 2 * i, Units: 16, Used: uint64(b % 20), Healthy: b&0x40 == 0}
			refused[i] = b&0x80 != 0 && b&0x20 != 0
		}
		var links []gpushare.GPULink
		if !unknown {
			for a := range n {
				for b := a + 1; b < n; b++ {
					v := next()
					links = append(links, gpushare.GPULink{A: 2 * a, B: 2 * b, Score: int(v%8) * 10, NVLinks: int(v>>6) & 1 * int(v%8)})
				}
			}
		}
		l := NewLinkScores(gpus, links)
		usable := func(i int) bool { return !refused[i] }
		set, unfit := ChooseSet(gpus, usable, l, m, per, required)

		valid := func(s []int) bool {
			for x, i := range s {
				if !gpus[i].Healthy || refused[i] || gpus[i].Free() < per {
					return false
				}
				for _, j := range s[x+1:] {
					if required && m > 1 && !l.NVLink(i, j) {
						return false
					}
				}
			}
			return true
		}
		// score: sum, lowest pair (0 with one GPU), leftover.
		score := func(s []int) (int, int, uint64) {
			sum, low, left := 0, math.MaxInt, uint64(0)
			for x, i := range s {
				left += gpus[i].Free() - per
				for _, j := range s[x+1:] {
					sum += l.Score(i, j)
					low = min(low, l.Score(i, j))
				}
			}
			return sum, low, left
		}
		beats := func(a, b []int) bool { // a strictly before b
			as, al, ax := score(a)
			bs, bl, bx := score(b)
			if as != bs {
				return as > bs
			}
			if al != bl {
				return al > bl
			}
			if ax != bx {
				return ax < bx
			}
			return slices.Compare(a, b) < 0
		}
		var best []int
		var walk func(from int, cur []int)
		walk = func(from int, cur []int) {
			if len(cur) == m {
				if valid(cur) && (best == nil || beats(cur, best)) {
					best = slices.Clone(cur)
				}
				return
			}
			for i := from; i < n; i++ {
				walk(i+1, append(cur, i))
			}
		}
		walk(0, nil)

		if unfit != nil {
			if unfit.Reason == "" {
				t.Fatal("refused without a reason")
			}
			if best != nil {
				t.Fatalf("refused (%s) but %v is valid", unfit.Reason, best)
			}
			if required && unknown && m > 1 {
				return
			}
			if unfit.Unresolvable {
				// Nothing freed could help: no valid set on the empty node either.
				empty := slices.Clone(gpus)
				for i := range empty {
					empty[i].Used = 0
				}
				if again, u := ChooseSet(empty, usable, l, m, per, required); u == nil {
					t.Fatalf("unresolvable refusal (%s), but the emptied node takes %v", unfit.Reason, again)
				}
			}
			return
		}
		if len(set) != m || !slices.IsSorted(set) || len(slices.Compact(slices.Clone(set))) != m || !valid(set) {
			t.Fatalf("ChooseSet = %v: want %d distinct usable GPUs with %d free each (required %v)", set, m, per, required)
		}
		if best == nil || !slices.Equal(set, best) {
			t.Fatalf("ChooseSet = %v, brute force %v (m=%d per=%d required=%v)", set, best, m, per, required)
		}
	})
}

func ExampleChooseSet() {
	gpus := gpusOf(repeatUnits(8, 16), []uint64{0, 16, 16, 16, 0, 16, 16, 0})
	links := NewLinkScores(gpus, islandLinks(8, 4))
	set, _ := ChooseSet(gpus, nil, links, 2, 8, true)
	fmt.Println(set)
	_, unfit := ChooseSet(gpus, nil, links, 3, 8, true)
	fmt.Println(unfit.Reason)
	// Output:
	// [4 7]
	// no 3 GPUs with 8 free units each are all NVLink-connected (GPUs 0, 4, 7 fit; NVLink pairs among them: 4-7)
}
