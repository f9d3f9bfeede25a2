package allocator

import (
	"fmt"
	"slices"
	"strconv"

	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

// Reasons shared with the seed extender (contract section 4), kept verbatim
// because operators and tools match on them.
const (
	// ReasonInsufficient is the seed's reason when no single GPU has room.
	ReasonInsufficient = "Insufficient GPU Memory in one device"
	notGPUShareFormat  = "The node %s is not for GPU share, need skip"
)

// Unfit says why a pod does not fit a node.
type Unfit struct {
	Reason string
	// Unresolvable is true when evicting pods cannot help (the node has no
	// sharing GPUs, or the pod is bigger than any of its GPUs), so the
	// scheduler should not try preemption for it.
	Unresolvable bool
	// Waiting is true when the pod fits but the hold-back rule keeps it off
	// every fitting choice until an in-flight pod is allocated: it will fit
	// without anything leaving the node.
	Waiting bool
}

// Error returns the reason, so an Unfit can travel as an error.
func (u *Unfit) Error() string { return u.Reason }

// NotGPUShareReason is the seed's reason for a node without gpu-mem.
func NotGPUShareReason(node string) string { return fmt.Sprintf(notGPUShareFormat, node) }

// constraint is what the hold-back rule leaves open for containers of one size.
type constraint struct {
	gpus    gpushare.GPUSet // the only GPUs allowed (one, or a multi-GPU pod's set), or 0 for any
	pod     string          // the in-flight pod that set gpus, for reasons
	blocked string          // non-empty: no GPU is allowed; names the pod waited for
}

func (c constraint) allows(s gpushare.GPUSet) bool {
	return c.blocked == "" && (c.gpus == 0 || c.gpus == s)
}

// constraints evaluates the hold-back rule for every container size of r:
// an in-flight container of the same size forces the same GPUs, one or a
// multi-GPU pod's ordered set (and so the same GPU sizes and tiers), and
// forbids the node outright when its pod's total
// differs (the plugin would hand out a different ALIYUN_COM_GPU_MEM_POD), when
// its pod's isolation annotations differ (another required tier or compute
// share: another answer), or when two in-flight containers of that size
// already sit on different GPUs or sets.
func constraints(n *Node, r Request) map[uint64]constraint {
	if len(n.InFlight) == 0 {
		return nil
	}
	out := map[uint64]constraint{}
	for _, c := range r.Containers {
		if _, done := out[c.Units]; done {
			continue
		}
		k := constraint{}
		for _, p := range n.InFlight {
			for _, s := range p.Slots {
				if s.Units != c.Units || k.blocked != "" {
					continue
				}
				switch {
				case p.PodUnits != r.Units:
					k.blocked = fmt.Sprintf("waiting for pod %s (a %d-unit container of a %d-unit pod, not yet allocated by the device plugin)", p.Pod, s.Units, p.PodUnits)
				case p.Isolation != r.Isolation:
					k.blocked = fmt.Sprintf("waiting for pod %s (a %d-unit container of a pod with %s, not yet allocated by the device plugin)", p.Pod, s.Units, p.Isolation)
				case k.gpus != 0 && k.gpus != s.GPUs:
					k.blocked = fmt.Sprintf("waiting for pod %s (%d-unit containers in flight on %s and %s)", p.Pod, s.Units, gpusWord(k.gpus), gpusWord(s.GPUs))
				default:
					k.gpus, k.pod = s.GPUs, p.Pod
				}
			}
		}
		out[c.Units] = k
	}
	return out
}

// better reports whether free a beats free b under policy (ties: caller keeps
// the lower index). Under FirstFit nothing beats the first that fits.
func (p Policy) better(a, b uint64) bool {
	switch p {
	case Spread:
		return a > b
	case FirstFit:
		return false
	}
	return a < b
}

// Place decides where r goes on n. It never returns a placement that puts
// more on a GPU than its free units, nor one on an unhealthy GPU.
func Place(n *Node, r Request, policy Policy) (Placement, *Unfit) {
	if !n.GPUShare || len(n.GPUs) == 0 {
		return Placement{}, &Unfit{Reason: NotGPUShareReason(n.Name), Unresolvable: true}
	}
	if r.Units == 0 {
		return Placement{}, &Unfit{Reason: "pod " + r.Pod + " requests no gpu-mem", Unresolvable: true}
	}
	// From here on, a GPU r may not use (unhealthy, or not offering what its
	// isolation annotations ask) is as good as absent.
	iso := r.Isolation
	var largest, usableTotal uint64
	healthy, usable := false, false
	for i, g := range n.GPUs {
		healthy = healthy || g.Healthy
		if iso.usable(g, n, i) {
			usable = true
			largest = max(largest, g.Units)
			usableTotal += g.Units
		}
	}
	if !healthy {
		return Placement{}, &Unfit{Reason: "node " + n.Name + " has no healthy GPU", Unresolvable: true}
	}
	if !usable {
		// Healthy GPUs, none offering what the pod asks.
		return Placement{}, &Unfit{Reason: r.Isolation.unoffered(n), Unresolvable: true}
	}
	cons := constraints(n, r)
	if r.GPUs.Count > 1 {
		return placeMulti(n, r, cons)
	}
	// Whole pod on one GPU.
	best, fitting := -1, false
	var heldOff gpushare.GPUSet // the last GPU the hold-back rule refused, named only if nothing fits
	for i, g := range n.GPUs {
		if !iso.usable(g, n, i) || g.Free() < r.Units {
			continue
		}
		fitting = true
		if set := gpushare.NewGPUSet(g.Index); !allowedOn(cons, r.Containers, set) {
			heldOff = set
			continue
		}
		if best < 0 || policy.better(g.Free(), n.GPUs[best].Free()) ||
			n.Links.Known() && g.Free() == n.GPUs[best].Free() && n.Links.PreferSingle(n.GPUs, policy, i, best) {
			best = i
		}
	}
	if best >= 0 {
		g := n.GPUs[best]
		return Placement{Home: g.Index, DevUnits: g.Units}, nil
	}
	if fitting {
		return Placement{}, &Unfit{Reason: blockedOn(cons, r.Containers, heldOff), Waiting: true}
	}
	if r.regular() < 2 {
		if r.Units > largest {
			return Placement{}, &Unfit{Reason: tooBig(n, r, r.Units, largest), Unresolvable: true}
		}
		return Placement{}, &Unfit{Reason: ReasonInsufficient}
	}
	return split(n, r, policy, cons, largest, usableTotal)
}

// allowedOn reports whether the hold-back rule lets all of containers go on
// the GPUs s; blockedOn says why not. Apart, because the reason is formatted
// only for a pod that fits nowhere else.
func allowedOn(cons map[uint64]constraint, containers []gpushare.ContainerRequest, s gpushare.GPUSet) bool {
	for _, c := range containers {
		if k, ok := cons[c.Units]; ok && !k.allows(s) {
			return false
		}
	}
	return true
}

// blockedOn returns why the hold-back rule forbids putting all of
// containers on the GPUs s; empty when allowed. It takes the containers, not
// the Request: called per GPU, a whole Request no longer fits the registers.
func blockedOn(cons map[uint64]constraint, containers []gpushare.ContainerRequest, s gpushare.GPUSet) string {
	for _, c := range containers {
		if k, ok := cons[c.Units]; ok && !k.allows(s) {
			if k.blocked != "" {
				return k.blocked
			}
			return fmt.Sprintf("waiting for an in-flight %d-unit container on %s of this node (pod %s) to be allocated by the device plugin", c.Units, gpusWord(k.gpus), k.pod)
		}
	}
	return ""
}

// gpusWord names a set of GPUs for a reason: "GPU 3" or "GPUs 0,1".
func gpusWord(s gpushare.GPUSet) string {
	if s.Len() == 1 {
		return "GPU " + s.String()
	}
	return "GPUs " + s.String()
}

// tooBig is the reason for a request no GPU of n that r may use can hold
// even when empty.
func tooBig(n *Node, r Request, units, largest uint64) string {
	return "pod requests " + strconv.FormatUint(units, 10) + " units of GPU memory on one GPU, more than the largest healthy GPU of node " +
		n.Name + r.Isolation.qualifier() + " has (" + strconv.FormatUint(largest, 10) + ")"
}

// split places each regular container of r on its own choice of GPU, init
// and sidecar containers on a home GPU, greedily from the largest container.
func split(n *Node, r Request, policy Policy, cons map[uint64]constraint, largest, usableTotal uint64) (Placement, *Unfit) {
	parts := splitParts(r)
	if parts.biggest > largest || parts.initPeak > largest {
		return Placement{}, &Unfit{Reason: tooBig(n, r, max(parts.biggest, parts.initPeak), largest), Unresolvable: true}
	}
	if r.Units > usableTotal {
		return Placement{}, &Unfit{Reason: "pod requests " + strconv.FormatUint(r.Units, 10) +
			" units of GPU memory, more than all healthy GPUs of node " + n.Name + r.Isolation.qualifier() + " have together", Unresolvable: true}
	}
	var heldBy string
	for _, h := range homeOrder(n, r, policy, parts) {
		home := -1
		if h >= 0 {
			home = n.GPUs[h].Index
			if why := blockedInit(cons, r.Containers, parts.inits, home); why != "" {
				heldBy = why
				continue
			}
		}
		containers, why := spreadRegular(n, r, policy, cons, parts, h)
		if why != "" {
			heldBy = why
		}
		if containers == nil {
			continue
		}
		p := Placement{Home: home, Split: true, Containers: containers}
		// The home must also hold the init peak next to the regular containers placed there.
		if h >= 0 && Charges(r, p)[home] > n.GPUs[h].Free() {
			continue
		}
		p.DevUnits = splitDevUnits(n, h, containers)
		return p, nil
	}
	if heldBy != "" {
		return Placement{}, &Unfit{Reason: heldBy, Waiting: true}
	}
	return Placement{}, &Unfit{Reason: ReasonInsufficient}
}

// splitShape is a split pod's containers sorted for placement: its init
// containers (all on the home GPU) with their peak and sidecar total, and its
// regular containers largest first, spec order on ties (deterministic).
type splitShape struct {
	inits, regular              []int // indices into r.Containers
	initPeak, sidecars, biggest uint64
}

func splitParts(r Request) splitShape {
	var s splitShape
	s.regular = make([]int, 0, len(r.Containers))
	for i, c := range r.Containers {
		if c.Init {
			s.inits = append(s.inits, i)
			continue
		}
		s.regular = append(s.regular, i)
		s.biggest = max(s.biggest, c.Units)
	}
	if len(s.inits) > 0 {
		sub := make([]gpushare.ContainerRequest, 0, len(s.inits))
		for _, i := range s.inits {
			sub = append(sub, r.Containers[i])
			if r.Containers[i].Sidecar {
				s.sidecars += r.Containers[i].Units
			}
		}
		s.initPeak = gpushare.PodUnits(sub)
	}
	slices.SortStableFunc(s.regular, func(a, b int) int {
		ua, ub := r.Containers[a].Units, r.Containers[b].Units
		switch {
		case ua > ub:
			return -1
		case ua < ub:
			return 1
		}
		return r.Containers[a].Index - r.Containers[b].Index
	})
	return s
}

// homeOrder lists the positions of the GPUs that may hold the init
// containers, in policy order so they land where the policy wants; [-1]
// (no home) for a pod without init containers.
func homeOrder(n *Node, r Request, policy Policy, s splitShape) []int {
	if len(s.inits) == 0 {
		return []int{-1}
	}
	var homes []int
	for i, g := range n.GPUs {
		if r.Isolation.usable(g, n, i) && g.Free() >= max(s.initPeak, s.sidecars) {
			homes = append(homes, i)
		}
	}
	slices.SortStableFunc(homes, func(a, b int) int {
		fa, fb := n.GPUs[a].Free(), n.GPUs[b].Free()
		switch {
		case policy.better(fa, fb):
			return -1
		case policy.better(fb, fa):
			return 1
		}
		return 0
	})
	return homes
}

// spreadRegular places the regular containers one GPU each by policy, with
// the home at position h (-1: none) already holding the sidecars. It returns
// container index → GPU index, nil when some container fits nowhere, and the
// hold-back reason of the last GPU the rule kept from a container.
func spreadRegular(n *Node, r Request, policy Policy, cons map[uint64]constraint, s splitShape, h int) (map[int]int, string) {
	iso := r.Isolation
	remaining := make([]uint64, len(n.GPUs))
	for i, g := range n.GPUs {
		if iso.usable(g, n, i) {
			remaining[i] = g.Free()
		}
	}
	if h >= 0 {
		remaining[h] -= s.sidecars
	}
	var heldBy string
	containers := make(map[int]int, len(s.regular))
	for _, ci := range s.regular {
		c := r.Containers[ci]
		pick := -1
		for i, g := range n.GPUs {
			if remaining[i] < c.Units || !iso.usable(g, n, i) {
				continue
			}
			if k, has := cons[c.Units]; has && !k.allows(gpushare.NewGPUSet(g.Index)) {
				heldBy = blockedOn(cons, r.Containers[ci:ci+1], gpushare.NewGPUSet(g.Index))
				continue
			}
			if pick < 0 || policy.better(remaining[i], remaining[pick]) {
				pick = i
			}
		}
		if pick < 0 {
			return nil, heldBy
		}
		remaining[pick] -= c.Units
		containers[c.Index] = n.GPUs[pick].Index
	}
	return containers, heldBy
}

// splitDevUnits is the size a split pod's environment names: its home GPU's,
// else the lowest-indexed GPU it uses.
func splitDevUnits(n *Node, h int, containers map[int]int) uint64 {
	if h >= 0 {
		return n.GPUs[h].Units
	}
	low := -1
	for _, g := range containers {
		if low < 0 || g < low {
			low = g
		}
	}
	for _, g := range n.GPUs {
		if g.Index == low {
			return g.Units
		}
	}
	return 0
}

// blockedInit checks the hold-back rule for the init containers on home.
func blockedInit(cons map[uint64]constraint, containers []gpushare.ContainerRequest, inits []int, home int) string {
	sub := make([]gpushare.ContainerRequest, 0, len(inits))
	for _, i := range inits {
		sub = append(sub, containers[i])
	}
	return blockedOn(cons, sub, gpushare.NewGPUSet(home))
}

// Score rates n for r in [0, MaxExtenderPriority]: how full the GPUs that r
// would use end up, so BestFit prefers nodes where cards fill before new ones
// open and Spread the reverse. FirstFit scores every node r fits the same
// (MaxExtenderPriority): it leaves the choice of node to the scheduler. A node
// r does not fit scores 0.
func Score(n *Node, r Request, policy Policy) int64 {
	p, unfit := Place(n, r, policy)
	if unfit != nil {
		return extenderv1.MinExtenderPriority
	}
	return ScorePlaced(n, r, p, policy)
}

// ScorePlaced is Score for a placement Place already chose on n, so a caller
// that placed r (a scheduler plugin's Filter) need not place it again.
func ScorePlaced(n *Node, r Request, p Placement, policy Policy) int64 {
	if policy == FirstFit {
		return extenderv1.MaxExtenderPriority
	}
	var used, size uint64
	add := func(g int, units uint64) {
		if i, ok := slices.BinarySearchFunc(n.GPUs, g, func(x GPU, t int) int { return x.Index - t }); ok {
			used += n.GPUs[i].Used + units
			size += n.GPUs[i].Units
		}
	}
	if p.Set == 0 && !p.Split {
		add(p.Home, r.Units) // the common case, without Charges' map
	} else {
		for g, units := range Charges(r, p) {
			add(g, units)
		}
	}
	if size == 0 {
		return extenderv1.MinExtenderPriority
	}
	full := int64(min(used, size) * uint64(extenderv1.MaxExtenderPriority) / size)
	if policy == Spread {
		return extenderv1.MaxExtenderPriority - full
	}
	return full
}
