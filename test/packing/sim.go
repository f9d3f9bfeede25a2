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
	// tests check that they change no result.
	Exhaustive bool
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
}

// placed is where a pod went: its node and the GiB charged per GPU index.
type placed struct {
	node    int
	charges map[int]uint64
}

func newCluster(f Fleet, opt Options) (*cluster, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	c := &cluster{opt: opt, nodes: f.Nodes(), capacity: f.CapacityGiB(), rng: rand.New(rand.NewPCG(opt.Seed, 0x5851f42d4c957f2d))}
	c.maxFree = make([]uint64, len(c.nodes))
	for i := range c.nodes {
		c.maxFree[i] = largestFree(&c.nodes[i])
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

// request is the allocator's view of a one-container pod.
func request(p Pod) allocator.Request {
	cs := []gpushare.ContainerRequest{{Name: "main", Index: 0, Units: p.GiB}}
	return allocator.Request{Pod: "default/pod-" + strconv.Itoa(p.ID), Containers: cs, Units: gpushare.PodUnits(cs)}
}

// place runs filter, prioritize and bind for p; false when no node passes.
func (c *cluster) place(p Pod) (placed, bool, error) {
	r := request(p)
	best, ties := -1, 0
	var bestScore int64
	var bestPlacement allocator.Placement
	for i := range c.nodes {
		if !c.opt.Exhaustive && c.maxFree[i] < r.Units {
			continue
		}
		n := &c.nodes[i]
		pl, unfit := allocator.Place(n, r, c.opt.Policy)
		if unfit != nil {
			continue
		}
		score := allocator.Score(n, r, c.opt.Policy)
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
	out := placed{node: best, charges: allocator.Charges(r, bestPlacement)}
	return out, true, c.apply(out, true)
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
}

// Fill places pods in arrival order on the empty fleet, without departures,
// until the first pod that fits nowhere.
func Fill(f Fleet, pods []Pod, opt Options) (FillResult, error) {
	c, err := newCluster(f, opt)
	if err != nil {
		return FillResult{}, err
	}
	res := FillResult{Policy: opt.Policy.String(), Complete: true, Capacity: c.capacity, CardsTotal: len(f.Bins())}
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
	return res, nil
}

// FillReference is the FFD reference for Fill: the longest prefix of the
// arrivals that FFD packs whole into the empty fleet.
func FillReference(f Fleet, pods []Pod) FillResult {
	items := make([]uint64, len(pods))
	for i, p := range pods {
		items[i] = p.GiB
	}
	bins := f.Bins()
	k, r := FFDPrefix(bins, items)
	res := FillResult{Policy: "ffd", Pods: k, PlacedGiB: r.PlacedGiB, CardsOpened: r.BinsUsed, Complete: k == len(pods),
		Capacity: f.CapacityGiB(), CardsTotal: len(bins), FFDPods: k, RatioFFD: 1}
	if k < len(pods) {
		res.FailedGiB = pods[k].GiB
	}
	res.Fraction = float64(res.PlacedGiB) / float64(res.Capacity)
	res.FreeGiB = res.Capacity - res.PlacedGiB
	return res
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
	largest := f.LargestGiB()
	sizes := SizeShares(pods)
	res := ChurnResult{Policy: opt.Policy.String(), Ties: opt.Ties.String(), Capacity: c.capacity, Cards: len(bins)}
	var (
		deps     departures
		pending  []int              // pod indices, arrival order
		demand   = map[uint64]int{} // running + pending, per size
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
	retry := func(t float64) error {
		failed := uint64(math.MaxUint64)
		kept := pending[:0]
		for _, i := range pending {
			if !c.opt.Exhaustive && pods[i].GiB >= failed {
				kept = append(kept, i)
				continue
			}
			ok, err := start(i, t)
			if err != nil {
				return err
			}
			if !ok {
				failed = min(failed, pods[i].GiB)
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
			if smallest == 0 || pods[i].GiB < smallest {
				smallest = pods[i].GiB
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
			if err := c.apply(d.at, false); err != nil {
				return ChurnResult{}, err
			}
			demand[pods[d.pod].GiB]--
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
		if pods[i].GiB > largest {
			res.Rejected++
			continue
		}
		demand[pods[i].GiB]++
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
	return res, nil
}
