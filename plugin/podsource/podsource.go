package podsource

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
)

// ErrPodReplaced marks a patch for a pod that is gone or whose name now belongs to another pod.
var ErrPodReplaced = errors.New("pod was deleted or replaced")

// Source watches one node's pods and its Node object.
type Source struct {
	client kubernetes.Interface
	node   string
	log    *zap.Logger

	// Two factories because a factory's list options apply to every
	// informer it makes, and pods and the node need different selectors.
	podFactory, nodeFactory informers.SharedInformerFactory
	podInformer             cache.SharedIndexInformer
	nodeInformer            cache.SharedIndexInformer
	pods                    corelisters.PodLister
	nodes                   corelisters.NodeLister

	mu      sync.Mutex
	changed chan struct{} // closed and replaced on every change
}

// New builds a Source for node; nothing is watched until Start.
func New(client kubernetes.Interface, node string, logger *zap.Logger) *Source {
	if logger == nil {
		logger = zap.NewNop()
	}
	podSel := fields.OneTermEqualSelector("spec.nodeName", node).String()
	nodeSel := fields.OneTermEqualSelector("metadata.name", node).String()
	s := &Source{
		client: client, node: node, log: logger.With(zap.String("node", node)),
		// Resync 0: nothing here reconciles periodically; every real change
		// arrives as an event.
		podFactory: informers.NewSharedInformerFactoryWithOptions(client, 0,
			informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = podSel }),
			informers.WithTransform(dropManagedFields)),
		nodeFactory: informers.NewSharedInformerFactoryWithOptions(client, 0,
			informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = nodeSel }),
			informers.WithTransform(dropManagedFields)),
		changed: make(chan struct{}),
	}
	pods := s.podFactory.Core().V1().Pods()
	s.podInformer, s.pods = pods.Informer(), pods.Lister()
	nodes := s.nodeFactory.Core().V1().Nodes()
	s.nodeInformer, s.nodes = nodes.Informer(), nodes.Lister()
	return s
}

// dropManagedFields removes managedFields before objects enter the cache:
// nothing here reads them and they are often the larger part of a pod. It
// strips a copy: a decoded object would be ours to change, but client-go's
// fake clientset hands the informer objects it still reads itself, and one
// node's pods are few enough that the copy costs nothing that matters.
func dropManagedFields(obj any) (any, error) {
	ro, ok := obj.(runtime.Object)
	if !ok {
		return obj, nil
	}
	if acc, err := meta.Accessor(ro); err != nil || len(acc.GetManagedFields()) == 0 {
		return obj, nil
	}
	out := ro.DeepCopyObject()
	if acc, err := meta.Accessor(out); err == nil {
		acc.SetManagedFields(nil)
	}
	return out, nil
}

// notify wakes every waiter on Changed.
func (s *Source) notify() {
	s.mu.Lock()
	defer s.mu.Unlock()
	close(s.changed)
	s.changed = make(chan struct{})
}

// handler wakes waiters on every event of one informer. The informer's
// cache already holds the change when a handler runs, so a waiter that
// wakes and reads sees it.
func (s *Source) handler(what string) cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { s.notify() },
		UpdateFunc: func(any, any) { s.notify() },
		DeleteFunc: func(obj any) {
			// A delete missed during a watch outage arrives as a
			// DeletedFinalStateUnknown tombstone, not as the object.
			key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
			if err != nil {
				s.log.Warn("delete event for an unexpected object", zap.String("what", what), zap.Error(err))
			} else {
				_, tombstone := obj.(cache.DeletedFinalStateUnknown)
				s.log.Debug("deleted", zap.String("what", what), zap.String("key", key), zap.Bool("tombstone", tombstone))
			}
			s.notify()
		},
	}
}

// Changed returns a channel closed at the next pod or node change.
func (s *Source) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

// Start runs the informers until ctx ends and waits for their first list.
// Call it once.
func (s *Source) Start(ctx context.Context) error {
	podReg, err := s.podInformer.AddEventHandler(s.handler("pod"))
	if err != nil {
		return fmt.Errorf("watch pods of node %s: %w", s.node, err)
	}
	nodeReg, err := s.nodeInformer.AddEventHandler(s.handler("node"))
	if err != nil {
		return fmt.Errorf("watch node %s: %w", s.node, err)
	}
	s.podFactory.StartWithContext(ctx)
	s.nodeFactory.StartWithContext(ctx)
	// The registrations, not the informers, are waited for: they are
	// synced once the handlers have also seen the first list.
	if !cache.WaitFor(ctx, "", podReg.HasSyncedChecker(), nodeReg.HasSyncedChecker()) {
		return fmt.Errorf("list pods of node %s: %w", s.node, context.Cause(ctx))
	}
	s.log.Info("watching this node's pods")
	return nil
}

// Shutdown waits for the informers to end after Start's ctx ended.
func (s *Source) Shutdown() {
	s.podFactory.Shutdown()
	s.nodeFactory.Shutdown()
}

// Pods returns the pods bound to the node, sorted by namespace/name; read only.
func (s *Source) Pods() []*corev1.Pod {
	pods, err := s.pods.List(labels.Everything())
	if err != nil {
		// A lister over a local cache with an empty selector cannot fail.
		s.log.Error("list the pod cache", zap.Error(err))
		return nil
	}
	// The lister's order is a map's; decisions must not depend on it.
	slices.SortFunc(pods, func(a, b *corev1.Pod) int {
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
	})
	return pods
}

// Pod returns one pod of the node from the cache; read only.
func (s *Source) Pod(namespace, name string) (*corev1.Pod, bool) {
	p, err := s.pods.Pods(namespace).Get(name)
	return p, err == nil
}

// Node returns the node from the cache; read only.
func (s *Source) Node() (*corev1.Node, bool) {
	n, err := s.nodes.Get(s.node)
	return n, err == nil
}

// PatchPod sets the annotations compute returns on the pod with the given
// UID. compute sees the latest pod it could read: the cache's on the first
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

// Get reads one pod from the API server, bypassing the cache: a quorum read,
// for when the cache may lag.
func (s *Source) Get(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	p, err := s.client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get pod %s/%s: %w", namespace, name, err)
	}
	return p, nil
}

// List reads the node's pods from the API server, bypassing the cache, sorted
// as Pods sorts them.
func (s *Source) List(ctx context.Context) ([]*corev1.Pod, error) {
	l, err := s.client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", s.node).String(),
	})
	if err != nil {
		return nil, fmt.Errorf("list pods of node %s: %w", s.node, err)
	}
	out := make([]*corev1.Pod, len(l.Items))
	for i := range l.Items {
		out[i] = &l.Items[i]
	}
	slices.SortFunc(out, func(a, b *corev1.Pod) int {
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
	})
	return out, nil
}
