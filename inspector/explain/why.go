package explain

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

// ExplainWhy says, for every node of st, why pod does (not) fit there now
// under policy, and for a bound pod where it is and why there. The replay
// leaves pod itself out of the cluster, so a bound pod is judged as if it
// were being placed again. It is an error when pod is not the extender's
// to place (no gpu-mem) or the extender refuses it everywhere (invalid
// request or annotations).
func ExplainWhy(st State, pod *corev1.Pod, policy allocator.Policy) (*Why, error) {
	views, skipped := buildViews(st, pod)
	return explainOn(views, skipped, unitOf(st), pod, policy)
}

// ExplainPending is ExplainWhy for each of pods, which no node is bound to,
// on one replay of st: the cluster's snapshot is built once, not per pod
// (what the live map needs at every change). Each answer or error is at
// the pod's index.
func ExplainPending(st State, pods []*corev1.Pod, policy allocator.Policy) ([]*Why, []error) {
	views, skipped := buildViews(st, nil)
	unit := unitOf(st)
	answers, errs := make([]*Why, len(pods)), make([]error, len(pods))
	for i, p := range pods {
		answers[i], errs[i] = explainOn(views, skipped, unit, p, policy)
	}
	return answers, errs
}

// explainOn is ExplainWhy on views already built without pod.
func explainOn(views []view, skipped []Skip, unit string, pod *corev1.Pod, policy allocator.Policy) (*Why, error) {
	r, info, err := request(pod)
	if err != nil {
		return nil, err
	}
	w := &Why{Unit: unit, Policy: policy.String(), Pod: info, Status: "pending", Scheduler: condition(pod)}
	w.Skipped = skipped
	// A bound pod's own nodeName must not fail the other nodes' predicates.
	unbound := pod.DeepCopy()
	unbound.Spec.NodeName = ""
	w.Nodes = judgeAll(views, unbound, r, policy, w.Unit)
	for _, v := range w.Nodes {
		if v.Fits {
			w.Fitting++
		}
	}
	if pod.Spec.NodeName != "" {
		w.Status = "bound"
		w.Bound = bound(pod, r, w.Nodes, policy)
		w.Summary = "pod " + podName(info) + " is bound to " + pod.Spec.NodeName
		return w, nil
	}
	w.Summary = summary(info, w.Nodes, w.Unit)
	if w.Fitting == 0 {
		w.Help = help(views, unbound, r, policy, w.Nodes, w.Unit)
	}
	return w, nil
}

func judgeAll(views []view, pod *corev1.Pod, r allocator.Request, policy allocator.Policy, unit string) []NodeVerdict {
	out := make([]NodeVerdict, len(views))
	for i := range views {
		out[i] = judge(&views[i], pod, r, policy, unit)
	}
	return out
}

func podName(p PodInfo) string { return p.Namespace + "/" + p.Name }

// best is the fitting verdict the extender ranks first: the highest
// prioritize score, the first name on ties (kube-scheduler adds its own
// scores and breaks ties at random, so this is the extender's preference).
func best(verdicts []NodeVerdict) int {
	pick := -1
	for i, v := range verdicts {
		if v.Fits && (pick < 0 || v.Score > verdicts[pick].Score) {
			pick = i
		}
	}
	return pick
}

// bound reads where a bound pod is from its annotations and compares it
// with the extender's choice now.
func bound(pod *corev1.Pod, r allocator.Request, verdicts []NodeVerdict, policy allocator.Policy) *Bound {
	b := &Bound{Node: pod.Spec.NodeName}
	a, ok, err := gpushare.DecodePodAssignment(pod.Annotations)
	switch {
	case err != nil:
		b.Why = "its GPU assignment cannot be read (" + err.Error() + "): the extender does not charge it"
		return b
	case !ok:
		b.Why = "bound without a GPU assignment: not by the gpushare extender (or its bind did not finish), so it holds no GPU memory"
		return b
	}
	b.Assigned = a.Assigned
	if p, err := allocator.PlacementFromAssignment(a, r); err == nil {
		b.GPUs = gpusOf(r, p)
	}
	if i := best(verdicts); i >= 0 {
		b.Replay = &Choice{Node: verdicts[i].Name, GPUs: verdicts[i].GPUs, Score: verdicts[i].Score}
	}
	b.Why = boundWhy(b, policy)
	return b
}

func boundWhy(b *Bound, policy allocator.Policy) string {
	rule := policyRule(policy)
	switch {
	case b.Replay == nil:
		return "placed again now it would fit no node (see below): the cluster changed since its bind"
	case b.Replay.Node == b.Node && slices.Equal(b.Replay.GPUs, b.GPUs):
		return "placed again now, without it, the extender (" + rule + ") chooses the same: " + b.Node + " " + indices(b.GPUs) +
			", the best extender score (" + strconv.FormatInt(b.Replay.Score, 10) + ")"
	}
	return "placed again now, without it, the extender (" + rule + ") would choose " + b.Replay.Node + " " + indices(b.Replay.GPUs) +
		": the cluster changed since its bind"
}

// policyRule says in words how policy picks a GPU.
func policyRule(policy allocator.Policy) string {
	switch policy {
	case allocator.Spread:
		return "spread: the emptiest GPU that fits"
	case allocator.FirstFit:
		return "firstfit: the lowest-index GPU that fits"
	}
	return "bestfit: the fullest GPU that fits"
}

// kindOrder is the order verdict kinds are counted in summaries.
func kindOrder() []string {
	return []string{KindFits, KindFragmented, KindWaiting, KindInsufficient, KindTooBig, KindIsolation, KindTopology,
		KindUnhealthy, KindScheduler, KindNotGPUShare}
}

// kindWords are how summaries name each kind.
func kindWords(kind string) string {
	switch kind {
	case KindFits:
		return "fit"
	case KindWaiting:
		return "waiting behind an in-flight pod"
	case KindInsufficient:
		return "without room"
	case KindTooBig:
		return "with no GPU large enough"
	case KindIsolation:
		return "without the isolation asked"
	case KindTopology:
		return "without an NVLink-connected set"
	case KindUnhealthy:
		return "with no healthy GPU"
	case KindScheduler:
		return "refused by kube-scheduler's predicates"
	case KindNotGPUShare:
		return "not gpushare nodes"
	}
	return kind
}

// summary is the one line under the table: how many nodes fit, and why the others do not.
func summary(p PodInfo, verdicts []NodeVerdict, unit string) string {
	counts := map[string]int{}
	fitting := 0
	for _, v := range verdicts {
		counts[v.Kind]++
		if v.Fits {
			fitting++
		}
	}
	var parts []string
	for _, k := range kindOrder() {
		if counts[k] > 0 && k != KindFits {
			parts = append(parts, strconv.Itoa(counts[k])+" "+kindWords(k))
		}
	}
	head := "pod " + podName(p) + " (" + DescribeRequest(p, unit) + ")"
	if fitting > 0 {
		return fmt.Sprintf("%s fits on %d of %d nodes now; the scheduler places it on its next try", head, fitting, len(verdicts))
	}
	line := fmt.Sprintf("%s fits on none of %d nodes", head, len(verdicts))
	if len(parts) > 0 {
		line += ": " + strings.Join(parts, ", ")
	}
	return line
}

// DescribeRequest says what the pod asks: "12 GiB", "16 GiB on 2 GPUs".
func DescribeRequest(p PodInfo, unit string) string {
	s := amount(p.Units, unit)
	if p.GPUCount > 1 {
		s += " on " + strconv.Itoa(p.GPUCount) + " GPUs"
	}
	return s
}
