package cmd

import (
	"context"

	corev1 "k8s.io/api/core/v1"
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

// listNodes lists every node, page by page.
func listNodes(ctx context.Context, client kubernetes.Interface) ([]corev1.Node, error) {
	p := pager.New(func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		return client.CoreV1().Nodes().List(ctx, opts)
	})
	p.PageSize = listPageSize
	var out []corev1.Node
	err := p.EachListItem(ctx, metav1.ListOptions{}, func(obj runtime.Object) error {
		if n, ok := obj.(*corev1.Node); ok {
			out = append(out, *n)
		}
		return nil
	})
	return out, err
}

// listPods lists the pods of every namespace that selector keeps, page by page.
func listPods(ctx context.Context, client kubernetes.Interface, selector fields.Selector) ([]corev1.Pod, error) {
	p := pager.New(func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		return client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, opts)
	})
	p.PageSize = listPageSize
	var out []corev1.Pod
	err := p.EachListItem(ctx, metav1.ListOptions{FieldSelector: selector.String()}, func(obj runtime.Object) error {
		if pod, ok := obj.(*corev1.Pod); ok {
			out = append(out, *pod)
		}
		return nil
	})
	return out, err
}
