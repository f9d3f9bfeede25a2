package gpushareplugin

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/extender/cache"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

// A pod Filter holds back behind an in-flight pod is activated once the
// cache, which Filter reads, has seen the in-flight pod allocated: its retry
// then fits. The scheduler's own copy of that event is not relied on.
func TestHeldPodActivatedByTheCache(t *testing.T) {
	node := gpuNode("n1", 2)
	// GPU 0 has 20 units free, GPU 1 10 beside an in-flight pod of 20 units:
	// a second pod of 20 fits only GPU 0, and waits (docs/design.md rule 2)
	// until the device plugin has allocated the first.
	var bound []*corev1.Pod
	for gpu, units := range []uint64{60, 50} {
		b := benchPod(fmt.Sprintf("bound-%d", gpu), units)
		b.Spec.NodeName = "n1"
		b.Annotations = mustEncode(t, gpushare.PodAssignment{GPUIndex: gpu, PodUnits: units, DevUnits: 80, Assigned: true, AssumeTime: 1})
		bound = append(bound, b)
	}
	inFlight := benchPod("in-flight", 20)
	inFlight.Spec.NodeName = "n1"
	inFlight.Annotations = mustEncode(t, gpushare.PodAssignment{GPUIndex: 1, PodUnits: 20, DevUnits: 80, AssumeTime: 2})
	client := fake.NewClientset(node, bound[0], bound[1], inFlight)

	activated := make(chan map[string]*corev1.Pod, 1)
	held := &heldPods{activate: func(pods map[string]*corev1.Pod) { activated <- pods }}
	c := syncedCache(t, cache.Config{Client: client, OnFreed: held.release})
	ctx := context.Background()
	p := &Plugin{cache: c, policy: allocator.BestFit, log: zap.NewNop(), held: held}
	info := framework.NewNodeInfo(bound[0], bound[1], inFlight)
	info.SetNode(node)

	pod := benchPod("waiting", 20)
	cs := framework.NewCycleState()
	if _, st := p.PreFilter(ctx, cs, pod, nil); !st.IsSuccess() {
		t.Fatal(st.AsError())
	}
	if st := p.Filter(ctx, cs, pod, info); st.Code() != fwk.Pending {
		t.Fatalf("Filter behind an in-flight pod: %v, want Pending", st)
	}
	inFlight.Annotations[gpushare.AnnotationAssigned] = "true"
	if _, err := client.CoreV1().Pods("default").Update(ctx, inFlight, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case pods := <-activated:
		if pods["default/waiting"] != pod || len(pods) != 1 {
			t.Fatalf("activated %v, want the held pod", pods)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the held pod was never activated")
	}
	if st := p.Filter(ctx, cs, pod, info); !st.IsSuccess() {
		t.Fatalf("Filter after the in-flight pod was allocated: %v", st)
	}
}

func mustEncode(t *testing.T, a gpushare.PodAssignment) map[string]string {
	t.Helper()
	m, err := a.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// Score rates each node as the extender's prioritize does on the cache,
// though it reads the placement Filter found instead of placing again.
func TestScoreIsPrioritize(t *testing.T) {
	var objs []runtime.Object
	var infos []fwk.NodeInfo
	for i := range 12 {
		node := gpuNode(fmt.Sprintf("n%02d", i), 4)
		info := framework.NewNodeInfo()
		info.SetNode(node)
		objs = append(objs, node)
		for gpu := range 4 {
			units := uint64((i*13+gpu*29)%70 + 1)
			b := benchPod(fmt.Sprintf("bound-%d-%d", i, gpu), units)
			b.Spec.NodeName = node.Name
			b.Annotations = mustEncode(t, gpushare.PodAssignment{GPUIndex: gpu, PodUnits: units, DevUnits: 80, Assigned: true, AssumeTime: 1})
			objs = append(objs, b)
			info.AddPod(b)
		}
		infos = append(infos, info)
	}
	for _, policy := range []allocator.Policy{allocator.BestFit, allocator.Spread} {
		p := &Plugin{cache: syncedCache(t, cache.Config{Client: fake.NewClientset(objs...)}), policy: policy, log: zap.NewNop(), held: &heldPods{}}
		ctx := context.Background()
		for _, units := range []uint64{5, 24} {
			pod := benchPod(fmt.Sprintf("p%d", units), units)
			cs := framework.NewCycleState()
			if _, st := p.PreFilter(ctx, cs, pod, infos); !st.IsSuccess() {
				t.Fatal(st.AsError())
			}
			req := mustRequest(t, pod)
			scores := map[int64]int{}
			for _, info := range infos {
				if st := p.Filter(ctx, cs, pod, info); !st.IsSuccess() {
					t.Fatal(st.AsError())
				}
				got, st := p.Score(ctx, cs, pod, info)
				if !st.IsSuccess() {
					t.Fatal(st.AsError())
				}
				n, _ := p.cache.Node(info.Node().Name)
				if want := allocator.Score(n, req, policy) * 10; got != want {
					t.Errorf("%v, pod of %d units, node %s: Score %d, prioritize %d", policy, units, n.Name, got, want)
				}
				scores[got]++
			}
			if len(scores) < 3 {
				t.Errorf("%v, pod of %d units: scores %v, too few distinct for the test to tell", policy, units, scores)
			}
		}
	}
}

// gpuNode is a gpushare node of gpus × 80 units.
func gpuNode(name string, gpus int64) *corev1.Node {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{gpushare.LabelGPUShare: gpushare.LabelValueTrue}}}
	node.Status.Allocatable = corev1.ResourceList{gpushare.ResourceName: *resource.NewQuantity(80*gpus, resource.DecimalSI), gpushare.ResourceCount: *resource.NewQuantity(gpus, resource.DecimalSI)}
	node.Status.Capacity = node.Status.Allocatable
	return node
}

// syncedCache runs a cache of cfg until the test ends and returns it synced.
func syncedCache(t testing.TB, cfg cache.Config) *cache.Cache {
	t.Helper()
	cfg.Logger = zaptest.NewLogger(t)
	c, err := cache.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	sctx, scancel := context.WithTimeout(ctx, time.Minute)
	defer scancel()
	if !c.WaitForSync(sctx) {
		t.Fatal("the cache did not sync")
	}
	return c
}
