package explain

import (
	"fmt"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

// request reads pod's request as the extender's filter does
// (allocator.NewRequest). A pod the extender would refuse on every node is
// an error here, worded as the filter words it; a pod asking for no
// gpu-mem is not the extender's to place at all.
func request(pod *corev1.Pod) (allocator.Request, PodInfo, error) {
	name := pod.Namespace + "/" + pod.Name
	r, err := allocator.NewRequest(pod)
	if err != nil {
		return r, PodInfo{}, fmt.Errorf("pod %s cannot be placed on any node: %w (the extender's filter fails every node with this reason)", name, err)
	}
	if r.Units == 0 {
		return r, PodInfo{}, fmt.Errorf("pod %s asks for no %s: the gpushare extender does not place it (kubectl describe pod %s shows the scheduler's reasons)",
			name, gpushare.ResourceName, pod.Name)
	}
	info := PodInfo{Namespace: pod.Namespace, Name: pod.Name, Units: r.Units, TopologyRequired: r.GPUs.LinksRequired,
		ComputePercent: r.Isolation.ComputePercent()}
	if r.GPUs.Count > 1 {
		info.GPUCount = r.GPUs.Count
	}
	if t := r.Isolation.Tier(); t != gpushare.IsolationAny {
		info.Isolation = string(t)
	}
	return r, info, nil
}

// condition returns pod's PodScheduled condition, nil when it has none.
func condition(pod *corev1.Pod) *Condition {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled {
			return &Condition{Status: string(c.Status), Reason: c.Reason, Message: c.Message}
		}
	}
	return nil
}

// schedulerReasons are the kube-scheduler predicates node fails for pod, in
// kube-scheduler's own wording (NodeName, NodeUnschedulable, NodeAffinity
// for nodeSelector, TaintToleration). Node affinity expressions, pod
// (anti-)affinity, ports and resources other than gpu-mem are not
// evaluated: the pod's PodScheduled condition reports those.
func schedulerReasons(pod *corev1.Pod, node *corev1.Node) []string {
	var out []string
	if pod.Spec.NodeName != "" && pod.Spec.NodeName != node.Name {
		out = append(out, "node(s) didn't match the requested node name")
	}
	if node.Spec.Unschedulable && !tolerates(pod, &corev1.Taint{Key: corev1.TaintNodeUnschedulable, Effect: corev1.TaintEffectNoSchedule}) {
		out = append(out, "node(s) were unschedulable")
	}
	for k, v := range pod.Spec.NodeSelector {
		if got, ok := node.Labels[k]; !ok || got != v {
			out = append(out, "node(s) didn't match Pod's node affinity/selector")
			break
		}
	}
	for i := range node.Spec.Taints {
		t := &node.Spec.Taints[i]
		if t.Effect != corev1.TaintEffectNoSchedule && t.Effect != corev1.TaintEffectNoExecute {
			continue
		}
		if !tolerates(pod, t) {
			out = append(out, fmt.Sprintf("node(s) had untolerated taint {%s: %s}", t.Key, t.Value))
			break
		}
	}
	return out
}

func tolerates(pod *corev1.Pod, t *corev1.Taint) bool {
	for i := range pod.Spec.Tolerations {
		// The logger only reports malformed Lt/Gt values, which simply do not match;
		// comparison operators on, as kube-scheduler v1.37 has them.
		if pod.Spec.Tolerations[i].ToleratesTaint(logr.Discard(), t, true) {
			return true
		}
	}
	return false
}
