package packing

import (
	"container/heap"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

// Tie says how the simulated scheduler chooses among nodes with the same score.
type Tie int

const (
	// TieLowest takes the lowest node index: deterministic, and with
	// allocator.FirstFit (every fitting node scores the same) classic first fit.
	TieLowest Tie = iota
	// TieRandom takes a seeded random node among the best, as
	// kube-scheduler's selectHost does.
	TieRandom
)

// String returns the tie rule's name.
func (t Tie) String() string {
	if t == TieRandom {
		return "random"
	}
	return "lowest"
}

// Options are the simulated scheduler's settings.
type Options struct {
	Policy allocator.Policy
	Ties   Tie
	Seed   uint64 // for TieRandom
	// Exhaustive asks the allocator about every node for every attempt.
	// Without it the simulator skips, exactly, what cannot fit: a node whose
	// largest free GPU is smaller than the pod, and in a retry round a pod no
	// smaller than one that already failed in that round. Both shortcuts hold
	// only because every pod is one container and nothing is in flight;
	// tests check that they change no result. For multi-GPU pods a node is
	// skipped when its largest free GPU is smaller than the pod's share of
	// one GPU, and a pod when one of no more GPUs and no larger share
	// already failed in that round.
	Exhaustive bool
	// NodeScore is how nodes are ranked: by the extender's prioritize (the
	// default), or by kube-scheduler's NodeResourcesFit MostAllocated on the
	// node's total gpu-mem, for a configuration without the prioritize verb.
	NodeScore NodeScore
	// Blind leaves every node's Links zero (an unknown topology, as from a
	// device plugin that predates links), so multi-GPU sets are chosen by
	// best fit alone: the topology-blind baseline. Whether a set honours
	// the topology is still judged by the fleet's real links.
	Blind bool
	// Placer, when set, chooses nodes and GPUs instead of the extender's
	// filter, prioritize and bind (Policy, NodeScore and Blind then do not
	// apply): another scheduler's model, such as kube-scheduler's own DRA
	// allocator (cmd/packbench/dra). Each run makes a fresh one.
	Placer NewPlacer
}

// Placer is a scheduler the simulation replays pods through in place of the
// extender: it keeps its own state, sees the nodes' snapshots (what every
// earlier placement left on them), and says where each pod goes. The
// simulation charges what it returns on the snapshots and checks it: a GPU
// charged over its size, a pod given other shares than it asked for, is
// ErrBookkeeping.
type Placer interface {
	// Place chooses the node and GPUs of p, or reports (ok false) that it
	// fits on no node now. nodes are read-only.
	Place(p Pod, nodes []allocator.Node) (pl Placement, ok bool, err error)
	// Release forgets p's placement: the pod departed.
	Release(p Pod) error
}

// Placement is where a Placer put a pod: the node's index in the fleet's
// order and the GiB charged on each GPU index: one GPU with the pod's GiB,
// or for a multi-GPU pod M distinct GPUs with GiB/M each.
type Placement struct {
	Node    int
	Charges map[int]uint64
}

// NewPlacer makes a fresh Placer for one run over fleet f with the run's
// options (Ties and Seed for its node choice, Exhaustive to ask it to skip
// nothing).
type NewPlacer func(f Fleet, opt Options) (Placer, error)

// name is the policy's name in results; "placer" for a Placer's run, which
// RunScenario labels with the run's name.
func (o Options) name() string {
	if o.Placer != nil {
		return "placer"
	}
	return o.Policy.String()
}

// NodeScore names a way to rank the nodes a pod fits on.
type NodeScore int

const (
	// ScoreExtender is allocator.Score, the extender's prioritize verb.
	ScoreExtender NodeScore = iota
	// ScoreMostAllocated is kube-scheduler's NodeResourcesFit scoring
	// strategy MostAllocated with aliyun.com/gpu-mem as its one resource:
	// the node's requested units with the pod's, times 100, over its
	// allocatable units, in integers. It sees the node's total, not its GPUs.
	ScoreMostAllocated
)

// score ranks node n for request r.
func (s NodeScore) score(n *allocator.Node, r allocator.Request, policy allocator.Policy) int64 {
	if s != ScoreMostAllocated {
		return allocator.Score(n, r, policy)
	}
	var used, total uint64
	for _, g := range n.GPUs {
		used, total = used+g.Used, total+g.Units
	}
	if total == 0 {
		return 0
	}
	return int64((used + r.Units) * 100 / total)
}

// ErrBookkeeping is a broken invariant of the simulation: a GPU charged over
// its size, a release of more than was charged. It never happens unless the
// allocator or the simulator is wrong.
var ErrBookkeeping = errors.New("packing: bookkeeping broken")

// cluster is the fleet's state as the extender's cache would hold it.
type cluster struct {
	opt       Options
	rng       *rand.Rand
	nodes     []allocator.Node
	maxFree   []uint64 // per node: its largest free GPU
	capacity  uint64
	allocated uint64 // GiB charged, fleet-wide
	cards     int    // GPUs with something charged
	// truth is every node's real topology, which Blind hides from the
	// allocator but not from the measurement.
	truth []allocator.LinkScores
	topo  TopologyStats
	// placer replaces allocator.Place and the node ranking (Options.Placer).
	placer Placer
}

// placed is where a pod went: its node and the GiB charged per GPU index,
// and a multi-GPU pod's set.
type placed struct {
	node    int
	charges map[int]uint64
	set     gpushare.GPUSet
}

// TopologyStats is what a run did with multi-GPU pods (issue 15), over
// every placement of the run: how many it placed, and how many of those got
// a set whose every pair is NVLink-connected by the fleet's real links
// (topology honoured), also in a blind run. Available counts the placements
// made while some node of the fleet had such a set with room for the pod:
// what a scheduler could have honoured at that moment, node choice included.
type TopologyStats struct {
	Placed    int          `json:"placed"`
	Honoured  int          `json:"honoured"`
	Available int          `json:"available"`
	Rate      float64      `json:"honoured_rate"` // Honoured / Placed
	ByCount   []CountStats `json:"by_count"`      // by GPUs per pod, fewest first
}

// CountStats is TopologyStats for the pods of one GPU count.
type CountStats struct {
	GPUs      int     `json:"gpus"`
	Placed    int     `json:"placed"`
	Honoured  int     `json:"honoured"`
	Available int     `json:"available"`
	Rate      float64 `json:"honoured_rate"`
}

// add counts one placement of a count-GPU pod.
func (t *TopologyStats) add(count int, honoured, available bool) {
	i := slices.IndexFunc(t.ByCount, func(c CountStats) bool { return c.GPUs == count })
	if i < 0 {
		t.ByCount = append(t.ByCount, CountStats{GPUs: count})
		slices.SortFunc(t.ByCount, func(a, b CountStats) int { return a.GPUs - b.GPUs })
		i = slices.IndexFunc(t.ByCount, func(c CountStats) bool { return c.GPUs == count })
	}
	b := func(x bool) int {
		if x {
			return 1
		}
		return 0
	}
	c := &t.ByCount[i]
	c.Placed++
	c.Honoured += b(honoured)
	c.Available += b(available)
	t.Placed++
	t.Honoured += b(honoured)
	t.Available += b(available)
}

// done fills the rates and returns a copy of t, or nil when the workload has
// no multi-GPU pod (so single-GPU reports stay as they were).
func (t TopologyStats) done(pods []Pod) *TopologyStats {
	if !slices.ContainsFunc(pods, func(p Pod) bool { return p.Count() > 1 }) {
		return nil
	}
	t.ByCount = slices.Clone(t.ByCount)
	if t.Placed > 0 {
		t.Rate = float64(t.Honoured) / float64(t.Placed)
	}
	for i := range t.ByCount {
		if c := &t.ByCount[i]; c.Placed > 0 {
			c.Rate = float64(c.Honoured) / float64(c.Placed)
		}
	}
	return &t
}

func newCluster(f Fleet, opt Options) (*cluster, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	c := &cluster{opt: opt, nodes: f.Nodes(), capacity: f.CapacityGiB(), rng: rand.New(rand.NewPCG(opt.Seed, 0x5851f42d4c957f2d))}
	c.maxFree = make([]uint64, len(c.nodes))
	c.truth = make([]allocator.LinkScores, len(c.nodes))
	for i := range c.nodes {
		c.maxFree[i] = largestFree(&c.nodes[i])
		c.truth[i] = c.nodes[i].Links
		if opt.Blind {
			c.nodes[i].Links = allocator.LinkScores{}
		}
	}
	if opt.Placer != nil {
		p, err := opt.Placer(f, opt)
		if err != nil {
			return nil, err
		}
		c.placer = p
	}
	return c, nil
}

func largestFree(n *allocator.Node) uint64 {
	var m uint64
	for _, g := range n.GPUs {
		if g.Healthy {
			m = max(m, g.Free())
		}
	}
	return m
}

// request is the allocator's view of a one-container pod; a multi-GPU pod
// asks, as aliyun.com/gpu-count does, for GiB/GPUs on each of GPUs GPUs
// (preferred topology: links are not required).
func request(p Pod) allocator.Request {
	cs := []gpushare.ContainerRequest{{Name: "main", Index: 0, Units: p.GiB}}
	r := allocator.Request{Pod: "default/pod-" + strconv.Itoa(p.ID), Containers: cs, Units: gpushare.PodUnits(cs)}
	if p.Count() > 1 {
		r.GPUs = gpushare.MultiGPU{Count: p.Count()}
	}
	return r
}

// nvlinkSet reports whether every pair of set's GPUs on node i is
// NVLink-connected by the node's real links.
func (c *cluster) nvlinkSet(i int, set gpushare.GPUSet) bool {
	var pos []int
	for k, g := range c.nodes[i].GPUs {
		if set.Has(g.Index) {
			pos = append(pos, k)
		}
	}
	for x, a := range pos {
		for _, b := range pos[x+1:] {
			if !c.truth[i].NVLink(a, b) {
				return false
			}
		}
	}
	return len(pos) > 1
}

// nvlinkRoom reports whether some node has count NVLink-connected GPUs
// (by its real links) with per GiB free each.
func (c *cluster) nvlinkRoom(count int, per uint64) bool {
	for i := range c.nodes {
		if c.maxFree[i] < per || !c.truth[i].Known() {
			continue
		}
		if _, unfit := allocator.ChooseSet(c.nodes[i].GPUs, nil, c.truth[i], count, per, true); unfit == nil {
			return true
		}
	}
	return false
}

// place runs filter, prioritize and bind for p; false when no node passes.
func (c *cluster) place(p Pod) (placed, bool, error) {
	if c.placer != nil {
		return c.placeWith(p)
	}
	r := request(p)
	per := p.PerGPU()
	best, ties := -1, 0
	var bestScore int64
	var bestPlacement allocator.Placement
	for i := range c.nodes {
		if !c.opt.Exhaustive && c.maxFree[i] < per {
			continue
		}
		n := &c.nodes[i]
		pl, unfit := allocator.Place(n, r, c.opt.Policy)
		if unfit != nil {
			continue
		}
		score := c.opt.NodeScore.score(n, r, c.opt.Policy)
		switch {
		case best < 0 || score > bestScore:
			best, bestScore, bestPlacement, ties = i, score, pl, 1
		case score == bestScore && c.opt.Ties == TieRandom:
			ties++
			if c.rng.IntN(ties) == 0 {
				best, bestPlacement = i, pl
			}
		}
	}
	if best < 0 {
		return placed{}, false, nil
	}
	out := placed{node: best, charges: allocator.Charges(r, bestPlacement), set: bestPlacement.Set}
	if m := p.Count(); m > 1 {
		if out.set.Len() != m || len(out.charges) != m {
			return placed{}, false, fmt.Errorf("%w: pod %d asks for %d GPUs, got %v", ErrBookkeeping, p.ID, m, out.charges)
		}
		c.topo.add(m, c.nvlinkSet(best, out.set), c.nvlinkRoom(m, per))
	}
	return out, true, c.apply(out, true)
}

// placeWith asks the placer where p goes, checks that it got what it asked
// for (GiB/M on each of M distinct GPUs of one node) and charges it.
func (c *cluster) placeWith(p Pod) (placed, bool, error) {
	pl, ok, err := c.placer.Place(p, c.nodes)
	if err != nil || !ok {
		return placed{}, false, err
	}
	m, per := p.Count(), p.PerGPU()
	if pl.Node < 0 || pl.Node >= len(c.nodes) || len(pl.Charges) != m {
		return placed{}, false, fmt.Errorf("%w: pod %d (%d GPUs) placed on node %d with charges %v", ErrBookkeeping, p.ID, m, pl.Node, pl.Charges)
	}
	out := placed{node: pl.Node, charges: pl.Charges}
	for idx, units := range pl.Charges {
		if units != per {
			return placed{}, false, fmt.Errorf("%w: pod %d asks for %d GiB per GPU, charged %v", ErrBookkeeping, p.ID, per, pl.Charges)
		}
		out.set |= gpushare.NewGPUSet(idx)
	}
	if m > 1 {
		c.topo.add(m, c.nvlinkSet(pl.Node, out.set), c.nvlinkRoom(m, per))
	}
	return out, true, c.apply(out, true)
}

// release undoes what pod p was charged: the departure.
func (c *cluster) release(p Pod, at placed) error {
	if c.placer != nil {
		if err := c.placer.Release(p); err != nil {
			return err
		}
	}
	return c.apply(at, false)
}

// apply charges (or releases) pl, rebuilding the node's snapshot: the cache
// never modifies a snapshot it has handed out, and neither does this.
func (c *cluster) apply(pl placed, charge bool) error {
	n := c.nodes[pl.node]
	gpus := slices.Clone(n.GPUs)
	for idx, units := range pl.charges {
		i := slices.IndexFunc(gpus, func(g allocator.GPU) bool { return g.Index == idx })
		if i < 0 {
			return fmt.Errorf("%w: node %s has no GPU %d", ErrBookkeeping, n.Name, idx)
		}
		g := &gpus[i]
		wasEmpty := g.Used == 0
		if charge {
			if !g.Healthy || g.Used+units > g.Units {
				return fmt.Errorf("%w: %d GiB on GPU %d of %s (%d of %d used)", ErrBookkeeping, units, idx, n.Name, g.Used, g.Units)
			}
			g.Used += units
			c.allocated += units
		} else {
			if g.Used < units || c.allocated < units {
				return fmt.Errorf("%w: releasing %d GiB from GPU %d of %s with %d used", ErrBookkeeping, units, idx, n.Name, g.Used)
			}
			g.Used -= units
			c.allocated -= units
		}
		switch {
		case wasEmpty && g.Used > 0:
			c.cards++
		case !wasEmpty && g.Used == 0:
			c.cards--
		}
	}
	n.GPUs = gpus
	c.nodes[pl.node] = n
	c.maxFree[pl.node] = largestFree(&c.nodes[pl.node])
	return nil
}

// free returns every GPU's free GiB, node by node.
func (c *cluster) free() []uint64 {
	var out []uint64
	for i := range c.nodes {
		for _, g := range c.nodes[i].GPUs {
			out = append(out, g.Free())
		}
	}
	return out
}

// usedSum adds up what the snapshots say is charged (not the running counter).
func (c *cluster) usedSum() uint64 {
	var s uint64
	for i := range c.nodes {
		for _, g := range c.nodes[i].GPUs {
			s += g.Used
		}
	}
	return s
}

// FillResult is where filling an empty fleet in arrival order stopped.
type FillResult struct {
	Policy      string  `json:"policy"`
	Pods        int     `json:"pods"`         // placed before the first that fits nowhere
	PlacedGiB   uint64  `json:"placed_gib"`   // their memory
	Fraction    float64 `json:"fraction"`     // PlacedGiB / capacity: the ratio to the capacity bound
	CardsOpened int     `json:"cards_opened"` // GPUs with something on them
	FailedGiB   uint64  `json:"failed_gib"`   // size of the first pod that fits nowhere; 0 if all fit
	Complete    bool    `json:"all_placed"`   // the workload ran out first
	LargestFree uint64  `json:"largest_free"` // the largest free GPU when it stopped
	FreeGiB     uint64  `json:"free_gib"`     // all free memory when it stopped
	CardsTotal  int     `json:"cards_total"`  // GPUs in the fleet
	Capacity    uint64  `json:"capacity_gib"` // the fleet's memory
	RatioFFD    float64 `json:"ratio_to_ffd"` // PlacedGiB over the FFD reference's (filled by Compare)
	FFDPods     int     `json:"ffd_pods"`     // the FFD reference's prefix length (filled by Compare)
	// Topology is the multi-GPU pods' placements; nil for workloads without.
	Topology *TopologyStats `json:"topology,omitempty"`
}

// Fill places pods in arrival order on the empty fleet, without departures,
// until the first pod that fits nowhere.
func Fill(f Fleet, pods []Pod, opt Options) (FillResult, error) {
	c, err := newCluster(f, opt)
	if err != nil {
		return FillResult{}, err
	}
	res := FillResult{Policy: opt.name(), Complete: true, Capacity: c.capacity, CardsTotal: len(f.Bins())}
	for _, p := range pods {
		_, ok, err := c.place(p)
		if err != nil {
			return FillResult{}, err
		}
		if !ok {
			res.Complete, res.FailedGiB = false, p.GiB
			break
		}
		res.Pods++
		res.PlacedGiB += p.GiB
	}
	if res.PlacedGiB != c.allocated || c.allocated != c.usedSum() {
		return FillResult{}, fmt.Errorf("%w: placed %d GiB, charged %d, snapshots %d", ErrBookkeeping, res.PlacedGiB, c.allocated, c.usedSum())
	}
	res.CardsOpened = c.cards
	res.Fraction = float64(res.PlacedGiB) / float64(c.capacity)
	res.FreeGiB = c.capacity - c.allocated
	res.LargestFree = slices.Max(c.maxFree)
	res.Topology = c.topo.done(pods)
	return res, nil
}

// FillReference is the FFD reference for Fill: the longest prefix of the
// arrivals that FFD packs whole into the empty fleet. A multi-GPU pod is
// its GPUs' shares, packed as that many independent items (a relaxation:
// FFD may put them on one GPU or on different nodes).
func FillReference(f Fleet, pods []Pod) FillResult {
	items := make([]uint64, 0, len(pods))
	ends := make([]int, len(pods)) // items of pods[:i+1]
	for i, p := range pods {
		for range p.Count() {
			items = append(items, p.PerGPU())
		}
		ends[i] = len(items)
	}
	bins := f.Bins()
	var k int
	var r FFDResult
	if len(items) == len(pods) {
		k, r = FFDPrefix(bins, items)
	} else {
		k, r = ffdPodPrefix(bins, items, ends)
	}
	res := FillResult{Policy: "ffd", Pods: k, PlacedGiB: r.PlacedGiB, CardsOpened: r.BinsUsed, Complete: k == len(pods),
		Capacity: f.CapacityGiB(), CardsTotal: len(bins), FFDPods: k, RatioFFD: 1}
	if k < len(pods) {
		res.FailedGiB = pods[k].GiB
	}
	res.Fraction = float64(res.PlacedGiB) / float64(res.Capacity)
	res.FreeGiB = res.Capacity - res.PlacedGiB
	return res
}

// ffdPodPrefix is FFDPrefix over whole pods: the longest k such that FFD
// packs items[:ends[k-1]], by the same bisection.
func ffdPodPrefix(bins, items []uint64, ends []int) (int, FFDResult) {
	return bisectPrefix(len(ends), func(k int) (bool, FFDResult) {
		n := 0
		if k > 0 {
			n = ends[k-1]
		}
		r := FFD(bins, items[:n])
		return r.Unplaced == 0, r
	})
}

// ChurnOptions set a churn run.
type ChurnOptions struct {
	Options
	Horizon     float64 // simulated seconds; events after it are not run. 0 or +Inf: run every event (drain)
	SampleEvery float64 // seconds between samples; 0: no samples
	RefFrom     float64 // samples at or after this time carry the FFD reference ...
	RefEvery    int     // ... every RefEvery-th of them (0: none)
}

// Sample is the fleet's state at one time (after every event up to then).
type Sample struct {
	T             float64 `json:"t_s"`
	AllocatedGiB  uint64  `json:"allocated_gib"`
	FragmentedGiB uint64  `json:"fragmented_gib"` // free memory no pending pod can use
	// StrandedGiB is the free memory a new pod could not use, averaged over
	// the workload's sizes: sum over sizes s of P(s) x Fragmented(free, s).
	StrandedGiB float64    `json:"stranded_gib"`
	Running     int        `json:"running"`
	Pending     int        `json:"pending"`
	PendingGiB  uint64     `json:"pending_gib"`
	Cards       int        `json:"cards"` // GPUs with something on them
	Ref         *FFDResult `json:"ffd,omitempty"`
}

// ChurnResult is a churn run's samples and counters.
type ChurnResult struct {
	Policy     string   `json:"policy"`
	Ties       string   `json:"ties"`
	Capacity   uint64   `json:"capacity_gib"`
	Cards      int      `json:"cards_total"`
	Samples    []Sample `json:"samples,omitempty"`
	Arrived    int      `json:"arrived"`
	Placements int      `json:"placements"`
	Departures int      `json:"departures"`
	Rejected   int      `json:"rejected"` // larger than every GPU of the fleet
	EndRunning int      `json:"end_running"`
	EndPending int      `json:"end_pending"`
	// EndAllocatedGiB is what the node snapshots have charged at the end.
	EndAllocatedGiB uint64 `json:"end_allocated_gib"`
	// WaitMean is the mean time from arrival to placement of the placed pods, seconds.
	WaitMean float64 `json:"wait_mean_s"`
	// Topology is the multi-GPU pods' placements; nil for workloads without.
	Topology *TopologyStats `json:"topology,omitempty"`
}

type departure struct {
	t   float64
	pod int
	at  placed
}

type departures []departure

func (d departures) Len() int { return len(d) }
func (d departures) Less(i, j int) bool {
	if d[i].t != d[j].t {
		return d[i].t < d[j].t
	}
	return d[i].pod < d[j].pod
}
func (d departures) Swap(i, j int) { d[i], d[j] = d[j], d[i] }
func (d *departures) Push(x any)   { *d = append(*d, x.(departure)) }
func (d *departures) Pop() any {
	old := *d
	x := old[len(old)-1]
	*d = old[:len(old)-1]
	return x
}

// Churn replays pods with their departures: each pod is tried when it
// arrives, waits when it fits nowhere, and is retried (in arrival order,
// smaller ones passing larger ones that still do not fit) after every
// departure. A pod leaves Life seconds after it was placed. At equal times
// departures go first, then arrivals, each by pod ID.
func Churn(f Fleet, pods []Pod, opt ChurnOptions) (ChurnResult, error) {
	if err := CheckWorkload(pods); err != nil {
		return ChurnResult{}, err
	}
	c, err := newCluster(f, opt.Options)
	if err != nil {
		return ChurnResult{}, err
	}
	horizon := opt.Horizon
	if horizon <= 0 {
		horizon = math.Inf(1)
	}
	bins := f.Bins()
	sizes := SizeShares(pods)
	res := ChurnResult{Policy: opt.name(), Ties: opt.Ties.String(), Capacity: c.capacity, Cards: len(bins)}
	var (
		deps     departures
		pending  []int              // pod indices, arrival order
		demand   = map[uint64]int{} // running + pending, per GPU share: a multi-GPU pod counts its GPUs
		next     int                // next arrival
		nSample  int
		refCount int
		waitSum  float64
		running  int
	)
	start := func(i int, t float64) (bool, error) {
		pl, ok, err := c.place(pods[i])
		if err != nil || !ok {
			return false, err
		}
		heap.Push(&deps, departure{t: t + pods[i].Life, pod: i, at: pl})
		res.Placements++
		running++
		waitSum += t - pods[i].At
		return true, nil
	}
	// failed[m] is the smallest share of the pods of m GPUs that failed in
	// this round: a pod of no fewer GPUs and no smaller share cannot fit,
	// since free memory only shrinks within a round.
	var failed [gpushare.MaxGPUsPerNode + 1]uint64
	hopeless := func(p Pod) bool {
		for m := 1; m <= p.Count(); m++ {
			if failed[m] <= p.PerGPU() {
				return true
			}
		}
		return false
	}
	retry := func(t float64) error {
		for m := range failed {
			failed[m] = math.MaxUint64
		}
		kept := pending[:0]
		for _, i := range pending {
			if !c.opt.Exhaustive && hopeless(pods[i]) {
				kept = append(kept, i)
				continue
			}
			ok, err := start(i, t)
			if err != nil {
				return err
			}
			if !ok {
				m := pods[i].Count()
				failed[m] = min(failed[m], pods[i].PerGPU())
				kept = append(kept, i)
			}
		}
		clear(pending[len(kept):])
		pending = kept
		return nil
	}
	sample := func(t float64) {
		s := Sample{T: t, AllocatedGiB: c.allocated, Running: running, Pending: len(pending), Cards: c.cards}
		smallest := uint64(0)
		for _, i := range pending {
			s.PendingGiB += pods[i].GiB
			if per := pods[i].PerGPU(); smallest == 0 || per < smallest {
				smallest = per
			}
		}
		free := c.free()
		s.FragmentedGiB = Fragmented(free, smallest)
		s.StrandedGiB = Stranded(free, sizes)
		if opt.RefEvery > 0 && t >= opt.RefFrom {
			if refCount%opt.RefEvery == 0 {
				r := ffdCounts(bins, countsOf(demand))
				s.Ref = &r
			}
			refCount++
		}
		res.Samples = append(res.Samples, s)
	}
	for {
		t, isDep := math.Inf(1), false
		if next < len(pods) {
			t = pods[next].At
		}
		if len(deps) > 0 && deps[0].t <= t {
			t, isDep = deps[0].t, true
		}
		if math.IsInf(t, 1) || t > horizon {
			break
		}
		for opt.SampleEvery > 0 && float64(nSample)*opt.SampleEvery < t {
			sample(float64(nSample) * opt.SampleEvery)
			nSample++
		}
		if isDep {
			d := heap.Pop(&deps).(departure)
			if err := c.release(pods[d.pod], d.at); err != nil {
				return ChurnResult{}, err
			}
			demand[pods[d.pod].PerGPU()] -= pods[d.pod].Count()
			running--
			res.Departures++
			if err := retry(t); err != nil {
				return ChurnResult{}, err
			}
			continue
		}
		i := next
		next++
		res.Arrived++
		if !f.Holds(pods[i].Count(), pods[i].PerGPU()) {
			res.Rejected++
			continue
		}
		demand[pods[i].PerGPU()] += pods[i].Count()
		ok, err := start(i, t)
		if err != nil {
			return ChurnResult{}, err
		}
		if !ok {
			pending = append(pending, i)
		}
	}
	for opt.SampleEvery > 0 && !math.IsInf(horizon, 1) && float64(nSample)*opt.SampleEvery <= horizon {
		sample(float64(nSample) * opt.SampleEvery)
		nSample++
	}
	if c.allocated != c.usedSum() {
		return ChurnResult{}, fmt.Errorf("%w: counter %d GiB, snapshots %d", ErrBookkeeping, c.allocated, c.usedSum())
	}
	res.EndRunning, res.EndPending, res.EndAllocatedGiB = running, len(pending), c.usedSum()
	if res.Placements > 0 {
		res.WaitMean = waitSum / float64(res.Placements)
	}
	res.Topology = c.topo.done(pods)
	return res, nil
}
