package binder

import (
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/extender/cache"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

// podRef names a pod for an event. The UID is what `kubectl describe pod`
// matches events by, so an event about an older pod of the same name never
// shows on a new one.
func podRef(namespace, name string, uid types.UID) *corev1.ObjectReference {
	return &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: namespace, Name: name, UID: uid}
}

// scheduled records that pod is bound to node with assumed's placement
// (nil: a gpu-mem: 0 pod, which holds no GPU).
func (b *Binder) scheduled(pod *cache.PodRecord, node string, assumed *cache.Assumption) {
	if b.cfg.Events == nil {
		return
	}
	note := "placed on node " + node + " with no GPU memory (gpu-mem: 0)"
	if assumed != nil {
		note = "placed on node " + node + " " + b.usage(node, gpusOf(*assumed))
	}
	b.cfg.Events.Eventf(podRef(pod.Namespace, pod.Name, pod.UID), nil, corev1.EventTypeNormal,
		gpushare.EventReasonScheduled, gpushare.EventActionBind, "%s", gpushare.EventNote(note))
}

// refused records why Bind refused the pod of args, unless there is no such
// pod to tell: an event about a pod that does not exist (a forged or stale
// request) would only litter its namespace.
func (b *Binder) refused(args extenderv1.ExtenderBindingArgs, err error) {
	if b.cfg.Events == nil || apierrors.IsNotFound(err) || errors.Is(err, ErrUIDMismatch) {
		return
	}
	b.cfg.Events.Eventf(podRef(args.PodNamespace, args.PodName, args.PodUID), nil, corev1.EventTypeWarning,
		gpushare.EventReasonBindRefused, gpushare.EventActionBind, "%s", gpushare.EventNote(err.Error()))
}

// gpusOf is the set of GPUs any container of the assumed pod was placed on.
func gpusOf(a cache.Assumption) gpushare.GPUSet {
	var set gpushare.GPUSet
	for _, c := range a.Request.Containers {
		if c.Units > 0 {
			set |= a.Placement.SetOf(c)
		}
	}
	return set
}

// usage says, for each GPU of set, how many of its units are used now that
// the pod is charged there ("GPU 2: 24 of 80 units used"), from the cache's
// view of node: the occupancy a user needs to see why the next pod went
// elsewhere.
func (b *Binder) usage(node string, set gpushare.GPUSet) string {
	n, _ := b.cfg.Cache.Node(node)
	parts := make([]string, 0, set.Len())
	for _, idx := range set.Indices() {
		parts = append(parts, gpuUsage(n, idx))
	}
	return strings.Join(parts, ", ")
}

// gpuUsage is one GPU's part of usage; just its index when the cache no
// longer knows the node or the GPU (deleted since).
func gpuUsage(n *allocator.Node, idx int) string {
	if n != nil {
		for _, g := range n.GPUs {
			if g.Index == idx {
				return fmt.Sprintf("GPU %d: %d of %d units used", idx, g.Used, g.Units)
			}
		}
	}
	return fmt.Sprintf("GPU %d", idx)
}
