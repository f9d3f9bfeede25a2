// Package preempt chooses which pods to evict so that a pod fits on a GPU:
// the scheduler extender's preempt verb. kube-scheduler's own preemption
// weighs a node's total gpu-mem, so its victims may sit on several GPUs and
// still leave no GPU with room; this package weighs each GPU. It is pure
// logic over the allocator's node snapshots: the caller supplies the pods
// charged on the node.
package preempt

import (
	"cmp"
	"slices"

	"github.com/gpushare/gpushare/extender/allocator"
)

// Holder is a pod charged on a node, as preemption weighs it.
type Holder struct {
	UID  string
	Name string // namespace/name, as the node's in-flight entries name it
	// Priority is the pod's spec.priority (0 when unset).
	Priority int32
	Charges  map[int]uint64 // units the pod holds on each GPU index
	// Evictable is false for pods the scheduler must not be told to evict:
	// assumed ones whose bind is not confirmed, and terminating ones, whose
	// memory is on its way back already.
	Evictable bool
	// Terminating is a pod being deleted: its memory is on its way back.
	Terminating bool
	// GPUMemOnly: the scheduler can have chosen the pod as a victim for its
	// GPU memory alone (GPUMemOnly of its spec), so Amend may replace it.
	GPUMemOnly bool
}

// Victims is a choice of pods to evict on one node.
type Victims struct {
	Pods []Holder
	// cost orders choices: the highest victim priority, then how many, then
	// the units evicted (less is better in each).
	top   int32
	units uint64
}

// better reports whether v costs less than w.
func (v Victims) better(w Victims) bool {
	return cmp.Or(cmp.Compare(v.top, w.top), cmp.Compare(len(v.Pods), len(w.Pods)), cmp.Compare(v.units, w.units)) < 0
}

// Choose returns the cheapest set of pods to evict from n, all of priority
// below priority, after which r fits n by Place under policy; ok is false
// when no eviction can make it fit, and the set empty when r fits already.
// Cheapest: the lowest highest priority
// among the victims, then the fewest victims, then the fewest units evicted
// (kube-scheduler's own order between candidate nodes begins the same way).
//
// For every GPU it evicts the lower-priority pods holding memory there, the
// lowest priority and then the largest first, until r fits, and then spares
// every victim r still fits without (the highest priority first); the same
// over the whole node covers pods that need several GPUs. The cheapest of
// these choices wins; each is minimal (no victim can be spared) though not
// always the global minimum. The hold-back rule and GPU health are Place's,
// on the node as it would be without the victims.
func Choose(n *allocator.Node, holders []Holder, r allocator.Request, priority int32, policy allocator.Policy) (Victims, bool) {
	var pool []Holder
	for _, h := range holders {
		if h.Evictable && h.Priority < priority {
			pool = append(pool, h)
		}
	}
	if fits(n, nil, r, policy) {
		return Victims{}, true // nothing to evict
	}
	if !fits(n, pool, r, policy) {
		return Victims{}, false // not even evicting every lower-priority pod helps
	}
	var best Victims
	found := false
	try := func(gpu int) {
		v, ok := evictUntilFits(n, pool, r, policy, gpu)
		if ok && (!found || v.better(best)) {
			best, found = v, true
		}
	}
	for _, g := range n.GPUs {
		try(g.Index)
	}
	try(-1)
	return best, found
}

// evictUntilFits evicts pool's pods holding memory on gpu (every pod of the
// pool when gpu is -1) in eviction order until r fits, then spares what it
// can.
func evictUntilFits(n *allocator.Node, pool []Holder, r allocator.Request, policy allocator.Policy, gpu int) (Victims, bool) {
	var cands []Holder
	for _, h := range pool {
		if gpu < 0 || h.Charges[gpu] > 0 {
			cands = append(cands, h)
		}
	}
	slices.SortStableFunc(cands, func(a, b Holder) int {
		return cmp.Or(cmp.Compare(a.Priority, b.Priority), cmp.Compare(on(b, gpu), on(a, gpu)), cmp.Compare(a.Name, b.Name))
	})
	var victims []Holder
	for _, h := range cands {
		victims = append(victims, h)
		if fits(n, victims, r, policy) {
			return spare(n, victims, r, policy), true
		}
	}
	return Victims{}, false
}

// spare drops every victim r still fits without, trying the highest
// priority first, then the smallest: victims is in eviction order, so from
// its end.
func spare(n *allocator.Node, victims []Holder, r allocator.Request, policy allocator.Policy) Victims {
	for i := len(victims) - 1; i >= 0; i-- {
		rest := slices.Delete(slices.Clone(victims), i, i+1)
		if fits(n, rest, r, policy) {
			victims = rest
		}
	}
	v := Victims{Pods: victims}
	for _, h := range victims {
		v.top = max(v.top, h.Priority)
		for _, u := range h.Charges {
			v.units += u
		}
	}
	return v
}

// on is the units h holds on gpu, or in all when gpu is -1.
func on(h Holder, gpu int) uint64 {
	if gpu >= 0 {
		return h.Charges[gpu]
	}
	var sum uint64
	for _, u := range h.Charges {
		sum += u
	}
	return sum
}

// fits reports whether r fits n once victims are gone.
func fits(n *allocator.Node, victims []Holder, r allocator.Request, policy allocator.Policy) bool {
	_, unfit := allocator.Place(Without(n, victims), r, policy)
	return unfit == nil
}

// Without returns n as it would be without victims: their units off each
// GPU, their in-flight entries gone. n is not modified.
func Without(n *allocator.Node, victims []Holder) *allocator.Node {
	out := *n
	out.GPUs = slices.Clone(n.GPUs)
	names := make(map[string]bool, len(victims))
	for _, h := range victims {
		names[h.Name] = true
		for g, u := range h.Charges {
			if i, ok := slices.BinarySearchFunc(out.GPUs, g, func(x allocator.GPU, t int) int { return x.Index - t }); ok {
				out.GPUs[i].Used -= min(u, out.GPUs[i].Used)
			}
		}
	}
	out.InFlight = nil
	for _, f := range n.InFlight {
		if !names[f.Pod] {
			out.InFlight = append(out.InFlight, f)
		}
	}
	return &out
}
