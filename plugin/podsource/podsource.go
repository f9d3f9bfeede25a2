package podsource

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
)

// ErrPodReplaced marks a patch for a pod that is gone or whose name now belongs to another pod.
var ErrPodReplaced = errors.New("pod was deleted or replaced")

// Source watches one node's pods and its Node object.
type Source struct {
	client kubernetes.Interface
	node   string
	log    *zap.Logger

	mu       sync.Mutex
	pods     map[string]*corev1.Pod // by namespace/name
	nodeObj  *corev1.Node
	podSync  bool
	nodeSync bool
	synced   chan struct{} // closed once both have listed
	changed  chan struct{} // closed and replaced on every change
	wg       sync.WaitGroup
}

// New builds a Source for node; nothing is watched until Start.
func New(client kubernetes.Interface, node string, logger *zap.Logger) *Source {
	if logger == nil {
		logger = zap.NewNop()
	}
	return &Source{
		client: client, node: node, log: logger.With(zap.String("node", node)),
		pods: map[string]*corev1.Pod{}, synced: make(chan struct{}), changed: make(chan struct{}),
	}
}

// notifyLocked wakes every waiter on Changed; s.mu is held.
func (s *Source) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// markSyncedLocked records a first list; s.mu is held.
func (s *Source) markSyncedLocked(pods bool) {
	if pods {
		s.podSync = true
	} else {
		s.nodeSync = true
	}
	if s.podSync && s.nodeSync {
		select {
		case <-s.synced:
		default:
			close(s.synced)
		}
	}
}

// Changed returns a channel closed at the next pod or node change.
func (s *Source) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

// Start runs the watches until ctx ends and waits for their first list.
func (s *Source) Start(ctx context.Context) error {
	podSel := fields.OneTermEqualSelector("spec.nodeName", s.node).String()
	nodeSel := fields.OneTermEqualSelector("metadata.name", s.node).String()
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		s.run(ctx, "pods", podSel, s.listPods, s.watchPods)
	}()
	go func() {
		defer s.wg.Done()
		s.run(ctx, "node", nodeSel, s.listNode, s.watchNode)
	}()
	select {
	case <-s.synced:
		s.log.Info("watching this node's pods")
		return nil
	case <-ctx.Done():
		return fmt.Errorf("list pods of node %s: %w", s.node, context.Cause(ctx))
	}
}

// Shutdown waits for the watches to end after Start's ctx ended.
func (s *Source) Shutdown() { s.wg.Wait() }

// Pods returns the pods bound to the node, sorted by namespace/name; read only.
func (s *Source) Pods() []*corev1.Pod {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*corev1.Pod, 0, len(s.pods))
	for _, k := range slices.Sorted(maps.Keys(s.pods)) {
		out = append(out, s.pods[k])
	}
	return out
}

// Pod returns one pod of the node from the store; read only.
func (s *Source) Pod(namespace, name string) (*corev1.Pod, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.pods[namespace+"/"+name]
	return p, ok
}

// Node returns the node from the store; read only.
func (s *Source) Node() (*corev1.Node, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nodeObj, s.nodeObj != nil
}

// PatchPod sets the annotations compute returns on the pod with the given
// UID. compute sees the latest pod it could read: the store's on the first
// try, the API server's after a conflict; it must not modify it. The patch
// carries the pod's resourceVersion, so a concurrent writer causes a
// conflict and a fresh compute instead of a lost update.
func (s *Source) PatchPod(ctx context.Context, namespace, name string, uid types.UID, compute func(*corev1.Pod) (map[string]string, error)) error {
	key := namespace + "/" + name
	pod, ok := s.Pod(namespace, name)
	attempt := 0
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		attempt++
		if !ok || attempt > 1 {
			fresh, err := s.client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return fmt.Errorf("get pod %s: %w", key, err)
			}
			pod = fresh
		}
		if pod.UID != uid {
			return fmt.Errorf("patch pod %s: %w (UID %s, want %s)", key, ErrPodReplaced, pod.UID, uid)
		}
		annotations, err := compute(pod)
		if err != nil {
			return fmt.Errorf("patch pod %s: %w", key, err)
		}
		body, err := json.Marshal(map[string]any{"metadata": map[string]any{
			"resourceVersion": pod.ResourceVersion,
			"annotations":     annotations,
		}})
		if err != nil {
			return fmt.Errorf("patch pod %s: %w", key, err)
		}
		if _, err := s.client.CoreV1().Pods(namespace).Patch(ctx, name, types.MergePatchType, body, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("patch pod %s: %w", key, err)
		}
		return nil
	})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("%w: %w", ErrPodReplaced, err)
	}
	return err
}
