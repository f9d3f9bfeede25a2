package browser

import (
	"context"
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/inspector/collect"
	"github.com/gpushare/gpushare/inspector/ui"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

// bigCluster is nodes nodes of 8 GPUs of 80 GiB, each holding podsPerNode
// pods of 4 GiB spread over its GPUs, in 12 namespaces.
func bigCluster(b *testing.B, nodes, podsPerNode int) collect.Objects {
	desc := gpushare.NodeGPUs{Unit: gpushare.GiB}
	for g := range 8 {
		desc.GPUs = append(desc.GPUs, gpushare.GPUInfo{Index: g, UUID: fmt.Sprintf("GPU-%d", g), Model: "H100", Units: 80, Healthy: true})
	}
	raw, err := gpushare.EncodeNodeGPUs(desc)
	if err != nil {
		b.Fatal(err)
	}
	var o collect.Objects
	for i := range nodes {
		name := fmt.Sprintf("gpu-node-%04d", i)
		q := func(v int64) resource.Quantity { return *resource.NewQuantity(v, resource.DecimalSI) }
		alloc := corev1.ResourceList{gpushare.ResourceName: q(640), gpushare.ResourceCount: q(8)}
		o.Nodes = append(o.Nodes, corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{gpushare.LabelGPUShare: gpushare.LabelValueTrue},
				Annotations: map[string]string{gpushare.AnnotationNodeGPUs: raw}},
			Status: corev1.NodeStatus{Allocatable: alloc, Capacity: alloc}})
		for j := range podsPerNode {
			a := gpushare.PodAssignment{GPUIndex: j % 8, PodUnits: 4, DevUnits: 80, Assigned: true, AssumeTime: 1}
			ann, err := a.Encode()
			if err != nil {
				b.Fatal(err)
			}
			ns := fmt.Sprintf("team-%02d", (i+j)%12)
			o.Pods = append(o.Pods, corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("%s-%d", name, j), UID: types.UID(fmt.Sprintf("%d-%d", i, j)), Annotations: ann},
				Spec: corev1.PodSpec{NodeName: name, Containers: []corev1.Container{{Name: "main", Image: "x",
					Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{gpushare.ResourceName: q(4)}}}}},
				Status: corev1.PodStatus{Phase: corev1.PodRunning}})
		}
	}
	return o
}

// fixed is a Source the benchmark changes.
type fixed struct {
	objs    collect.Objects
	changed chan struct{}
}

func (f *fixed) Objects() collect.Objects { return f.objs }
func (f *fixed) Changed() <-chan struct{} { return f.changed }

// BenchmarkPageRender is the live map in headless Chromium at 1,000 nodes of
// 8 GPUs and 10,000 pods: each op is one change pushed to the page, from the
// signal to the page having drawn it (the server's rebuild, the event, the
// parse and the draw). draw-ms is the draw alone, as the page measures it.
func BenchmarkPageRender(b *testing.B) {
	src := &fixed{objs: bigCluster(b, 1000, 10), changed: make(chan struct{}, 1)}
	srv := ui.NewServer(src, allocator.BestFit, "default")
	ctx, cancel := context.WithCancel(b.Context())
	defer cancel()
	go srv.Run(ctx)
	hs := httptest.NewUnstartedServer(nil)
	hs.Config.Handler = srv.Handler(hs.Listener.Addr().String())
	hs.Start()
	defer hs.Close()
	defer hs.CloseClientConnections()

	browser, stop, err := Start(ctx, b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer stop()
	page, closePage, err := Open(browser, hs.URL+"/")
	if err != nil {
		b.Fatal(err)
	}
	defer closePage()
	r, err := page.WaitRendered(time.Minute, 1)
	if err != nil {
		b.Fatal(err)
	}
	var draw float64
	b.ResetTimer()
	for b.Loop() {
		src.changed <- struct{}{}
		if r, err = page.WaitRendered(time.Minute, r.Generation+1); err != nil {
			b.Fatal(err)
		}
		draw += r.Ms
	}
	b.ReportMetric(draw/float64(b.N), "draw-ms")
	if errs := page.Errors(); len(errs) > 0 {
		b.Errorf("the page raised errors: %v", errs)
	}
}
