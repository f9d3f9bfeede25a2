package gpushareplugin

import (
	"sync"

	corev1 "k8s.io/api/core/v1"
)

// heldPods are the pods Filter held back behind an in-flight pod, to be
// retried once the cache sees room freed (the cache's OnFreed).
//
// The event that ends a wait, the in-flight pod allocated or gone, reaches
// the scheduler's queue and this plugin's cache on separate handlers, in
// either order. Queued by the scheduler's copy alone, a held pod could read
// the cache before it changed, be held again, and wait for the queue's
// five-minute flush. Retried from the cache's side, it reads the change.
type heldPods struct {
	// activate moves pods to the scheduler's active queue (Handle.Activate).
	activate func(pods map[string]*corev1.Pod)
	mu       sync.Mutex
	pods     map[string]*corev1.Pod
}

// hold records that Filter held pod back. Filter then looks at the cache
// again: a change it missed is either in that second look or, made after
// the pod was recorded here, followed by release.
func (h *heldPods) hold(pod *corev1.Pod) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.pods == nil {
		h.pods = map[string]*corev1.Pod{}
	}
	h.pods[pod.Namespace+"/"+pod.Name] = pod
}

// release retries every held pod. Pods bound or deleted since they were
// held are ignored by the queue; ones still held back are held again.
func (h *heldPods) release() {
	h.mu.Lock()
	pods := h.pods
	h.pods = nil
	h.mu.Unlock()
	if len(pods) > 0 {
		h.activate(pods)
	}
}
