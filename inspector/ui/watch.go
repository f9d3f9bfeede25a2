package ui

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/gpushare/gpushare/inspector/collect"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

// Source is what the page shows: the objects as the cluster holds them now,
// and a signal after each change.
type Source interface {
	Objects() collect.Objects
	// Changed receives a value after a change; several changes may fold
	// into one.
	Changed() <-chan struct{}
}

// Watch is a Source over informers on the user's own client: nodes and pods
// in every namespace, and our driver's ResourceSlices and every
// ResourceClaim when the user may list them (the DRA view is then left out,
// as kubectl inspect gpushare leaves it out). It holds no other state.
type Watch struct {
	nodes   cache.Indexer
	pods    cache.Indexer
	slices  cache.Indexer // nil without the DRA view
	claims  cache.Indexer
	changed chan struct{}
	// DRAError says why DRA-mode nodes are not shown; nil when they are.
	DRAError error
}

// StartWatch starts the informers and returns once they have synced or ctx
// ends. Errors name what the user lacks, as the inspector's commands do.
func StartWatch(ctx context.Context, client kubernetes.Interface) (*Watch, error) {
	w := &Watch{changed: make(chan struct{}, 1)}
	if _, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
		return nil, fmt.Errorf("list nodes: %w (the map needs list and watch on nodes, and on pods in all namespaces)", err)
	}
	w.DRAError = canList(ctx, client)
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(dropManagedFields))
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { w.notify() },
		UpdateFunc: func(any, any) { w.notify() },
		DeleteFunc: func(any) { w.notify() },
	}
	infs := []cache.SharedIndexInformer{factory.Core().V1().Nodes().Informer(), factory.Core().V1().Pods().Informer()}
	if w.DRAError == nil {
		infs = append(infs, factory.Resource().V1().ResourceSlices().Informer(), factory.Resource().V1().ResourceClaims().Informer())
	}
	for _, inf := range infs {
		if _, err := inf.AddEventHandler(handler); err != nil {
			return nil, err
		}
	}
	w.nodes, w.pods = infs[0].GetIndexer(), infs[1].GetIndexer()
	if w.DRAError == nil {
		w.slices, w.claims = infs[2].GetIndexer(), infs[3].GetIndexer()
	}
	factory.Start(ctx.Done())
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return nil, fmt.Errorf("watch %v: %w", typ, context.Cause(ctx))
		}
	}
	return w, nil
}

// canList checks, once, that the DRA objects can be listed: an informer on
// a forbidden resource would retry forever and never sync.
func canList(ctx context.Context, client kubernetes.Interface) error {
	if _, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
		return fmt.Errorf("list resourceslices: %w", err)
	}
	if _, err := client.ResourceV1().ResourceClaims(metav1.NamespaceAll).List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
		return fmt.Errorf("list resourceclaims: %w", err)
	}
	return nil
}

// dropManagedFields keeps the caches small: the map never reads them.
func dropManagedFields(obj any) (any, error) {
	if m, ok := obj.(metav1.ObjectMetaAccessor); ok {
		m.GetObjectMeta().SetManagedFields(nil)
	}
	return obj, nil
}

func (w *Watch) notify() {
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

// Changed implements Source.
func (w *Watch) Changed() <-chan struct{} { return w.changed }

// Objects implements Source: copies of what the caches hold now, finished
// pods left out.
func (w *Watch) Objects() collect.Objects {
	var o collect.Objects
	for _, x := range w.nodes.List() {
		o.Nodes = append(o.Nodes, *x.(*corev1.Node))
	}
	for _, x := range w.pods.List() {
		if p := x.(*corev1.Pod); collect.IsActivePod(p) {
			o.Pods = append(o.Pods, *p)
		}
	}
	if w.slices == nil {
		return o
	}
	for _, x := range w.slices.List() {
		if s := x.(*resourceapi.ResourceSlice); s.Spec.Driver == gpushare.DRADriverName {
			o.Slices = append(o.Slices, *s)
		}
	}
	for _, x := range w.claims.List() {
		o.Claims = append(o.Claims, *x.(*resourceapi.ResourceClaim))
	}
	return o
}

var _ Source = (*Watch)(nil)
