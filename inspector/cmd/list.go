package cmd

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/pager"
)

// listPageSize is how many objects one LIST request asks for, kubectl's
// chunk size: a cluster's whole pod list in one answer can be hundreds of
// megabytes that the API server builds in memory at once.
const listPageSize = 500

// listFunc is one typed client's List.
type listFunc func(context.Context, metav1.ListOptions) (runtime.Object, error)

// listAll lists every object list returns for selector, page by page.
func listAll[T any, PT interface {
	*T
	runtime.Object
}](ctx context.Context, selector fields.Selector, list listFunc) ([]T, error) {
	p := pager.New(pager.ListPageFunc(list))
	p.PageSize = listPageSize
	opts := metav1.ListOptions{}
	if selector != nil {
		opts.FieldSelector = selector.String()
	}
	var out []T
	err := p.EachListItem(ctx, opts, func(obj runtime.Object) error {
		if x, ok := obj.(PT); ok {
			out = append(out, *x)
		}
		return nil
	})
	return out, err
}

// listNodes lists every node, page by page.
func listNodes(ctx context.Context, client kubernetes.Interface) ([]corev1.Node, error) {
	return listAll[corev1.Node](ctx, nil, func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		return client.CoreV1().Nodes().List(ctx, opts)
	})
}

// listPods lists the pods of every namespace that selector keeps, page by page.
func listPods(ctx context.Context, client kubernetes.Interface, selector fields.Selector) ([]corev1.Pod, error) {
	return listAll[corev1.Pod](ctx, selector, func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		return client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, opts)
	})
}

// listSlices lists the ResourceSlices selector keeps, page by page.
func listSlices(ctx context.Context, client kubernetes.Interface, selector fields.Selector) ([]resourceapi.ResourceSlice, error) {
	return listAll[resourceapi.ResourceSlice](ctx, selector, func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		return client.ResourceV1().ResourceSlices().List(ctx, opts)
	})
}

// listClaims lists the ResourceClaims of every namespace, page by page.
func listClaims(ctx context.Context, client kubernetes.Interface) ([]resourceapi.ResourceClaim, error) {
	return listAll[resourceapi.ResourceClaim](ctx, nil, func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		return client.ResourceV1().ResourceClaims(metav1.NamespaceAll).List(ctx, opts)
	})
}
