package cache

import (
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpushare/gpushare/extender/allocator"
)

// SnapshotSkip is a pod Snapshot did not charge, and why (its annotations
// could not be read); the cache logs the same pods and leaves them out.
type SnapshotSkip struct {
	Pod    string // namespace/name
	Reason string
}

// Snapshot builds, without informers, the allocator.Node the cache holds for
// node given the pods of the cluster and the GPU indices its
// unhealthy-GPU ConfigMap lists (nil when none): the same layout, charges and
// in-flight pods, through the same code (podStateOf, rebuildLocked). It
// exists so that a tool reading the cluster through the API (kubectl inspect
// gpushare why and fit) replays the filter on exactly the extender's view
// instead of a copy of its rules. Pods bound elsewhere, finished, or asking
// for no gpu-mem are ignored. Neither input is modified or kept.
func Snapshot(node *corev1.Node, pods []*corev1.Pod, unhealthy []int) (*allocator.Node, []SnapshotSkip) {
	c := &Cache{log: zap.NewNop()} // only rebuildLocked's layout logs
	n := &nodeState{name: node.Name, node: node, unhealthy: unhealthy, pods: map[types.UID]*podState{}}
	var skipped []SnapshotSkip
	for _, pod := range pods {
		if pod.Spec.NodeName != node.Name {
			continue
		}
		ps, reason := c.podStateOf(RecordOf(pod))
		if ps == nil {
			if reason != "" {
				skipped = append(skipped, SnapshotSkip{Pod: pod.Namespace + "/" + pod.Name, Reason: reason})
			}
			continue
		}
		if ps.uid == "" {
			// Objects read from files carry no UID; the name is unique as well.
			ps.uid = types.UID(pod.Namespace + "/" + pod.Name)
		}
		n.pods[ps.uid] = ps
	}
	c.rebuildLocked(n)
	return n.view, skipped
}
