package explain

import (
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

// help lists what would let a pod that fits nowhere be placed, most
// direct first: the in-flight pods it waits for, the least memory to free
// on one GPU, and the largest pod of its kind that fits now.
func help(views []view, pod *corev1.Pod, r allocator.Request, policy allocator.Policy, verdicts []NodeVerdict, unit string) []string {
	var out []string
	for _, v := range verdicts {
		if v.Kind == KindWaiting && len(v.Scheduler) == 0 {
			out = append(out, "on "+v.Name+": the device plugin allocating "+strings.Join(v.WaitingFor, ", ")+
				" (bound, not yet started) releases the hold; the scheduler then retries the pod")
		}
	}
	if s := leastToFree(views, r, verdicts, unit); s != "" {
		out = append(out, s)
	}
	if s := largestFitting(views, pod, r, policy, unit); s != "" {
		out = append(out, s)
	}
	if len(out) == 0 && allKind(verdicts, KindNotGPUShare) {
		out = append(out, "no node shares GPUs: check that the gpushare device plugin runs on the GPU nodes (labelled "+
			gpushare.LabelGPUShare+"="+gpushare.LabelValueTrue+")")
	}
	return out
}

func allKind(verdicts []NodeVerdict, kind string) bool {
	for _, v := range verdicts {
		if v.Kind != kind {
			return false
		}
	}
	return true
}

// leastToFree finds, among fragmented or full nodes the scheduler allows,
// the GPU where freeing the fewest units makes room for a one-GPU pod.
func leastToFree(views []view, r allocator.Request, verdicts []NodeVerdict, unit string) string {
	if r.GPUs.Count > 1 {
		return ""
	}
	var where string
	var need uint64
	for i, v := range verdicts {
		if (v.Kind != KindFragmented && v.Kind != KindInsufficient) || len(v.Scheduler) > 0 {
			continue
		}
		n := views[i].alloc
		for j, g := range n.GPUs {
			if !r.Isolation.Usable(n, j) || g.Units < r.Units {
				continue
			}
			if lack := r.Units - g.Free(); where == "" || lack < need {
				where, need = fmt.Sprintf("GPU %d of %s (%s of %s free)", g.Index, v.Name, amount(g.Free(), unit), amount(g.Units, unit)), lack
			}
		}
	}
	if where == "" {
		return ""
	}
	return "freeing " + amount(need, unit) + " on " + where + " makes room for it"
}

// largestFitting says how large a one-GPU pod like this one (same
// isolation) fits now, and on how many nodes, by placing that size with the
// extender's allocator.
func largestFitting(views []view, pod *corev1.Pod, r allocator.Request, policy allocator.Policy, unit string) string {
	if r.GPUs.Count > 1 {
		return ""
	}
	var size uint64
	for i := range views {
		if len(schedulerReasons(pod, views[i].node)) == 0 {
			_, largest := allocator.UsableFree(views[i].alloc, r)
			size = max(size, largest)
		}
	}
	if size == 0 || size >= r.Units {
		return ""
	}
	small := allocator.RequestOf(r.Pod, []gpushare.ContainerRequest{{Name: "main", Units: size}})
	small.Isolation = r.Isolation
	nodes := 0
	for i := range views {
		if _, unfit := allocator.Place(views[i].alloc, small, policy); unfit == nil && len(schedulerReasons(pod, views[i].node)) == 0 {
			nodes++
		}
	}
	if nodes == 0 {
		return ""
	}
	word := " nodes"
	if nodes == 1 {
		word = " node"
	}
	return "a pod of " + amount(size, unit) + " fits on " + strconv.Itoa(nodes) + word + " now"
}
