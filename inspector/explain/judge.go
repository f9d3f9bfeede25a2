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
	out.Free, out.LargestFree = allocator.UsableFree(v.alloc, r)
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

// classify names what kept r off the node (the allocator's diagnosis, the
// same the extender's pending-pods gauge counts) and says it in detail.
func classify(v *view, r allocator.Request, policy allocator.Policy, unfit *allocator.Unfit, unit string) (string, string) {
	kind := allocator.Diagnose(v.alloc, r, policy, unfit)
	switch kind {
	case KindNotGPUShare:
		return kind, notGPUShareDetail(v)
	case KindUnhealthy:
		return kind, "every GPU of the node is unhealthy: " + describeUnhealthy(v)
	case KindWaiting:
		return kind, "hold-back rule, docs/design.md rule 2: a container of the same size is in flight on the node"
	case KindIsolation:
		return kind, isolationDetail(v.alloc, r)
	case KindTopology:
		return kind, "no NVLink-connected set of " + strconv.Itoa(r.GPUs.Count) + " GPUs has room (" +
			gpushare.AnnotationTopology + ": " + gpushare.TopologyRequired + "); GPUs without NVLink between them do"
	case KindTooBig:
		return kind, "larger than any GPU it may use here, even empty" + notes(v)
	}
	return space(v, kind, r, unit)
}

// isolationDetail tells a node whose GPUs offer none of what r asks from
// one whose GPUs that offer it are full.
func isolationDetail(n *allocator.Node, r allocator.Request) string {
	for i := range n.GPUs {
		if r.Isolation.Usable(n, i) {
			return "the GPUs offering " + r.Isolation.String() + " have no room; GPUs of another tier do"
		}
	}
	return "no healthy GPU of the node offers what the pod's isolation annotations ask"
}

// space details fragmentation (the node has the room, not on one GPU or
// set) and a node that lacks the room.
func space(v *view, kind string, r allocator.Request, unit string) (string, string) {
	free, largest := allocator.UsableFree(v.alloc, r)
	if kind == KindInsufficient {
		return kind, amount(free, unit) + " free on the node's usable GPUs, the pod needs " + amount(r.Units, unit) + notes(v)
	}
	if r.GPUs.Count > 1 {
		per := r.Units / uint64(r.GPUs.Count)
		return kind, "fragmentation: " + amount(free, unit) + " free on the node, but not " + strconv.Itoa(r.GPUs.Count) +
			" GPUs with " + amount(per, unit) + " free each" + notes(v)
	}
	return kind, "fragmentation: " + amount(free, unit) + " free on the node, largest free GPU " + amount(largest, unit) + notes(v)
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
