package cache

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

// trimPod is the pod informer's transform: it keeps only what the readers of
// the informer's pods use, so the store, which holds every unfinished pod of
// the cluster, does not keep managed fields, environments, volumes, probes and
// statuses nobody reads. The readers, all of which must keep working on a
// trimmed pod (add a field here before reading it anywhere):
//
//   - podStateOf and upsertPod: UID, namespace, name, spec.nodeName,
//     status.phase, the assignment annotations, and the request below;
//   - allocator.NewRequest (gpushare.ContainerRequests): for every container
//     and init container, in spec order, its name, its gpu-mem limit and
//     request, and an init container's restartPolicy (sidecars);
//   - the binder (Cache.Pod): UID, namespace, name, spec.nodeName, the
//     assignment annotations, the container-env record, and the request.
//
// The informer's machinery itself reads the resource version (to resume its
// watch) and the namespace and name (the store's key); the deletion timestamp
// is kept for whoever inspects a terminating pod. The informer owns the
// decoded object, so it is changed in place; objects of other types (a
// tombstone) pass through, and trimming a trimmed pod changes nothing, as
// client-go requires of a transform.
func trimPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	pod.ObjectMeta = metav1.ObjectMeta{
		Name:              pod.Name,
		Namespace:         pod.Namespace,
		UID:               pod.UID,
		ResourceVersion:   pod.ResourceVersion,
		DeletionTimestamp: pod.DeletionTimestamp,
		Annotations:       readAnnotations(pod.Annotations),
	}
	pod.Spec = corev1.PodSpec{
		NodeName:       pod.Spec.NodeName,
		InitContainers: trimContainers(pod.Spec.InitContainers),
		Containers:     trimContainers(pod.Spec.Containers),
	}
	pod.Status = corev1.PodStatus{Phase: pod.Status.Phase}
	return pod, nil
}

// readAnnotations returns the annotations the extender reads, nil when none:
// a kubectl last-applied-configuration alone can be as large as the pod.
func readAnnotations(in map[string]string) map[string]string {
	var out map[string]string
	for k, v := range in {
		switch k {
		case gpushare.AnnotationGPUIndex, gpushare.AnnotationPodUnits, gpushare.AnnotationDevUnits,
			gpushare.AnnotationAssigned, gpushare.AnnotationAssumeTime, gpushare.AnnotationAllocation,
			gpushare.AnnotationContainerEnv:
			if out == nil {
				out = make(map[string]string, 8)
			}
			out[k] = v
		}
	}
	return out
}

// trimContainers keeps every container, in order (the annotations name
// containers by index), with its name, its gpu-mem amount and its restart
// policy (set only on sidecar init containers).
func trimContainers(in []corev1.Container) []corev1.Container {
	if in == nil {
		return nil
	}
	out := make([]corev1.Container, len(in))
	for i, c := range in {
		out[i] = corev1.Container{Name: c.Name, RestartPolicy: c.RestartPolicy, Resources: gpuMem(c.Resources)}
	}
	return out
}

// gpuMem keeps the gpu-mem amount that counts, as gpushare.ContainerRequests
// reads it: the limit, else the request. Each kept list is a map of its own,
// some 600 bytes, so the other is not kept beside it.
func gpuMem(r corev1.ResourceRequirements) corev1.ResourceRequirements {
	if q, ok := r.Limits[gpushare.ResourceName]; ok {
		return corev1.ResourceRequirements{Limits: corev1.ResourceList{gpushare.ResourceName: q}}
	}
	if q, ok := r.Requests[gpushare.ResourceName]; ok {
		return corev1.ResourceRequirements{Requests: corev1.ResourceList{gpushare.ResourceName: q}}
	}
	return corev1.ResourceRequirements{}
}
