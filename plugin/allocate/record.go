package allocate

import (
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

// Record returns the annotations to set on pod once container was given env:
// the pod's container-env record with this container added, and
// ALIYUN_COM_GPU_MEM_ASSIGNED=true once every gpu-mem container of the pod is
// in the record. For a pod the extender never placed (the one-GPU seed case)
// it also writes the GPU index, pod units and GPU units, so the extender and
// the inspector charge the GPU it uses. It reads the pod as given, so callers
// compute it afresh on each conflict retry; the pod is never modified. done
// reports whether the pod is now fully served.
func Record(pod *corev1.Pod, container string, env gpushare.ContainerEnv) (annotations map[string]string, done bool, err error) {
	return RecordAll(pod, gpushare.ContainerEnvs{container: env})
}

// RecordAll is Record for several containers of one pod at once; envs must
// not be empty.
func RecordAll(pod *corev1.Pod, envs gpushare.ContainerEnvs) (annotations map[string]string, done bool, err error) {
	rec := gpushare.ContainerEnvs{}
	if raw, ok := pod.Annotations[gpushare.AnnotationContainerEnv]; ok {
		if rec, err = gpushare.DecodeContainerEnvs(raw); err != nil {
			return nil, false, fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
	}
	var any gpushare.ContainerEnv
	for name, env := range envs {
		rec[name], any = env, env
	}
	value, err := gpushare.EncodeContainerEnvs(rec)
	if err != nil {
		return nil, false, fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	reqs, err := gpushare.ContainerRequests(pod)
	if err != nil {
		return nil, false, err
	}
	done = true
	for _, r := range reqs {
		if _, ok := rec[r.Name]; !ok {
			done = false
		}
	}
	out := map[string]string{gpushare.AnnotationContainerEnv: value}
	if done {
		out[gpushare.AnnotationAssigned] = "true"
	}
	if _, placed, _ := gpushare.DecodePodAssignment(pod.Annotations); !placed {
		// Unplaced pods are served on the node's only GPU: every env names it.
		out[gpushare.AnnotationGPUIndex] = strconv.Itoa(any.GPUIndex)
		out[gpushare.AnnotationPodUnits] = strconv.FormatUint(any.PodUnits, 10)
		out[gpushare.AnnotationDevUnits] = strconv.FormatUint(any.DevUnits, 10)
	}
	return out, done, nil
}
