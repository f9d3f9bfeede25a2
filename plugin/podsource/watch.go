package podsource

import (
	"context"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// Backoff bounds between failed lists or watches.
const (
	minBackoff = 100 * time.Millisecond
	maxBackoff = 10 * time.Second
)

// listFunc lists with a field selector into the store and returns the list's resourceVersion.
type listFunc func(ctx context.Context, selector string) (string, error)

// watchFunc opens a watch with a field selector from a resourceVersion.
type watchFunc func(ctx context.Context, selector, rv string) (watch.Interface, error)

// run lists, then watches from the list's resourceVersion, re-watching from
// the last version seen when a watch ends and listing again when the server
// says that version is gone, until ctx ends: what a reflector does, kept to
// what this plugin needs.
func (s *Source) run(ctx context.Context, what, selector string, list listFunc, open watchFunc) {
	backoff := minBackoff
	sleep := func() bool {
		t := time.NewTimer(backoff)
		defer t.Stop()
		backoff = min(2*backoff, maxBackoff)
		select {
		case <-t.C:
			return true
		case <-ctx.Done():
			return false
		}
	}
	for ctx.Err() == nil {
		rv, err := list(ctx, selector)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("list failed; retrying", zap.String("what", what), zap.Error(err))
			}
			if !sleep() {
				return
			}
			continue
		}
		for ctx.Err() == nil {
			w, err := open(ctx, selector, rv)
			if err != nil {
				if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
					break
				}
				if ctx.Err() == nil {
					s.log.Warn("watch failed; retrying", zap.String("what", what), zap.Error(err))
				}
				if !sleep() {
					return
				}
				continue
			}
			next, relist := s.consume(ctx, w)
			w.Stop()
			if relist {
				break
			}
			if next != "" {
				rv = next
				backoff = minBackoff
			} else if !sleep() {
				// A watch that ends without a single event must not spin.
				return
			}
		}
	}
}

// consume applies a watch's events to the store until it ends; it returns
// the last resourceVersion seen and whether a fresh list is needed.
func (s *Source) consume(ctx context.Context, w watch.Interface) (rv string, relist bool) {
	for {
		select {
		case <-ctx.Done():
			return rv, false
		case ev, ok := <-w.ResultChan():
			if !ok {
				return rv, false
			}
			if ev.Type == watch.Error {
				err := apierrors.FromObject(ev.Object)
				s.log.Info("watch ended with an error", zap.Error(err))
				return rv, apierrors.IsResourceExpired(err) || apierrors.IsGone(err)
			}
			acc, err := meta.Accessor(ev.Object)
			if err != nil {
				continue
			}
			rv = acc.GetResourceVersion()
			if ev.Type != watch.Bookmark {
				s.apply(ev.Type, ev.Object)
			}
		}
	}
}

// apply puts one watch event into the store.
func (s *Source) apply(t watch.EventType, obj any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch o := obj.(type) {
	case *corev1.Pod:
		key := o.Namespace + "/" + o.Name
		if t == watch.Deleted {
			delete(s.pods, key)
		} else {
			s.pods[key] = o
		}
	case *corev1.Node:
		if t == watch.Deleted {
			s.nodeObj = nil
		} else {
			s.nodeObj = o
		}
	default:
		return
	}
	s.notifyLocked()
}

// listPods replaces the pod store with a fresh list.
func (s *Source) listPods(ctx context.Context, selector string) (string, error) {
	list, err := s.client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: selector})
	if err != nil {
		return "", err
	}
	pods := make(map[string]*corev1.Pod, len(list.Items))
	for i := range list.Items {
		p := &list.Items[i]
		pods[p.Namespace+"/"+p.Name] = p
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pods = pods
	s.markSyncedLocked(true)
	s.notifyLocked()
	return list.ResourceVersion, nil
}

// watchPods watches the node's pods.
func (s *Source) watchPods(ctx context.Context, selector, rv string) (watch.Interface, error) {
	return s.client.CoreV1().Pods(metav1.NamespaceAll).Watch(ctx, metav1.ListOptions{
		FieldSelector: selector, ResourceVersion: rv, AllowWatchBookmarks: true,
	})
}

// listNode replaces the node in the store with a fresh list.
func (s *Source) listNode(ctx context.Context, selector string) (string, error) {
	list, err := s.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{FieldSelector: selector})
	if err != nil {
		return "", err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nodeObj = nil
	for i := range list.Items {
		if list.Items[i].Name == s.node {
			s.nodeObj = &list.Items[i]
		}
	}
	s.markSyncedLocked(false)
	s.notifyLocked()
	return list.ResourceVersion, nil
}

// watchNode watches the node.
func (s *Source) watchNode(ctx context.Context, selector, rv string) (watch.Interface, error) {
	return s.client.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{
		FieldSelector: selector, ResourceVersion: rv, AllowWatchBookmarks: true,
	})
}
