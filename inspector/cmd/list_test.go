package cmd

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// pagedPods serves n pods in pages as the API server does: at most Limit per
// answer, with a continue token naming where the next page starts.
func pagedPods(client *fake.Clientset, n int, requests *[]metav1.ListOptions) {
	client.PrependReactor("list", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		opts := a.(k8stesting.ListActionImpl).ListOptions
		*requests = append(*requests, opts)
		start := 0
		if opts.Continue != "" {
			var err error
			if start, err = strconv.Atoi(opts.Continue); err != nil {
				return true, nil, err
			}
		}
		end := n
		if opts.Limit > 0 {
			end = min(n, start+int(opts.Limit))
		}
		list := &corev1.PodList{}
		for i := start; i < end; i++ {
			list.Items = append(list.Items, corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%04d", i), Namespace: "default"}})
		}
		if end < n {
			list.Continue = strconv.Itoa(end)
		}
		return true, list, nil
	})
}

// The pods are read 500 at a time, kubectl's chunk size, every page kept.
func TestPodsListedInPages(t *testing.T) {
	client := fake.NewClientset()
	var requests []metav1.ListOptions
	pagedPods(client, 1234, &requests)
	pods, err := listPods(context.Background(), client, activePods)
	if err != nil {
		t.Fatal(err)
	}
	if len(pods) != 1234 || pods[0].Name != "p0000" || pods[1233].Name != "p1233" {
		t.Fatalf("listed %d pods; want all 1234 in order", len(pods))
	}
	if len(requests) != 3 {
		t.Fatalf("%d LIST requests; want 3 pages of at most 500", len(requests))
	}
	for i, r := range requests {
		if r.Limit != listPageSize || r.FieldSelector != activePods.String() || (i > 0) != (r.Continue != "") {
			t.Errorf("request %d: %+v; want limit %d, the selector, and the previous page's continue token", i, r, listPageSize)
		}
	}
}
