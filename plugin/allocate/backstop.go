package allocate

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/inventory"
)

// ErrOvercommit marks an Allocate call refused because the pods bound to its
// GPU together ask for more units than the GPU has.
var ErrOvercommit = errors.New("GPU over-committed")

// OvercommitError names the GPU, its size and what every pod on it charges.
// It is the node's own check of the extender's accounting: pods bound by hand
// or by another scheduler, or any slip in the extender's cache, are stopped
// here instead of running out of GPU memory beside their neighbours.
type OvercommitError struct {
	Node      string
	GPU       int
	GPUUnits  uint64
	Charged   uint64
	Unit      gpushare.Unit
	Holders   []string // "namespace/name=units", largest first
	Container string   // namespace/name/container refused
}

func (e *OvercommitError) Error() string {
	shown := e.Holders[:min(len(e.Holders), 8)]
	more := ""
	if len(e.Holders) > len(shown) {
		more = fmt.Sprintf(" and %d more", len(e.Holders)-len(shown))
	}
	return fmt.Sprintf("gpushare: %v: GPU %d of node %q has %d %s units and the pods bound to it ask for %d (%s%s); "+
		"refusing %s so the GPU is not over-committed (a pod bound by hand or by another scheduler?)",
		ErrOvercommit, e.GPU, e.Node, e.GPUUnits, e.Unit, e.Charged, strings.Join(shown, ", "), more, e.Container)
}

// Unwrap returns ErrOvercommit.
func (e *OvercommitError) Unwrap() error { return ErrOvercommit }

// charges calls fn for every pod bound to the node with what it charges on
// each GPU by its annotations (gpushare.ChargesBySet, as the extender and the
// inspector count): every pod that is not finished, terminating ones
// included, since their containers may still hold memory. A pod the extender
// never placed charges the only GPU of a one-GPU node, where the plugin serves it.
func charges(in Input, memo *Memo, fn func(pod *corev1.Pod, byGPU map[int]uint64)) {
	gpus := in.Inventory.GPUs()
	for _, pod := range in.Pods {
		if pod == nil || (in.Node != "" && pod.Spec.NodeName != in.Node) || finished(pod) {
			continue
		}
		info := memo.info(pod)
		if info.problem != "" || len(info.reqs) == 0 {
			continue
		}
		byGPU := info.charges
		if !info.placed {
			if len(gpus) != 1 {
				continue
			}
			byGPU = map[int]uint64{gpus[0].Index: gpushare.PodUnits(info.reqs)}
		}
		fn(pod, byGPU)
	}
}

// checkFits refuses the first decision whose GPU is over-committed by the
// node's pods. The decision's own pod is among them: a GPU that holds more
// than it has refuses every container placed on it until pods leave. Only
// the totals are kept on the way; the holders are named when one is over.
func checkFits(in Input, memo *Memo, decisions []Decision) error {
	if len(decisions) == 0 {
		return nil
	}
	used := map[int]uint64{}
	charges(in, memo, func(_ *corev1.Pod, byGPU map[int]uint64) {
		for g, u := range byGPU {
			used[g] += u
		}
	})
	for _, d := range decisions {
		for _, i := range d.Env.Set().Indices() {
			if g, ok := in.Inventory.GPU(i); ok && used[i] > g.Units {
				return overcommitted(in, memo, d, i, g, used[i])
			}
		}
	}
	return nil
}

// holderUnits is one pod's charge on a GPU, for the refusal's message.
type holderUnits struct {
	pod   string
	units uint64
}

func overcommitted(in Input, memo *Memo, d Decision, gpu int, g inventory.State, total uint64) error {
	var hs []holderUnits
	charges(in, memo, func(pod *corev1.Pod, byGPU map[int]uint64) {
		if u, ok := byGPU[gpu]; ok {
			hs = append(hs, holderUnits{pod: pod.Namespace + "/" + pod.Name, units: u})
		}
	})
	slices.SortStableFunc(hs, func(a, b holderUnits) int {
		return cmp.Or(cmp.Compare(b.units, a.units), strings.Compare(a.pod, b.pod))
	})
	names := make([]string, len(hs))
	for i, h := range hs {
		names[i] = h.pod + "=" + strconv.FormatUint(h.units, 10)
	}
	return &OvercommitError{
		Node: in.Node, GPU: gpu, GPUUnits: g.Units, Charged: total, Unit: in.Inventory.Unit(),
		Holders: names, Container: d.Pod.Namespace + "/" + d.Pod.Name + "/" + d.Container.Name,
	}
}

// finished reports whether a pod's containers are gone for good.
func finished(pod *corev1.Pod) bool {
	return pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
}
