package preempt

import (
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

// Amendment is how the preempt verb changes the victims kube-scheduler chose
// on a node: nothing when the pod fits by GPU once they are gone; otherwise
// the scheduler's victims it can drop (Drop) and the pods it adds (Add).
type Amendment struct {
	Drop []string // UIDs
	Add  []Holder
}

// Amend answers the scheduler's victims theirs (UIDs, GPU pods or not) on n.
// When r fits by Place on n without them, it keeps them unchanged (a zero
// Amendment): the scheduler's choice is sound and evicting more would waste
// pods. Otherwise it keeps every victim the scheduler may have needed for
// something besides GPU memory, and adds the cheapest set of further
// lower-priority GPU pods (Choose) after which r fits; a victim is dropped
// only when mayDrop (the preemptor needs no victim for anything but its
// resources: NeedsOnlyResources) and the victim holds only what the scheduler
// could have chosen it for GPU memory alone (Holder.GPUMemOnly), and then
// only when Choose does not pick it again. ok is false when no eviction makes
// r fit.
//
// The answer always frees a pod slot: it is the scheduler's own set, or it
// adds at least one pod.
func Amend(n *allocator.Node, holders []Holder, theirs []string, r allocator.Request, priority int32, policy allocator.Policy, mayDrop bool) (Amendment, bool) {
	chosen := make(map[string]bool, len(theirs))
	for _, uid := range theirs {
		chosen[uid] = true
	}
	var gone, kept, pool []Holder
	var droppable []string
	for _, h := range holders {
		switch {
		case !chosen[h.UID]:
			pool = append(pool, h)
		case mayDrop && h.GPUMemOnly && h.Evictable && h.Priority < priority:
			gone = append(gone, h)
			pool = append(pool, h)
			droppable = append(droppable, h.UID)
		default:
			gone = append(gone, h)
			kept = append(kept, h)
		}
	}
	if fits(n, gone, r, policy) {
		return Amendment{}, true
	}
	extra, ok := Choose(Without(n, kept), pool, r, priority, policy)
	if !ok {
		return Amendment{}, false
	}
	a := Amendment{}
	for _, h := range extra.Pods {
		if !chosen[h.UID] {
			a.Add = append(a.Add, h)
		}
	}
	for _, uid := range droppable {
		if !slices.ContainsFunc(extra.Pods, func(h Holder) bool { return h.UID == uid }) {
			a.Drop = append(a.Drop, uid)
		}
	}
	return a, true
}

// GPUMemOnly reports whether kube-scheduler can have chosen pod as a victim
// for its GPU memory alone, so that the preempt verb may put another GPU pod
// in its place. Its preemption evicts every lower-priority pod, runs all its
// filters, and gives pods back while the preemptor still passes them, so a
// victim may stand for CPU or memory, a host port, a volume (ReadWriteOncePod
// claims), inter-pod affinity or topology spread. The pod qualifies only if
// it requests no resource but aliyun.com/gpu-mem (pod overhead included),
// opens no host port, mounts no claim and has no required pod affinity or
// anti-affinity: nothing the scheduler could have freed by evicting it
// besides GPU memory and a pod slot. The extender sees neither the node's
// other pods nor its free CPU, so it cannot tell whether the preemptor lacks
// what the pod requests; a pod that requests anything else is kept.
func GPUMemOnly(pod *corev1.Pod) bool {
	for _, q := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range q {
			if !onlyGPUMem(q[i].Resources.Requests) || !onlyGPUMem(q[i].Resources.Limits) {
				return false
			}
			for _, p := range q[i].Ports {
				if p.HostPort != 0 {
					return false
				}
			}
		}
	}
	if !onlyGPUMem(pod.Spec.Overhead) || len(pod.Spec.ResourceClaims) > 0 {
		return false
	}
	for _, v := range pod.Spec.Volumes {
		if v.PersistentVolumeClaim != nil || v.Ephemeral != nil {
			return false
		}
	}
	return !requiresPodAffinity(pod)
}

// NeedsOnlyResources reports whether the preemptor can need victims only for
// resources: it has no required pod anti-affinity or affinity and no hard
// topology spread, which evicting the right pods would satisfy.
func NeedsOnlyResources(pod *corev1.Pod) bool {
	for _, c := range pod.Spec.TopologySpreadConstraints {
		if c.WhenUnsatisfiable == corev1.DoNotSchedule {
			return false
		}
	}
	return !requiresPodAffinity(pod)
}

func requiresPodAffinity(pod *corev1.Pod) bool {
	a := pod.Spec.Affinity
	if a == nil {
		return false
	}
	return (a.PodAffinity != nil && len(a.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution) > 0) ||
		(a.PodAntiAffinity != nil && len(a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) > 0)
}

// onlyGPUMem reports whether l names no resource but gpu-mem with a
// non-zero quantity.
func onlyGPUMem(l corev1.ResourceList) bool {
	for name, q := range l {
		if name != gpushare.ResourceName && !q.IsZero() {
			return false
		}
	}
	return true
}
