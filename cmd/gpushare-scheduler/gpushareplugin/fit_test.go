package gpushareplugin

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/extender/cache"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

// A fit Filter remembers on a node's published view answers the next pod
// that asks alike only while the node is unchanged: once a pod is charged
// there, a replica that no longer fits is refused.
func TestRememberedFitFollowsTheNode(t *testing.T) {
	node := gpuNode("n1", 1)
	client := fake.NewClientset(node)
	c := syncedCache(t, cache.Config{Client: client})
	p := &Plugin{cache: c, policy: allocator.BestFit, log: zap.NewNop(), held: &heldPods{}}
	ctx := context.Background()
	info := framework.NewNodeInfo()
	info.SetNode(node)

	first := benchPod("first", 60)
	s := filterOne(t, p, first, info)
	if !s.IsSuccess() {
		t.Fatalf("first replica on an empty GPU: %v", s)
	}
	pub, _ := c.Published("n1")
	key := fitKey(p.policy, mustRequest(t, first))
	if _, ok := pub.Fit(key); !ok {
		t.Fatal("Filter's fit is not remembered on the node's published view: the test proves nothing")
	}
	if s := filterOne(t, p, benchPod("second", 60), info); !s.IsSuccess() {
		t.Fatalf("a replica on the unchanged node: %v", s)
	}

	// 30 units charged on the GPU: the 60-unit replicas no longer fit.
	other := benchPod("other", 30)
	other.Spec.NodeName = "n1"
	other.Annotations = mustEncode(t, gpushare.PodAssignment{GPUIndex: 0, PodUnits: 30, DevUnits: 80, Assigned: true, AssumeTime: 1})
	if _, err := client.CoreV1().Pods("default").Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUsed(t, c, "n1", 30)
	if s := filterOne(t, p, benchPod("third", 60), info); s.Code() != fwk.Unschedulable && s.Code() != fwk.UnschedulableAndUnresolvable {
		t.Fatalf("a replica after 30 of 80 units were charged: %v, want refused", s)
	}
}

// In the scheduler's pass with a pod nominated to the node and the pass
// without it that follows, the last stands: Score rates the node as the
// cache has it, not with the nominated pod.
func TestScoreAfterNominatedPass(t *testing.T) {
	node := gpuNode("n1", 2)
	c := syncedCache(t, cache.Config{Client: fake.NewClientset(node)})
	p := &Plugin{cache: c, policy: allocator.BestFit, log: zap.NewNop(), held: &heldPods{}}
	ctx := context.Background()
	info := framework.NewNodeInfo()
	info.SetNode(node)
	pod := benchPod("p", 20)
	cs := framework.NewCycleState()
	if _, st := p.PreFilter(ctx, cs, pod, []fwk.NodeInfo{info}); !st.IsSuccess() {
		t.Fatal(st.AsError())
	}
	// With the nominated pod's 50 units on GPU 0, the pod would go beside it
	// (score 8); without, on an empty GPU (score 2).
	nominated, err := framework.NewPodInfo(benchPod("nominated", 50))
	if err != nil {
		t.Fatal(err)
	}
	withNominated := cs.Clone()
	if st := p.AddPod(ctx, withNominated, pod, nominated, info); !st.IsSuccess() {
		t.Fatal(st.AsError())
	}
	for _, pass := range []fwk.CycleState{withNominated, cs} {
		if st := p.Filter(ctx, pass, pod, info); !st.IsSuccess() {
			t.Fatal(st.AsError())
		}
	}
	got, st := p.Score(ctx, cs, pod, info)
	if !st.IsSuccess() {
		t.Fatal(st.AsError())
	}
	n, _ := c.Node("n1")
	if want := allocator.Score(n, mustRequest(t, pod), p.policy) * 10; got != want {
		t.Fatalf("Score %d, want %d (the node without the nominated pod)", got, want)
	}
}

func filterOne(t *testing.T, p *Plugin, pod *corev1.Pod, info fwk.NodeInfo) *fwk.Status {
	t.Helper()
	cs := framework.NewCycleState()
	if _, st := p.PreFilter(context.Background(), cs, pod, []fwk.NodeInfo{info}); !st.IsSuccess() {
		t.Fatal(st.AsError())
	}
	return p.Filter(context.Background(), cs, pod, info)
}

func mustRequest(t *testing.T, pod *corev1.Pod) allocator.Request {
	t.Helper()
	r, err := cache.RecordOf(pod).Request()
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// waitUsed waits until the cache charges units on node's first GPU.
func waitUsed(t *testing.T, c *cache.Cache, node string, units uint64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if n, ok := c.Node(node); ok && len(n.GPUs) > 0 && n.GPUs[0].Used == units {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cache never charged %d units on %s", units, node)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
