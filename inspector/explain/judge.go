package explain

import (
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

// judge is one node's verdict for r: the extender's Place on the node's
// snapshot, then, when it does not fit, what kept it off in the terms of
// the issue (fragmentation, in-flight pod, health, tier, topology).
func judge(v *view, pod *corev1.Pod, r allocator.Request, policy allocator.Policy, unit string) NodeVerdict {
	out := NodeVerdict{Name: v.node.Name, Scheduler: schedulerReasons(pod, v.node), MIGGPUs: migIndices(v.mig)}
	for g := range v.unhealthy {
		out.UnhealthyGPUs = append(out.UnhealthyGPUs, g)
	}
	slices.Sort(out.UnhealthyGPUs)
	out.Free, out.LargestFree = usableFree(v.alloc, r)
	p, unfit := allocator.Place(v.alloc, r, policy)
	if unfit == nil {
		out.GPUs = gpusOf(r, p)
		out.Score = allocator.Score(v.alloc, r, policy)
		out.Fits = len(out.Scheduler) == 0
		out.Kind = KindFits
		if !out.Fits {
			out.Kind = KindScheduler
		}
		return out
	}
	out.Reason = unfit.Reason
	out.Kind, out.Detail = classify(v, r, policy, unfit, unit)
	if out.Kind == KindWaiting {
		out.WaitingFor = waitingFor(v.alloc, r)
	}
	return out
}

// classify names what kept r off the node. Each case but the last two is
// tested by changing one thing and placing again with the allocator, so the
// answer follows the extender's rules rather than its reason strings.
func classify(v *view, r allocator.Request, policy allocator.Policy, unfit *allocator.Unfit, unit string) (string, string) {
	n := v.alloc
	switch {
	case !n.GPUShare || len(n.GPUs) == 0:
		return KindNotGPUShare, notGPUShareDetail(v)
	case !slices.ContainsFunc(n.GPUs, func(g allocator.GPU) bool { return g.Healthy }):
		return KindUnhealthy, "every GPU of the node is unhealthy: " + describeUnhealthy(v)
	case fitsWith(n, r, policy, nil, true):
		return KindWaiting, "hold-back rule, docs/design.md rule 2: a container of the same size is in flight on the node"
	case !anyUsable(n, r):
		return KindIsolation, "no healthy GPU of the node offers what the pod's isolation annotations ask"
	case !r.Isolation.Any() && fitsWith(n, r, policy, func(q *allocator.Request) { q.Isolation = allocator.PodIsolation{} }, false):
		return KindIsolation, "the GPUs offering " + r.Isolation.String() + " have no room; GPUs of another tier do"
	case r.GPUs.LinksRequired && fitsWith(n, r, policy, func(q *allocator.Request) { q.GPUs.LinksRequired = false }, false):
		return KindTopology, "no NVLink-connected set of " + strconv.Itoa(r.GPUs.Count) + " GPUs has room (" +
			gpushare.AnnotationTopology + ": " + gpushare.TopologyRequired + "); GPUs without NVLink between them do"
	case unfit.Unresolvable:
		return KindTooBig, "larger than any GPU it may use here, even empty" + notes(v)
	}
	return space(v, r, unit)
}

// fitsWith places r on n after relax changed the request (nil: unchanged)
// and, with dropInFlight, without the node's in-flight pods.
func fitsWith(n *allocator.Node, r allocator.Request, policy allocator.Policy, relax func(*allocator.Request), dropInFlight bool) bool {
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
	_, unfit := allocator.Place(&c, r, policy)
	return unfit == nil
}

// space tells fragmentation (the node has the room, not on one GPU or set)
// from a node that lacks the room.
func space(v *view, r allocator.Request, unit string) (string, string) {
	free, largest := usableFree(v.alloc, r)
	if free < r.Units {
		return KindInsufficient, amount(free, unit) + " free on the node's usable GPUs, the pod needs " + amount(r.Units, unit) + notes(v)
	}
	if r.GPUs.Count > 1 {
		per := r.Units / uint64(r.GPUs.Count)
		return KindFragmented, "fragmentation: " + amount(free, unit) + " free on the node, but not " + strconv.Itoa(r.GPUs.Count) +
			" GPUs with " + amount(per, unit) + " free each" + notes(v)
	}
	return KindFragmented, "fragmentation: " + amount(free, unit) + " free on the node, largest free GPU " + amount(largest, unit) + notes(v)
}

// usableFree sums the free units of the GPUs r may use on n, and the largest.
func usableFree(n *allocator.Node, r allocator.Request) (free, largest uint64) {
	for i, g := range n.GPUs {
		if r.Isolation.Usable(n, i) {
			free += g.Free()
			largest = max(largest, g.Free())
		}
	}
	return free, largest
}

func anyUsable(n *allocator.Node, r allocator.Request) bool {
	for i := range n.GPUs {
		if r.Isolation.Usable(n, i) {
			return true
		}
	}
	return false
}

// waitingFor names the in-flight pods with a container of one of r's sizes:
// the pods the hold-back rule compares r with.
func waitingFor(n *allocator.Node, r allocator.Request) []string {
	var out []string
	for _, p := range n.InFlight {
		for _, s := range p.Slots {
			if slices.ContainsFunc(r.Containers, func(c gpushare.ContainerRequest) bool { return c.Units == s.Units }) {
				out = append(out, p.Pod)
				break
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// gpusOf lists the GPUs placement p charges, ascending.
func gpusOf(r allocator.Request, p allocator.Placement) []int {
	var out []int
	for g := range allocator.Charges(r, p) {
		out = append(out, g)
	}
	slices.Sort(out)
	return out
}

func migIndices(mig []gpushare.SkippedGPU) []int {
	var out []int
	for _, g := range mig {
		out = append(out, g.Index)
	}
	return out
}

// notGPUShareDetail says why a node offers no shared GPU.
func notGPUShareDetail(v *view) string {
	if len(v.mig) > 0 {
		return "its GPUs are skipped by the device plugin: " + describeMIG(v.mig)
	}
	return "no allocatable " + string(gpushare.ResourceName) + ": the gpushare device plugin does not run there"
}

// notes adds the GPUs the pod cannot use on a node that has others.
func notes(v *view) string {
	var parts []string
	if len(v.unhealthy) > 0 {
		parts = append(parts, "unhealthy: "+describeUnhealthy(v))
	}
	if len(v.mig) > 0 {
		parts = append(parts, "skipped: "+describeMIG(v.mig))
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, "; ") + ")"
}

func describeUnhealthy(v *view) string {
	gpus := make([]int, 0, len(v.unhealthy))
	for g := range v.unhealthy {
		gpus = append(gpus, g)
	}
	slices.Sort(gpus)
	parts := make([]string, len(gpus))
	for i, g := range gpus {
		parts[i] = "GPU " + strconv.Itoa(g)
		if why := v.unhealthy[g]; why != "" {
			parts[i] += " " + why
		}
	}
	return strings.Join(parts, ", ")
}

func describeMIG(mig []gpushare.SkippedGPU) string {
	parts := make([]string, len(mig))
	for i, g := range mig {
		parts[i] = "GPU " + strconv.Itoa(g.Index) + " " + g.Reason
	}
	return strings.Join(parts, ", ")
}
