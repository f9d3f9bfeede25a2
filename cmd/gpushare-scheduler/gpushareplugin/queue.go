package gpushareplugin

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/gpushare/gpushare/extender/cache"
)

var _ fwk.EnqueueExtensions = (*Plugin)(nil)

// EventsToRegister names the events after which a pod our Filter turned
// away may fit: a pod with GPU memory deleted or finished (gpuMemoryFreed),
// and a node added or changing its GPUs, health, labels or allocatable; the
// scheduler retries the pod after backoff. A pod Filter held back behind an
// in-flight pod is retried at once, by the cache, when it sees the wait
// end (heldPods): the scheduler's copy of that event may come first.
func (p *Plugin) EventsToRegister(context.Context) ([]fwk.ClusterEventWithHint, error) {
	return []fwk.ClusterEventWithHint{
		{Event: fwk.ClusterEvent{Resource: fwk.Pod, ActionType: fwk.Update | fwk.Delete}, QueueingHintFn: gpuMemoryFreed},
		{Event: fwk.ClusterEvent{Resource: fwk.Node, ActionType: fwk.Add | fwk.UpdateNodeAllocatable | fwk.UpdateNodeAnnotation | fwk.UpdateNodeLabel | fwk.UpdateNodeTaint}},
	}, nil
}

// gpuMemoryFreed queues a pod when another pod stops holding GPU memory: it
// was deleted or finished; and when the pod itself changed (its request may
// now read). Every other pod change, the device plugin's record included,
// leaves our Filter's answer as it was or is heard through the cache. An
// object it cannot read queues the pod, to be safe.
func gpuMemoryFreed(_ klog.Logger, pod *corev1.Pod, oldObj, newObj any) (fwk.QueueingHint, error) {
	older, _ := oldObj.(*corev1.Pod)
	newer, _ := newObj.(*corev1.Pod)
	switch {
	case older == nil || newer != nil && newer.UID == pod.UID:
		return fwk.Queue, nil
	case newer == nil:
		return queueIf(cache.RecordOf(older).NamesGPUMem), nil
	}
	return queueIf(cache.RecordOf(newer).NamesGPUMem && finished(newer) && !finished(older)), nil
}

func queueIf(ok bool) fwk.QueueingHint {
	if ok {
		return fwk.Queue
	}
	return fwk.QueueSkip
}

func finished(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}
