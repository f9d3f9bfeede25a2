package allocator

import "slices"

// What keeps a request off a node, in an operator's terms: the inspector's
// `why` and the extender's pending-pods gauge name the same kinds.
const (
	KindNotGPUShare  = "not-gpushare" // no shared GPU on the node
	KindUnhealthy    = "unhealthy"    // no healthy GPU
	KindIsolation    = "isolation"    // the isolation tier or compute limit asked is not offered with room
	KindTopology     = "topology"     // an NVLink-connected set is required and none has room
	KindWaiting      = "waiting"      // held back behind an in-flight pod (design.md, rule 2)
	KindTooBig       = "too-big"      // larger than any GPU it may use there, even empty
	KindFragmented   = "fragmented"   // the room is on the node, not on one GPU (or set)
	KindInsufficient = "insufficient" // not enough free memory on the usable GPUs
)

// UnfitKinds lists the kinds nearest first: a pod that is fragmented on one
// node and too big on another is nearer to fitting through the first.
func UnfitKinds() []string {
	return []string{KindWaiting, KindFragmented, KindInsufficient, KindTooBig, KindIsolation, KindTopology,
		KindUnhealthy, KindNotGPUShare}
}

// Nearest returns, of kinds, the one nearest to fitting (UnfitKinds' order),
// or "" when kinds holds none of them.
func Nearest(kinds ...string) string {
	best := -1
	for _, k := range kinds {
		if i := slices.Index(UnfitKinds(), k); i >= 0 && (best < 0 || i < best) {
			best = i
		}
	}
	if best < 0 {
		return ""
	}
	return UnfitKinds()[best]
}

// Diagnose names what kept r off n, given Place's unfit answer. Each case
// but the last ones is decided by changing one thing and placing again, so
// the answer follows the placement rules rather than their reason strings.
func Diagnose(n *Node, r Request, policy Policy, unfit *Unfit) string {
	switch {
	case !n.GPUShare || len(n.GPUs) == 0:
		return KindNotGPUShare
	case !slices.ContainsFunc(n.GPUs, func(g GPU) bool { return g.Healthy }):
		return KindUnhealthy
	case fitsWith(n, r, policy, nil, true):
		return KindWaiting
	case !anyUsable(n, r):
		return KindIsolation
	case !r.Isolation.Any() && fitsWith(n, r, policy, func(q *Request) { q.Isolation = PodIsolation{} }, false):
		return KindIsolation
	case r.GPUs.LinksRequired && fitsWith(n, r, policy, func(q *Request) { q.GPUs.LinksRequired = false }, false):
		return KindTopology
	case unfit.Unresolvable:
		return KindTooBig
	}
	if free, _ := UsableFree(n, r); free < r.Units {
		return KindInsufficient
	}
	return KindFragmented
}

// fitsWith places r on n after relax changed the request (nil: unchanged)
// and, with dropInFlight, without the node's in-flight pods.
func fitsWith(n *Node, r Request, policy Policy, relax func(*Request), dropInFlight bool) bool {
	if relax == nil && (!dropInFlight || len(n.InFlight) == 0) {
		return false
	}
	c := *n
	if dropInFlight {
		c.InFlight = nil
	}
	if relax != nil {
		relax(&r)
	}
	_, unfit := Place(&c, r, policy)
	return unfit == nil
}

// UsableFree sums the free units of the GPUs r may use on n, and the largest.
func UsableFree(n *Node, r Request) (free, largest uint64) {
	for i, g := range n.GPUs {
		if r.Isolation.Usable(n, i) {
			free += g.Free()
			largest = max(largest, g.Free())
		}
	}
	return free, largest
}

func anyUsable(n *Node, r Request) bool {
	for i := range n.GPUs {
		if r.Isolation.Usable(n, i) {
			return true
		}
	}
	return false
}
