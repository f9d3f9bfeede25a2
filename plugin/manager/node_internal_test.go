package manager

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/inventory"
	"github.com/gpushare/gpushare/plugin/nvml"
)

// publishedNode is a Node showing count GPUs, description desc and, unless
// nil, the skipped-GPU annotation.
func publishedNode(count int64, desc string, skipped *string) *corev1.Node {
	q := *resource.NewQuantity(count, resource.DecimalSI)
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{gpushare.AnnotationNodeGPUs: desc}},
		Status: corev1.NodeStatus{
			Capacity:    corev1.ResourceList{gpushare.ResourceCount: q},
			Allocatable: corev1.ResourceList{gpushare.ResourceCount: q},
		},
	}
	if skipped != nil {
		n.Annotations[gpushare.AnnotationSkippedGPUs] = *skipped
	}
	return n
}

func TestNodeStateMatches(t *testing.T) {
	inv, err := inventory.New([]inventory.GPU{{Index: 0, UUID: "GPU-0", MemoryMiB: 2048}, {Index: 2, UUID: "GPU-2", MemoryMiB: 2048}}, gpushare.GiB)
	if err != nil {
		t.Fatal(err)
	}
	base, err := newNodeState(inv, true, nil)
	if err != nil {
		t.Fatal(err)
	}
	withMIG, err := base.withSkipped([]nvml.SkippedGPU{{Index: 1, UUID: "GPU-1", Reason: nvml.ReasonMIG}})
	if err != nil {
		t.Fatal(err)
	}
	none, err := base.withSkipped(nil)
	if err != nil {
		t.Fatal(err)
	}
	if base.count != "2" || *none.skipped != "" || *withMIG.skipped == "" {
		t.Fatalf("states: %+v, %+v, %+v", base, none, withMIG)
	}
	other := "[]"
	tests := []struct {
		name  string
		state nodeState
		node  func() *corev1.Node
		want  bool
	}{
		{"as published", base, func() *corev1.Node { return publishedNode(2, base.gpus, nil) }, true},
		{"skipped unknown: any annotation is fine", base, func() *corev1.Node { return publishedNode(2, base.gpus, &other) }, true},
		{"no capacity", base, func() *corev1.Node {
			n := publishedNode(2, base.gpus, nil)
			delete(n.Status.Capacity, gpushare.ResourceCount)
			return n
		}, false},
		{"no allocatable", base, func() *corev1.Node {
			n := publishedNode(2, base.gpus, nil)
			delete(n.Status.Allocatable, gpushare.ResourceCount)
			return n
		}, false},
		{"capacity reset to zero", base, func() *corev1.Node { return publishedNode(0, base.gpus, nil) }, false},
		{"no description", base, func() *corev1.Node { return publishedNode(2, "", nil) }, false},
		{"another description", base, func() *corev1.Node { return publishedNode(2, `{"unit":"GiB","gpus":[]}`, nil) }, false},
		{"nothing skipped, none shown", none, func() *corev1.Node { return publishedNode(2, base.gpus, nil) }, true},
		{"nothing skipped, a stale list shown", none, func() *corev1.Node { return publishedNode(2, base.gpus, &other) }, false},
		{"nothing skipped, an empty annotation shown", none, func() *corev1.Node { empty := ""; return publishedNode(2, base.gpus, &empty) }, false},
		{"MIG GPU shown", withMIG, func() *corev1.Node { return publishedNode(2, base.gpus, withMIG.skipped) }, true},
		{"MIG GPU not shown", withMIG, func() *corev1.Node { return publishedNode(2, base.gpus, nil) }, false},
	}
	for _, tt := range tests {
		if got := tt.state.matches(tt.node()); got != tt.want {
			t.Errorf("%s: matches = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestNodeStatePatches(t *testing.T) {
	desc := `{"unit":"GiB","simulated":false,"gpus":[]}`
	empty, list := "", `[{"index":1,"uuid":"","model":"","reason":"MIG"}]`
	tests := []struct {
		skipped *string
		meta    string
	}{
		{nil, `{"metadata":{"annotations":{"gpushare.io/gpus":"{\"unit\":\"GiB\",\"simulated\":false,\"gpus\":[]}"}}}`},
		{&empty, `{"metadata":{"annotations":{"gpushare.io/gpus":"{\"unit\":\"GiB\",\"simulated\":false,\"gpus\":[]}","gpushare.io/skipped-gpus":null}}}`},
		{&list, `{"metadata":{"annotations":{"gpushare.io/gpus":"{\"unit\":\"GiB\",\"simulated\":false,\"gpus\":[]}","gpushare.io/skipped-gpus":"[{\"index\":1,\"uuid\":\"\",\"model\":\"\",\"reason\":\"MIG\"}]"}}}`},
	}
	for _, tt := range tests {
		status, meta, err := nodeState{count: "0", gpus: desc, skipped: tt.skipped}.patches()
		if err != nil || string(meta) != tt.meta ||
			string(status) != `{"status":{"allocatable":{"aliyun.com/gpu-count":"0"},"capacity":{"aliyun.com/gpu-count":"0"}}}` {
			t.Errorf("patches = %s, %s, %v; want meta %s", status, meta, err, tt.meta)
		}
	}
}

func TestRecoveryOf(t *testing.T) {
	for c, want := range map[nvml.Cause]inventory.Recovery{
		nvml.CauseTransient: inventory.AfterQuiet, nvml.CauseFatal: inventory.Never, nvml.CauseUnwatched: inventory.WhenWatched,
	} {
		if got := recoveryOf(c); got != want {
			t.Errorf("recoveryOf(%v) = %v, want %v", c, got, want)
		}
	}
}
