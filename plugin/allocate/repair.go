package allocate

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

// Repair is the record a pod is missing: every gpu-mem container its
// container-env record lacks, with the environment its annotations give it.
type Repair struct {
	Pod  *corev1.Pod
	Envs gpushare.ContainerEnvs
}

// Repairs returns the missing record of every in-flight pod of in whose
// containers the kubelet has started. A container starts only after the
// kubelet admitted its pod, and admission allocates the devices of every
// container of the pod, init containers included: the whole pod was served,
// and by the extender's rule with exactly the environment its annotations
// name, whatever became of the plugin's own record of its answers (a restart
// between an answer and its record, an API outage longer than the record's
// retries, a plain init container the pod-resources API never reports).
// in.Served is ignored: an answer kept only in memory is what gets lost.
func Repairs(in Input) []Repair {
	if in.Inventory == nil {
		return nil
	}
	cands, _ := candidates(in, nil)
	var out []Repair
	for _, c := range cands {
		if !started(c.pod) {
			continue
		}
		envs := gpushare.ContainerEnvs{}
		for i, r := range c.reqs {
			if !c.served[r.Name] {
				// The tier it was served with is its GPU's configured one: a
				// call on a GPU whose tier is down is refused, never answered.
				envs[r.Name] = envOf(in, c, i)
			}
		}
		out = append(out, Repair{Pod: c.pod, Envs: envs})
	}
	return out
}

// started reports whether the kubelet has started any container of pod,
// now or before a restart, as the pod's status shows.
func started(pod *corev1.Pod) bool {
	for _, list := range [][]corev1.ContainerStatus{pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses} {
		for _, s := range list {
			if s.State.Running != nil || s.State.Terminated != nil || s.LastTerminationState.Terminated != nil {
				return true
			}
		}
	}
	return false
}
