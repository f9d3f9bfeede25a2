package server

import (
	"maps"
	"net/http"
	"slices"

	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/extender/preempt"
)

// preempt is kube-scheduler's preempt verb: its preemption chose victims by
// the node's total gpu-mem, which may free memory on several GPUs and leave
// none with room; this answer replaces them with victims on the GPUs the pod
// needs (docs/extender.md, Preemption).
func (s *Server) preempt(w http.ResponseWriter, r *http.Request) {
	if !s.ready(w) {
		return
	}
	var args extenderv1.ExtenderPreemptionArgs
	if !decode(w, r, s.cfg.MaxBodyBytes, &args) {
		return
	}
	if args.Pod == nil {
		writeJSON(w, http.StatusBadRequest, errorBody{Error: "request has no Pod"})
		return
	}
	res, outcomes := preemptAll(s.cfg.Cache, s.cfg.Policy, &args)
	for outcome, n := range outcomes {
		s.metrics.preemptions.WithLabelValues(outcome).Add(float64(n))
	}
	writeJSON(w, http.StatusOK, res)
}

// Answers for one candidate node, the values of the preempt metric's label.
const (
	preemptChosen    = "chosen"
	preemptUnchanged = "unchanged"
	preemptDropped   = "dropped"
)

// Preempt is the preempt verb without HTTP. For each candidate node it
// answers the scheduler's victims unchanged when the pod's GPU memory is not
// what keeps it off the node once they are gone (it fits by Place, or asks
// for none). Otherwise it adds the cheapest further GPU victims that make it
// fit (preempt.Amend), keeping every victim the scheduler chose: one it may
// have needed for CPU, memory, a port or affinity is never dropped, or the
// evictions would leave the preemptor short and it would preempt again. It
// drops only victims that hold nothing but GPU memory, of a preemptor that
// needs victims for nothing but resources (preempt.GPUMemOnly,
// preempt.NeedsOnlyResources), when other GPU pods serve better. A node is
// dropped when no eviction makes the pod fit, or when it is not in the cache.
// A pod whose request cannot be read drops every node: the filter refuses it
// anyway.
//
// NumPDBViolations is an upper bound: the scheduler's count for its own
// victims, plus one for each victim it did not choose (the extender does not
// read PodDisruptionBudgets), so a node where the answer evicts pods the
// scheduler avoided never looks better than it is.
func Preempt(c Cache, policy allocator.Policy, args *extenderv1.ExtenderPreemptionArgs) *extenderv1.ExtenderPreemptionResult {
	res, _ := preemptAll(c, policy, args)
	return res
}

// preemptAll is Preempt, also counting the nodes by answer.
func preemptAll(c Cache, policy allocator.Policy, args *extenderv1.ExtenderPreemptionArgs) (*extenderv1.ExtenderPreemptionResult, map[string]int) {
	out := &extenderv1.ExtenderPreemptionResult{NodeNameToMetaVictims: map[string]*extenderv1.MetaVictims{}}
	outcomes := map[string]int{}
	handed := handedVictims(args)
	req, err := allocator.NewRequest(args.Pod)
	if err != nil {
		outcomes[preemptDropped] = len(handed)
		return out, outcomes
	}
	priority := int32(0)
	if args.Pod.Spec.Priority != nil {
		priority = *args.Pod.Spec.Priority
	}
	mayDrop := preempt.NeedsOnlyResources(args.Pod)
	for _, node := range slices.Sorted(maps.Keys(handed)) {
		v, outcome := preemptNode(c, policy, node, handed[node], req, priority, mayDrop)
		outcomes[outcome]++
		if v != nil {
			out.NodeNameToMetaVictims[node] = v
		}
	}
	return out, outcomes
}

// preemptNode is Preempt's answer for one node, nil to drop it, and which
// answer it is.
func preemptNode(c Cache, policy allocator.Policy, node string, theirs *extenderv1.MetaVictims, req allocator.Request, priority int32, mayDrop bool) (*extenderv1.MetaVictims, string) {
	if req.Units == 0 {
		return theirs, preemptUnchanged
	}
	n, holders, ok := c.Holders(node)
	if !ok {
		return nil, preemptDropped
	}
	var uids []string
	for _, p := range theirs.Pods {
		if p != nil {
			uids = append(uids, p.UID)
		}
	}
	a, ok := preempt.Amend(n, holders, uids, req, priority, policy, mayDrop)
	switch {
	case !ok:
		return nil, preemptDropped
	case len(a.Add) == 0 && len(a.Drop) == 0:
		return theirs, preemptUnchanged // GPU memory is not the problem once they are gone
	}
	out := &extenderv1.MetaVictims{NumPDBViolations: theirs.NumPDBViolations}
	for _, uid := range uids {
		if !slices.Contains(a.Drop, uid) {
			out.Pods = append(out.Pods, &extenderv1.MetaPod{UID: uid})
		}
	}
	for _, h := range a.Add {
		out.Pods = append(out.Pods, &extenderv1.MetaPod{UID: h.UID})
		out.NumPDBViolations++
	}
	return out, preemptChosen
}

// handedVictims reads the scheduler's candidates in either form: UIDs when
// the extender is nodeCacheCapable, whole pods otherwise.
func handedVictims(args *extenderv1.ExtenderPreemptionArgs) map[string]*extenderv1.MetaVictims {
	out := map[string]*extenderv1.MetaVictims{}
	for node, v := range args.NodeNameToMetaVictims {
		if v != nil {
			out[node] = v
		}
	}
	for node, v := range args.NodeNameToVictims {
		if v == nil {
			continue
		}
		m := &extenderv1.MetaVictims{NumPDBViolations: v.NumPDBViolations}
		for _, p := range v.Pods {
			if p != nil {
				m.Pods = append(m.Pods, &extenderv1.MetaPod{UID: string(p.UID)})
			}
		}
		out[node] = m
	}
	return out
}
