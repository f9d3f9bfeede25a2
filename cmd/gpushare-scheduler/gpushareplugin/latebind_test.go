package gpushareplugin

import (
	"context"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/extender/binder"
	"github.com/gpushare/gpushare/extender/cache"
)

// Plugin mode, Reserve → Bind → Unreserve: a Binding answered 504 may still
// be committed, so neither the binder nor Unreserve, which the scheduler
// calls after the failed Bind, drops the charge; the memory stays taken for
// the next pod.
func TestLateBindingKeptThroughUnreserve(t *testing.T) {
	node := gpuNode("n1", 1)
	pod := benchPod("late", 60)
	client := fake.NewClientset(node, pod)
	client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "binding" {
			return false, nil, nil
		}
		return true, nil, apierrors.NewTimeoutError("request did not complete within 60s", 0)
	})
	c := syncedCache(t, cache.Config{Client: client})
	p := &Plugin{cache: c, policy: allocator.BestFit, log: zap.NewNop(), held: &heldPods{},
		binder: binder.New(binder.Config{Client: client, Cache: c, Logger: zaptest.NewLogger(t)})}
	ctx := context.Background()
	info := framework.NewNodeInfo()
	info.SetNode(node)

	cs := framework.NewCycleState()
	if _, st := p.PreFilter(ctx, cs, pod, nil); !st.IsSuccess() {
		t.Fatal(st.AsError())
	}
	if st := p.Reserve(ctx, cs, pod, "n1"); !st.IsSuccess() {
		t.Fatal(st.AsError())
	}
	if st := p.Bind(ctx, cs, pod, "n1"); st.IsSuccess() {
		t.Fatal("Bind succeeded on a 504")
	}
	p.Unreserve(ctx, cs, pod, "n1")

	next := benchPod("next", 30)
	ncs := framework.NewCycleState()
	if _, st := p.PreFilter(ctx, ncs, next, nil); !st.IsSuccess() {
		t.Fatal(st.AsError())
	}
	if st := p.Filter(ctx, ncs, next, info); st.IsSuccess() {
		t.Fatal("a 30-unit pod fits an 80-unit GPU beside 60 units whose Binding may still be committed: the charge was dropped")
	}
	if n, _ := c.Node("n1"); n.GPUs[0].Used != 60 {
		t.Fatalf("%d units charged, want the 60 of the unclear Binding", n.GPUs[0].Used)
	}
}
