package ui

import (
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/inspector/collect"
	"github.com/gpushare/gpushare/inspector/explain"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

// MaxExplained bounds the pending pods whose reason a rebuild computes:
// each is a replay of the extender's placement over the whole cluster.
const MaxExplained = 20

// View is what the page draws, as JSON.
type View struct {
	// Generation grows with every rebuild.
	Generation uint64    `json:"generation"`
	Built      time.Time `json:"built"`
	// Report is kubectl inspect gpushare -o json's report, without each
	// container's recorded environment (the page does not draw it).
	Report *collect.Report `json:"report"`
	// Pending are the pods no node is bound to that ask for GPU memory,
	// oldest first.
	Pending []Pending `json:"pending"`
	// SkippedGPUs are, by node, the GPUs its plugin does not advertise
	// (MIG mode) and why.
	SkippedGPUs map[string][]gpushare.SkippedGPU `json:"skippedGPUs,omitempty"`
}

// Pending is an unscheduled pod and, for the first MaxExplained, why
// (explain.ExplainWhy's summary: the same words as kubectl inspect gpushare why).
type Pending struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Request   string `json:"request"`
	// Reason is why's summary; empty beyond MaxExplained or when the pod
	// cannot be read (Error says why).
	Reason  string   `json:"reason,omitempty"`
	Help    []string `json:"help,omitempty"`
	Fitting int      `json:"fitting"`
	Error   string   `json:"error,omitempty"`
}

// BuildView computes the view of objs. It does not modify objs.
func BuildView(objs collect.Objects, policy allocator.Policy) View {
	report := collect.BuildObjects(objs)
	for i := range report.Nodes {
		for j := range report.Nodes[i].Pods {
			for k := range report.Nodes[i].Pods[j].Containers {
				report.Nodes[i].Pods[j].Containers[k].Env = nil
			}
		}
	}
	v := View{Built: time.Now(), Report: report, Pending: []Pending{}}
	for _, n := range objs.Nodes {
		raw, ok := n.Annotations[gpushare.AnnotationSkippedGPUs]
		if !ok {
			continue
		}
		if skipped, err := gpushare.DecodeSkippedGPUs(raw); err == nil && len(skipped) > 0 {
			if v.SkippedGPUs == nil {
				v.SkippedGPUs = map[string][]gpushare.SkippedGPU{}
			}
			v.SkippedGPUs[n.Name] = skipped
		}
	}
	v.Pending = pendingPods(objs, report.Unit, policy)
	return v
}

// pendingPods lists the unscheduled pods asking for GPU memory, oldest
// first, explaining the first MaxExplained.
func pendingPods(objs collect.Objects, unit string, policy allocator.Policy) []Pending {
	var waiting []*corev1.Pod
	for i := range objs.Pods {
		p := &objs.Pods[i]
		if p.Spec.NodeName != "" || !collect.IsActivePod(p) {
			continue
		}
		if reqs, err := gpushare.ContainerRequests(p); err == nil && gpushare.PodUnits(reqs) == 0 {
			continue
		}
		waiting = append(waiting, p)
	}
	slices.SortStableFunc(waiting, func(a, b *corev1.Pod) int { return a.CreationTimestamp.Time.Compare(b.CreationTimestamp.Time) })
	st := explain.State{Nodes: objs.Nodes, Pods: objs.Pods}
	answers, errs := explain.ExplainPending(st, waiting[:min(len(waiting), MaxExplained)], policy)
	out := make([]Pending, 0, len(waiting))
	for i, p := range waiting {
		pend := Pending{Namespace: p.Namespace, Name: p.Name}
		switch {
		case i >= len(answers):
		case errs[i] != nil:
			pend.Error = errs[i].Error()
		default:
			w := answers[i]
			pend.Request = explain.DescribeRequest(w.Pod, unit)
			pend.Reason, pend.Help, pend.Fitting = w.Summary, w.Help, w.Fitting
		}
		out = append(out, pend)
	}
	return out
}
