package allocator

// Set selection for multi-GPU pods (issue 15): a pod labelled
// aliyun.com/gpu-count "M" whose containers limit gpu-mem N gets N/M units on
// each of M GPUs of one node. This file holds the pure choice of those M GPUs
// from a node's GPUs and the links its device plugin published; Place, the
// filter, the binder and the cache do not call it yet.

import (
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

// LinkScores is a node's GPU topology in the form set selection reads: the
// score and NVLink flag of every pair of GPUs, by position in Node.GPUs (not
// by GPU index), in flat n×n tables so a lookup is one multiply and one load.
// Scores are clamped to int16: the contract's scale (PCIe levels, NVLink by
// link count) is far smaller. The zero value is an unknown topology (a plugin
// that predates links): every pair scores 0 and none is NVLink-connected.
type LinkScores struct {
	n      int
	score  []int16 // score[i*n+j] == score[j*n+i]; 0 on the diagonal
	nvlink []bool  // nvlink[i*n+j]: the pair has at least one NVLink link
}

// NewLinkScores reads the links a device plugin published
// (gpushare.NodeGPUs.Links) against gpus, the node's GPUs sorted by Index.
// Links naming a GPU that gpus lacks, or a GPU with itself, are ignored; a
// pair no link names scores 0 and is not NVLink-connected; when a pair is
// named twice the last wins. No links at all gives the unknown topology.
func NewLinkScores(gpus []GPU, links []gpushare.GPULink) LinkScores {
	if len(links) == 0 || len(gpus) == 0 {
		return LinkScores{}
	}
	n := len(gpus)
	pos := make(map[int]int, n)
	for i, g := range gpus {
		pos[g.Index] = i
	}
	l := LinkScores{n: n, score: make([]int16, n*n), nvlink: make([]bool, n*n)}
	for _, k := range links {
		a, okA := pos[k.A]
		b, okB := pos[k.B]
		if !okA || !okB || a == b {
			continue
		}
		s := int16(max(math.MinInt16, min(math.MaxInt16, k.Score)))
		l.score[a*n+b], l.score[b*n+a] = s, s
		l.nvlink[a*n+b], l.nvlink[b*n+a] = k.NVLinks > 0, k.NVLinks > 0
	}
	return l
}

// Known reports whether the node published a topology.
func (l LinkScores) Known() bool { return l.score != nil }

// Score is the link score between the GPUs at positions i and j; 0 when the
// topology is unknown, for i == j, or for positions outside the table.
func (l LinkScores) Score(i, j int) int {
	if uint(i) >= uint(l.n) || uint(j) >= uint(l.n) {
		return 0
	}
	return int(l.score[i*l.n+j])
}

// NVLink reports whether the GPUs at positions i and j are NVLink-connected;
// false when the topology is unknown.
func (l LinkScores) NVLink(i, j int) bool {
	if uint(i) >= uint(l.n) || uint(j) >= uint(l.n) || i == j {
		return false
	}
	return l.nvlink[i*l.n+j]
}

// Connectivity is how much GPU i (a position in gpus) is worth to multi-GPU
// pods: the sum of its link scores to every other healthy GPU that is not
// full. 0 when the topology is unknown. Lower means the GPU is the better
// home for a one-GPU pod (PreferSingle), since its NVLink partners stay free.
func (l LinkScores) Connectivity(gpus []GPU, i int) int {
	if !l.Known() || l.n != len(gpus) {
		return 0
	}
	sum := 0
	for j, g := range gpus {
		if j != i && g.Healthy && g.Free() > 0 {
			sum += int(l.score[i*l.n+j])
		}
	}
	return sum
}

// PreferSingle is the choice of Place's single-GPU loop with the topology
// tie-break of issue 15: whether the GPU at position a should replace b, the
// best so far (b < a, both fit the pod), as the pod's one GPU. It does what
// policy.better does and, where the policy sees a tie (equal free units under
// BestFit or Spread), prefers the less connected GPU (Connectivity), so
// NVLink pairs stay free for multi-GPU pods; equally connected, b (the lower
// index) stays. FirstFit is left as it is: the lowest index is its
// definition, and the packing benchmark compares with it as the classic
// reference.
func (l LinkScores) PreferSingle(gpus []GPU, policy Policy, a, b int) bool {
	fa, fb := gpus[a].Free(), gpus[b].Free()
	if policy.better(fa, fb) {
		return true
	}
	if policy == FirstFit || fa != fb || !l.Known() {
		return false
	}
	return l.Connectivity(gpus, a) < l.Connectivity(gpus, b)
}

// exhaustiveLimit is the number of M-sets ChooseSet scores one by one before
// it turns greedy: C(16, 8), the most any M has among 16 GPUs, so every node
// of up to 16 candidate GPUs is chosen exactly (and M = 2 up to 160).
const exhaustiveLimit = 12870

// setScore orders M-sets: the higher sum of pair scores, then the higher
// lowest pair score, then the least leftover units on the chosen GPUs after
// placing (best fit); equal sets go to the lowest positions, which the
// searches get by keeping the first of equals in lexicographic order.
type setScore struct {
	sum, min int
	left     uint64
}

func (a setScore) better(b setScore) bool {
	if a.sum != b.sum {
		return a.sum > b.sum
	}
	if a.min != b.min {
		return a.min > b.min
	}
	return a.left < b.left
}

// ChooseSet chooses the m GPUs (positions in gpus, ascending) that get per
// units each for a multi-GPU pod, or says why none can.
//
// Candidates are healthy GPUs that usable allows (the pod's isolation tier
// and, when wired, the hold-back rule; nil allows every healthy GPU) with per
// units free. Among the m-sets of candidates it takes the one with the
// highest sum of pair link scores (the "maximises the pair score":
// the sum counts every pair, so one excellent link cannot hide poor ones the
// way a maximum would; the minimum breaks ties so that, of equal sums, the
// set without a weak link wins), then the least leftover units on the chosen
// GPUs (best fit, as for single GPUs), then the lowest positions
// (lexicographically). With required, every pair of the set must be
// NVLink-connected.
//
// When every pair of candidates scores the same (unknown topology, NVSwitch),
// the choice is the m candidates with the least free units, lowest positions
// on ties, at any size. Otherwise every set is scored while there are at
// most exhaustiveLimit of them (every m up to 16 candidates); beyond that
// the choice is greedy: each candidate in turn seeds a set that grows by the
// candidate adding the highest sum of scores to the set so far (then the
// highest lowest added score, then the least free units, then the lowest
// position), so its first step is its best partner; the best of the sets
// that reach m GPUs wins by the order above. Seeding from every GPU, not
// only from the best pair, keeps one crowded island from hiding a whole free
// one. Under required only candidates NVLink-connected to the whole set are
// added, and a seed that cannot grow to m does not count.
//
// Unfit.Unresolvable is set when freeing units could not help: m is larger
// than the node's GPUs, fewer than m usable GPUs are at least per units
// large, or (required) no m of those are all NVLink-connected.
func ChooseSet(gpus []GPU, usable func(i int) bool, links LinkScores, m int, per uint64, required bool) ([]int, *Unfit) {
	gpuWord := func(k int) string {
		if k == 1 {
			return "1 GPU"
		}
		return strconv.Itoa(k) + " GPUs"
	}
	units := strconv.FormatUint(per, 10)
	switch {
	case m < 1:
		return nil, &Unfit{Reason: "the pod asks for " + strconv.Itoa(m) + " GPUs (" + gpushare.LabelPodGPUCount + "); it needs at least 1", Unresolvable: true}
	case per == 0:
		return nil, &Unfit{Reason: "the pod asks for 0 units on each GPU", Unresolvable: true}
	case m > len(gpus):
		return nil, &Unfit{Reason: "the pod asks for " + gpuWord(m) + " (" + gpushare.LabelPodGPUCount + "); the node has " + strconv.Itoa(len(gpus)), Unresolvable: true}
	}
	if links.n != len(gpus) {
		links = LinkScores{} // built for another list of GPUs: trust none of it
	}
	var usableAll, large, cands []int
	for i, g := range gpus {
		if !g.Healthy || usable != nil && !usable(i) {
			continue
		}
		usableAll = append(usableAll, i)
		if g.Units >= per {
			large = append(large, i)
			if g.Free() >= per {
				cands = append(cands, i)
			}
		}
	}
	switch {
	case len(usableAll) < m:
		return nil, &Unfit{Reason: "the pod asks for " + gpuWord(m) + "; only " + strconv.Itoa(len(usableAll)) + " of the node's " +
			strconv.Itoa(len(gpus)) + " GPUs are healthy and usable by it (" + listGPUs(gpus, usableAll) + ")", Unresolvable: true}
	case len(large) < m:
		return nil, &Unfit{Reason: "the pod asks for " + units + " units on each of " + gpuWord(m) + "; only " + strconv.Itoa(len(large)) +
			" usable GPUs of the node have that many (" + listGPUs(gpus, large) + ")", Unresolvable: true}
	case len(cands) < m:
		fit := "none fits"
		if len(cands) > 0 {
			fit = "only " + listGPUs(gpus, cands) + " fit"
			if len(cands) == 1 {
				fit += "s"
			}
		}
		return nil, &Unfit{Reason: "no " + gpuWord(m) + " with " + units + " free units each (" + fit + ")"}
	}
	if required && m > 1 && !links.Known() {
		return nil, &Unfit{Reason: "the pod requires NVLink-connected GPUs (" + gpushare.AnnotationTopology + ": " + gpushare.TopologyRequired +
			") but the node publishes no GPU topology", Unresolvable: true}
	}
	free := func(i int) uint64 { return gpus[i].Free() }
	if set := chooseIn(cands, free, links, m, per, required); set != nil {
		return set, nil
	}
	// Only required fails here: no m candidates are all NVLink-connected.
	reason := "no " + gpuWord(m) + " with " + units + " free units each are all NVLink-connected (" +
		listGPUs(gpus, cands) + " fit; NVLink pairs among them: " + nvlinkPairs(gpus, cands, links) + ")"
	capacity := func(i int) uint64 { return gpus[i].Units }
	return nil, &Unfit{Reason: reason, Unresolvable: chooseIn(large, capacity, links, m, per, true) == nil}
}

// chooseIn is ChooseSet's search over cands (positions, ascending, at least
// m) with free giving each candidate's free units; nil when required finds
// no set.
func chooseIn(cands []int, free func(i int) uint64, links LinkScores, m int, per uint64, required bool) []int {
	if m == 1 || uniform(cands, links, required) {
		return leastFree(cands, free, m)
	}
	c := len(cands)
	// Candidate-local tables: no position indirection in the inner loops.
	sc := make([]int32, c*c)
	nv := make([]bool, c*c)
	left := make([]uint64, c)
	for x, i := range cands {
		left[x] = free(i) - per
		for y, j := range cands {
			sc[x*c+y] = int32(links.Score(i, j))
			nv[x*c+y] = links.NVLink(i, j)
		}
	}
	var best []int
	if binomial(c, m, exhaustiveLimit) <= exhaustiveLimit {
		best = exhaustive(sc, nv, left, c, m, required)
	} else {
		best = greedy(sc, nv, left, c, m, required)
	}
	if best == nil {
		return nil
	}
	out := make([]int, m)
	for k, x := range best {
		out[k] = cands[x]
	}
	return out
}

// uniform reports whether every pair of cands scores the same (and, under
// required, every pair is NVLink-connected), so that links cannot tell sets
// apart.
func uniform(cands []int, links LinkScores, required bool) bool {
	if !links.Known() {
		return !required
	}
	s := links.Score(cands[0], cands[1])
	for x, i := range cands {
		for _, j := range cands[x+1:] {
			if links.Score(i, j) != s || required && !links.NVLink(i, j) {
				return false
			}
		}
	}
	return true
}

// leastFree returns the m candidates with the least free units, the lowest
// positions among equals, ascending: the least total leftover, and of the
// sets with that total the lexicographically first.
func leastFree(cands []int, free func(i int) uint64, m int) []int {
	order := slices.Clone(cands)
	slices.SortStableFunc(order, func(a, b int) int {
		fa, fb := free(a), free(b)
		switch {
		case fa < fb:
			return -1
		case fa > fb:
			return 1
		}
		return 0
	})
	out := order[:m]
	slices.Sort(out)
	return out
}

// exhaustive scores every m-set of the c candidates in lexicographic order
// and keeps the first best; nil when required allows none.
func exhaustive(sc []int32, nv []bool, left []uint64, c, m int, required bool) []int {
	var (
		cur     = make([]int, 0, m)
		best    []int
		bestS   setScore
		recurse func(from, sum, mn int, l uint64)
	)
	recurse = func(from, sum, mn int, l uint64) {
		if len(cur) == m {
			s := setScore{sum, mn, l}
			if best == nil || s.better(bestS) {
				best, bestS = append(best[:0], cur...), s
			}
			return
		}
	next:
		for x := from; x <= c-(m-len(cur)); x++ {
			add, amin := 0, mn
			row := sc[x*c : x*c+c]
			for _, y := range cur {
				if required && !nv[x*c+y] {
					continue next
				}
				add += int(row[y])
				amin = min(amin, int(row[y]))
			}
			cur = append(cur, x)
			recurse(x+1, sum+add, amin, l+left[x])
			cur = cur[:len(cur)-1]
		}
	}
	recurse(0, 0, math.MaxInt, 0)
	return best
}

// greedy is ChooseSet's search beyond exhaustiveLimit (see ChooseSet):
// every candidate in turn seeds a set that grows one GPU at a time, and the
// best complete set wins. O(c²·m) for c candidates.
func greedy(sc []int32, nv []bool, left []uint64, c, m int, required bool) []int {
	var (
		best  []int
		bestS setScore
		in    = make([]bool, c)
		add   = make([]int, c) // sum of scores to the set so far
		amin  = make([]int, c) // lowest score to the set so far
		set   = make([]int, 0, m)
	)
	for x := range c {
		clear(in)
		set = append(set[:0], x)
		in[x] = true
		s := setScore{0, math.MaxInt, left[x]}
		for z := range c {
			add[z], amin[z] = int(sc[z*c+x]), int(sc[z*c+x])
		}
		for len(set) < m {
			pick := -1
			for z := range c {
				if in[z] || required && !connectedToAll(nv, c, z, set) {
					continue
				}
				if pick < 0 || add[z] > add[pick] || add[z] == add[pick] &&
					(amin[z] > amin[pick] || amin[z] == amin[pick] && left[z] < left[pick]) {
					pick = z
				}
			}
			if pick < 0 {
				break
			}
			set = append(set, pick)
			in[pick] = true
			s.sum += add[pick]
			s.min = min(s.min, amin[pick])
			s.left += left[pick]
			for z := range c {
				add[z] += int(sc[z*c+pick])
				amin[z] = min(amin[z], int(sc[z*c+pick]))
			}
		}
		if len(set) < m {
			continue
		}
		if best == nil || s.better(bestS) || !bestS.better(s) && slices.Compare(sortedInto(set), best) < 0 {
			best, bestS = slices.Clone(sortedInto(set)), s
		}
	}
	return best
}

// sortedInto sorts set in place and returns it: the order of growth no
// longer matters once a set is complete.
func sortedInto(set []int) []int {
	slices.Sort(set)
	return set
}

func connectedToAll(nv []bool, c, z int, set []int) bool {
	for _, y := range set {
		if !nv[z*c+y] {
			return false
		}
	}
	return true
}

// binomial is C(n, k), or more than limit when it exceeds limit.
func binomial(n, k, limit int) int {
	k = min(k, n-k)
	if k < 0 {
		return 0
	}
	r := 1
	for i := 1; i <= k; i++ {
		r = r * (n - k + i) / i // exact: r is C(n-k+i, i) after each step
		if r > limit {
			return limit + 1
		}
	}
	return r
}

// listGPUs names the GPUs at positions by index for a reason: "GPUs 0, 2",
// "GPU 3", or "no GPU".
func listGPUs(gpus []GPU, positions []int) string {
	switch len(positions) {
	case 0:
		return "no GPU"
	case 1:
		return "GPU " + strconv.Itoa(gpus[positions[0]].Index)
	}
	names := make([]string, len(positions))
	for k, i := range positions {
		names[k] = strconv.Itoa(gpus[i].Index)
	}
	return "GPUs " + strings.Join(names, ", ")
}

// nvlinkPairs lists the NVLink-connected pairs among positions by GPU index,
// "0-1, 2-3", at most 16 of them; "none" when there are none.
func nvlinkPairs(gpus []GPU, positions []int, links LinkScores) string {
	const most = 16
	var pairs []string
	n := 0
	for x, i := range positions {
		for _, j := range positions[x+1:] {
			if links.NVLink(i, j) {
				if n < most {
					pairs = append(pairs, strconv.Itoa(gpus[i].Index)+"-"+strconv.Itoa(gpus[j].Index))
				}
				n++
			}
		}
	}
	if n == 0 {
		return "none"
	}
	if n > most {
		pairs = append(pairs, "and "+strconv.Itoa(n-most)+" more")
	}
	return strings.Join(pairs, ", ")
}
