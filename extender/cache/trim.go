package cache

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

// trimNode is the node informer's transform: a node's images, conditions,
// addresses, labels and managed fields take kilobytes nobody here reads. It
// keeps what layout reads (the name, the GPU annotation, the gpu-mem and
// gpu-count amounts: allocatable, and capacity where allocatable lacks one,
// the only case quantity reads it) and what the informer's
// machinery reads (the name as key, the resource version); add a field here
// before reading it anywhere. The informer owns the decoded object, so it is
// changed in place; anything else (a tombstone) passes through, and trimming
// twice changes nothing, as client-go requires of a transform.
func trimNode(obj any) (any, error) {
	node, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	allocatable := gpuResources(node.Status.Allocatable, nil)
	*node = corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:            node.Name,
			UID:             node.UID,
			ResourceVersion: node.ResourceVersion,
			Annotations:     nodeAnnotations(node.Annotations),
		},
		Status: corev1.NodeStatus{
			Capacity:    gpuResources(node.Status.Capacity, allocatable),
			Allocatable: allocatable,
		},
	}
	return node, nil
}

// nodeAnnotations keeps the node's GPU description, nil when absent.
func nodeAnnotations(in map[string]string) map[string]string {
	if v, ok := in[gpushare.AnnotationNodeGPUs]; ok {
		return map[string]string{gpushare.AnnotationNodeGPUs: v}
	}
	return nil
}

// gpuResources keeps the gpu-mem and gpu-count amounts of in that except
// lacks, nil when none: each list is a map of its own, some 600 bytes.
func gpuResources(in, except corev1.ResourceList) corev1.ResourceList {
	var out corev1.ResourceList
	for _, name := range [...]corev1.ResourceName{gpushare.ResourceName, gpushare.ResourceCount} {
		if _, skip := except[name]; skip {
			continue
		}
		if q, ok := in[name]; ok {
			if out == nil {
				out = make(corev1.ResourceList, 2)
			}
			out[name] = q
		}
	}
	return out
}
