package cache

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

// fakeClock is a settable clock for assumption expiry.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (f *fakeClock) Now() time.Time { f.mu.Lock(); defer f.mu.Unlock(); return f.t }
func (f *fakeClock) Step(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.t = f.t.Add(d)
}

// Node builds a Node with gpu-mem total and gpu-count; gpus, when set, is the node GPU annotation.
func Node(name string, total, count int64, gpus *gpushare.NodeGPUs) *corev1.Node {
	res := corev1.ResourceList{
		gpushare.ResourceName:  *resource.NewQuantity(total, resource.DecimalSI),
		gpushare.ResourceCount: *resource.NewQuantity(count, resource.DecimalSI),
	}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Capacity: res, Allocatable: res.DeepCopy()}}
	if gpus != nil {
		s, err := gpushare.EncodeNodeGPUs(*gpus)
		if err != nil {
			panic(err)
		}
		n.Annotations = map[string]string{gpushare.AnnotationNodeGPUs: s}
	}
	return n
}

// Pod builds a pod with one container per units value, bound to node (when
// not empty) with the single-GPU annotations of gpu (when >= 0).
func Pod(name, node string, gpu int, assigned bool, units ...int64) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)}}
	var total uint64
	for i, u := range units {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{
			Name:      "c" + strconv.Itoa(i),
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{gpushare.ResourceName: *resource.NewQuantity(u, resource.DecimalSI)}},
		})
		total += uint64(u)
	}
	p.Spec.NodeName = node
	p.Status.Phase = corev1.PodPending
	if gpu >= 0 {
		a, err := gpushare.PodAssignment{GPUIndex: gpu, PodUnits: total, DevUnits: 16, Assigned: assigned, AssumeTime: 1}.Encode()
		if err != nil {
			panic(err)
		}
		p.Annotations = a
	}
	return p
}

type fixture struct {
	t      *testing.T
	client *fake.Clientset
	cache  *Cache
	clock  *fakeClock
	api    *fakeAPI
}

// testTTL is the fixture's assume TTL. Run verifies every quarter of it on
// the real clock, so it is long enough never to tick during a test: the
// tests call verifyDue themselves, on the fake clock.
const testTTL = time.Hour

func start(t *testing.T, objs ...runtime.Object) *fixture {
	t.Helper()
	return startWith(t, nil, objs...)
}

// startWith starts a cache whose verification GETs go to api, or to the fake
// clientset when api is nil.
func startWith(t *testing.T, api *fakeAPI, objs ...runtime.Object) *fixture {
	t.Helper()
	f := &fixture{t: t, client: fake.NewClientset(objs...), clock: &fakeClock{t: time.Unix(1000, 0)}, api: api}
	cfg := Config{Client: f.client, Logger: zaptest.NewLogger(t), AssumeTTL: testTTL, Now: f.clock.Now}
	if api != nil {
		cfg.Verify, cfg.VerifyBatch = api.Get, api.batch
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.cache = c
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
	defer scancel()
	if !c.WaitForSync(sctx) {
		t.Fatal("cache did not sync")
	}
	return f
}

// eventually polls cond until it holds or a deadline passes.
func (f *fixture) eventually(what string, cond func() bool) {
	f.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			f.t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}

// used returns the charged units per GPU index of node, nil when unknown.
func (f *fixture) used(node string) []uint64 {
	n, ok := f.cache.Node(node)
	if !ok {
		return nil
	}
	out := make([]uint64, len(n.GPUs))
	for i, g := range n.GPUs {
		out[i] = g.Used
	}
	return out
}

func (f *fixture) waitUsed(node string, want ...uint64) {
	f.t.Helper()
	f.eventually("usage "+node, func() bool {
		got := f.used(node)
		if len(got) != len(want) {
			return false
		}
		for i := range got {
			if got[i] != want[i] {
				return false
			}
		}
		return true
	})
}

func TestNodeLayout(t *testing.T) {
	mixed := &gpushare.NodeGPUs{Unit: gpushare.GiB, GPUs: []gpushare.GPUInfo{
		{Index: 0, Units: 80, Healthy: true}, {Index: 1, Units: 24, Healthy: false, Reason: "XID 79"},
	}}
	f := start(t, Node("annotated", 104, 2, mixed), Node("fallback", 64, 4, nil), Node("cpu", 0, 0, nil))
	n, ok := f.cache.Node("annotated")
	if !ok || !n.GPUShare || len(n.GPUs) != 2 || n.GPUs[0].Units != 80 || n.GPUs[1].Units != 24 || n.GPUs[1].Healthy {
		t.Fatalf("annotated node = %+v", n)
	}
	n, _ = f.cache.Node("fallback")
	if len(n.GPUs) != 4 || n.GPUs[3].Units != 16 || !n.GPUs[3].Healthy {
		t.Fatalf("fallback node = %+v", n)
	}
	if n, _ := f.cache.Node("cpu"); n.GPUShare {
		t.Fatalf("cpu node shares GPUs: %+v", n)
	}
	ctx := context.Background()
	// Resize: the device plugin now reports 8 GPUs of 16.
	if _, err := f.client.CoreV1().Nodes().Update(ctx, Node("fallback", 128, 8, nil), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitUsed("fallback", 0, 0, 0, 0, 0, 0, 0, 0)
	// New node seen at once.
	if _, err := f.client.CoreV1().Nodes().Create(ctx, Node("new", 32, 2, nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitUsed("new", 0, 0)
	if err := f.client.CoreV1().Nodes().Delete(ctx, "new", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.eventually("node deleted", func() bool { _, ok := f.cache.Node("new"); return !ok })
}

func TestUnhealthyConfigMap(t *testing.T) {
	f := start(t, Node("n1", 64, 4, nil))
	ctx := context.Background()
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: gpushare.UnhealthyConfigMapNamespace, Name: gpushare.UnhealthyConfigMapName("n1")},
		Data:       map[string]string{gpushare.UnhealthyConfigMapKey: "0, 2,x"},
	}
	if _, err := f.client.CoreV1().ConfigMaps(cm.Namespace).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	healthy := func() []bool {
		n, _ := f.cache.Node("n1")
		var out []bool
		for _, g := range n.GPUs {
			out = append(out, g.Healthy)
		}
		return out
	}
	// The items before the typo still count: GPUs 0 and 2 are avoided.
	f.eventually("GPUs 0 and 2 unhealthy", func() bool { h := healthy(); return !h[0] && h[1] && !h[2] && h[3] })
	if err := f.client.CoreV1().ConfigMaps(cm.Namespace).Delete(ctx, cm.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.eventually("all healthy again", func() bool { h := healthy(); return h[0] && h[2] })
}

func TestPodLifecycle(t *testing.T) {
	f := start(t, Node("n1", 64, 4, nil))
	ctx := context.Background()
	pods := f.client.CoreV1().Pods("default")
	// Unbound pods hold nothing.
	p, err := pods.Create(ctx, Pod("p", "", -1, false, 4), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Bound with annotations: charged and in flight.
	p = Pod("p", "n1", 2, false, 4)
	if p, err = pods.Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitUsed("n1", 0, 0, 4, 0)
	if n, _ := f.cache.Node("n1"); len(n.InFlight) != 1 || n.InFlight[0].Slots[0] != (allocator.Slot{Units: 4, GPUs: gpushare.NewGPUSet(2)}) {
		t.Fatalf("in flight = %+v", n.InFlight)
	}
	// Assigned by the plugin: still charged, no longer in flight.
	p.Annotations[gpushare.AnnotationAssigned] = "true"
	if p, err = pods.Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.eventually("not in flight", func() bool { n, _ := f.cache.Node("n1"); return len(n.InFlight) == 0 })
	f.waitUsed("n1", 0, 0, 4, 0)
	// Terminating: containers may still run, so it stays charged.
	now := metav1.Now()
	p.DeletionTimestamp = &now
	p.Status.Phase = corev1.PodRunning
	if p, err = pods.Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A second pod's update proves the first update was processed before we check.
	if _, err := pods.Create(ctx, Pod("marker", "n1", 0, true, 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitUsed("n1", 1, 0, 4, 0)
	// Succeeded: released.
	p.Status.Phase = corev1.PodSucceeded
	if _, err = pods.Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitUsed("n1", 1, 0, 0, 0)
	// Deleted: released.
	if err := pods.Delete(ctx, "marker", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitUsed("n1", 0, 0, 0, 0)
}

func TestRebuildFromAnnotations(t *testing.T) {
	// A restarted extender sees these pods only through the initial list.
	split := Pod("split", "n1", -1, false, 10, 10)
	a, err := gpushare.PodAssignment{GPUIndex: -1, PodUnits: 20, DevUnits: 16, Allocation: gpushare.Allocation{0: {1: 10}, 1: {3: 10}}}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	split.Annotations = a
	bad := Pod("bad", "n1", 0, false, 4)
	bad.Annotations[gpushare.AnnotationGPUIndex] = "zero"
	unannotated := Pod("foreign", "n1", -1, false, 4)
	f := start(t, Node("n1", 64, 4, nil), Pod("a", "n1", 0, true, 4), Pod("b", "n1", 0, false, 6), split, bad, unannotated)
	f.waitUsed("n1", 10, 10, 0, 10)
	in, ok := f.cache.Inspect("n1")
	if !ok || len(in.Nodes) != 1 || in.Nodes[0].TotalGPU != 64 || in.Nodes[0].UsedGPU != 30 {
		t.Fatalf("inspect = %+v", in)
	}
	dev0 := in.Nodes[0].Devs[0]
	if len(dev0.Pods) != 2 || dev0.Pods[0].Name != "a" || dev0.Pods[0].UsedGPU != 4 || dev0.Pods[1].Name != "b" {
		t.Fatalf("dev0 = %+v", dev0)
	}
	if _, ok := f.cache.Inspect("nope"); ok {
		t.Fatal("inspect of an unknown node succeeded")
	}
}

func TestAssume(t *testing.T) {
	f := start(t, Node("n1", 32, 2, nil))
	pod := Pod("p", "", -1, false, 10)
	got, err := f.cache.Assume(RecordOf(pod), "n1", allocator.BestFit)
	if err != nil || got.Placement.Home != 0 {
		t.Fatalf("Assume = %+v, %v", got, err)
	}
	f.waitUsed("n1", 10, 0)
	// The next pod sees the capacity taken and goes to GPU 1. (A second
	// 10-unit pod would be held back: p is in flight with that size on GPU 0.)
	if got, err := f.cache.Assume(RecordOf(Pod("q", "", -1, false, 9)), "n1", allocator.BestFit); err != nil || got.Placement.Home != 1 {
		t.Fatalf("second Assume = %+v, %v", got, err)
	}
	// A third does not fit: an *Unfit, and nothing charged.
	var unfit *allocator.Unfit
	if _, err := f.cache.Assume(RecordOf(Pod("r", "", -1, false, 8)), "n1", allocator.BestFit); !errors.As(err, &unfit) {
		t.Fatalf("third Assume err = %v", err)
	}
	f.waitUsed("n1", 10, 9)
	f.cache.Forget(types.UID("uid-q"))
	f.waitUsed("n1", 10, 0)
	if _, err := f.cache.Assume(RecordOf(pod), "nope", allocator.BestFit); !errors.Is(err, ErrUnknownNode) {
		t.Fatalf("unknown node err = %v", err)
	}

	// Confirmed by the informer: never verified, whatever the time.
	f.cache.FinishBinding(pod.UID)
	if _, err := f.client.CoreV1().Pods("default").Create(context.Background(), Pod("p", "n1", 0, false, 10), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.eventually("confirmed", func() bool {
		f.cache.mu.RLock()
		defer f.cache.mu.RUnlock()
		p, ok := f.cache.pods[pod.UID]
		return ok && !p.assumed
	})
	f.clock.Step(100 * testTTL)
	if got := f.cache.due(); len(got) != 0 {
		t.Fatalf("a confirmed pod is due for verification: %+v", got)
	}
	f.waitUsed("n1", 10, 0)
	if _, err := f.cache.Assume(RecordOf(pod), "n1", allocator.BestFit); !errors.Is(err, ErrAlreadyBound) {
		t.Fatalf("re-assume of a bound pod err = %v", err)
	}
}

func TestAssumedSurvivesAnnotatedUnboundUpdate(t *testing.T) {
	f := start(t, Node("n1", 32, 2, nil))
	pod := Pod("p", "", -1, false, 10)
	if _, err := f.cache.Assume(RecordOf(pod), "n1", allocator.BestFit); err != nil {
		t.Fatal(err)
	}
	// The binder's PATCH lands before its Binding: annotated, not yet bound.
	annotated := Pod("p", "", 0, false, 10)
	f.cache.upsertPod(annotated, false)
	if got := f.used("n1"); got[0] != 10 {
		t.Fatalf("assumption dropped by the PATCH event: %v", got)
	}
}

func TestTombstoneDelete(t *testing.T) {
	f := start(t, Node("n1", 32, 2, nil))
	p := Pod("p", "n1", 1, true, 3)
	f.cache.upsertPod(p, false)
	f.waitUsed("n1", 0, 3)
	f.cache.deletePod(toolscache.DeletedFinalStateUnknown{Key: "default/p", Obj: p})
	f.waitUsed("n1", 0, 0)
	f.cache.deleteNode(toolscache.DeletedFinalStateUnknown{Key: "n1", Obj: Node("n1", 32, 2, nil)})
	if _, ok := f.cache.Node("n1"); ok {
		t.Fatal("node survived its tombstone")
	}
	// Garbage in a tombstone is ignored, not a panic.
	f.cache.deletePod(toolscache.DeletedFinalStateUnknown{Key: "x", Obj: 42})
	f.cache.deleteConfigMap("not a configmap")
}

func TestNodeDeletedKeepsPodCharges(t *testing.T) {
	f := start(t, Node("n1", 32, 2, nil), Pod("p", "n1", 1, true, 3))
	f.waitUsed("n1", 0, 3)
	ctx := context.Background()
	if err := f.client.CoreV1().Nodes().Delete(ctx, "n1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.eventually("node gone", func() bool { _, ok := f.cache.Node("n1"); return !ok })
	// The node comes back (e.g. re-registered): its pods are still charged.
	if _, err := f.client.CoreV1().Nodes().Create(ctx, Node("n1", 32, 2, nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitUsed("n1", 0, 3)
}

// A bind the scheduler retries: while the first is running the retry is refused (replacing the
// assumption would let the losing Binding forget the winner's charge); once it is done, the retry
// learns the node the pod is bound to, and the charge stays.
func TestAssumeRetriedBind(t *testing.T) {
	f := start(t, Node("n1", 32, 2, nil))
	pod := Pod("p", "", -1, false, 10)
	if _, err := f.cache.Assume(RecordOf(pod), "n1", allocator.BestFit); err != nil {
		t.Fatal(err)
	}
	if _, err := f.cache.Assume(RecordOf(pod), "n1", allocator.BestFit); !errors.Is(err, ErrBindInProgress) {
		t.Fatalf("retry during the bind: err = %v; want ErrBindInProgress", err)
	}
	f.cache.FinishBinding(pod.UID)
	_, err := f.cache.Assume(RecordOf(pod), "n1", allocator.BestFit)
	var bound *BoundError
	if !errors.As(err, &bound) || bound.Node != "n1" || !errors.Is(err, ErrAlreadyBound) {
		t.Fatalf("retry after the bind: err = %v; want a BoundError naming n1", err)
	}
	f.waitUsed("n1", 10, 0)
}

func TestNodeLayoutIsolation(t *testing.T) {
	tiers := &gpushare.NodeGPUs{Unit: gpushare.GiB, GPUs: []gpushare.GPUInfo{
		{Index: 0, Units: 80, Healthy: true, Isolation: gpushare.IsolationMPS},
		{Index: 1, Units: 80, Healthy: true, Isolation: gpushare.IsolationNone, IsolationReason: "MPS control daemon not answering"},
	}}
	f := start(t, Node("tiers", 160, 2, tiers), Node("old", 32, 2, nil))
	n, _ := f.cache.Node("tiers")
	if n.TierAt(0) != allocator.TierMPS || n.TierAt(1) != allocator.TierFenced ||
		len(n.IsolationReasons) != 1 || n.IsolationReasons[1] != "MPS control daemon not answering" {
		t.Fatalf("tiers %v, reasons %v; want mps, GPU 1 fenced (it fell back) with its reason", n.Tiers, n.IsolationReasons)
	}
	// Without the annotation there is no tier: none, as the old plugin
	// offers, and nothing is kept for it.
	if n, _ := f.cache.Node("old"); n.Tiers != nil || n.TierAt(0) != allocator.TierNone || n.IsolationReasons != nil {
		t.Fatalf("derived node has tiers %v, reasons %v", n.Tiers, n.IsolationReasons)
	}
}

// withIsolation returns pod with isolation annotations (empty values left out).
func withIsolation(pod *corev1.Pod, tier, percent string) *corev1.Pod {
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	if tier != "" {
		pod.Annotations[gpushare.AnnotationIsolation] = tier
	}
	if percent != "" {
		pod.Annotations[gpushare.AnnotationComputePercent] = percent
	}
	return pod
}

// Two pods of equal size and different compute shares on one node: the
// device plugin could not tell their containers apart, yet would give them
// different limits, so the second waits for the first, naming it.
func TestAssumeComputePercentHoldBack(t *testing.T) {
	mps := &gpushare.NodeGPUs{Unit: gpushare.GiB, GPUs: []gpushare.GPUInfo{
		{Index: 0, Units: 16, Healthy: true, Isolation: gpushare.IsolationMPS},
		{Index: 1, Units: 16, Healthy: true, Isolation: gpushare.IsolationMPS},
	}}
	f := start(t, Node("n1", 32, 2, mps))
	if _, err := f.cache.Assume(RecordOf(withIsolation(Pod("p", "", -1, false, 4), "", "30")), "n1", allocator.BestFit); err != nil {
		t.Fatal(err)
	}
	if n, _ := f.cache.Node("n1"); len(n.InFlight) != 1 || n.InFlight[0].Isolation.ComputePercent() != 30 {
		t.Fatalf("in flight %+v; want p with its 30%% share", n.InFlight)
	}
	var unfit *allocator.Unfit
	_, err := f.cache.Assume(RecordOf(withIsolation(Pod("q", "", -1, false, 4), "", "50")), "n1", allocator.BestFit)
	if !errors.As(err, &unfit) || unfit.Unresolvable || !strings.Contains(unfit.Reason, "waiting for pod default/p") ||
		!strings.Contains(unfit.Reason, "compute-percent 30") {
		t.Fatalf("second pod: %v; want it to wait for default/p and its compute-percent 30", err)
	}
	// The same share shares the signature: it goes beside p.
	got, err := f.cache.Assume(RecordOf(withIsolation(Pod("r", "", -1, false, 4), "", "30")), "n1", allocator.BestFit)
	if err != nil || got.Placement.Home != 0 {
		t.Fatalf("a pod of p's share: %+v, %v; want GPU 0 beside p", got, err)
	}
	// Once p and r leave the in-flight set (here: forgotten), q goes.
	f.cache.Forget("uid-p")
	f.cache.Forget("uid-r")
	if _, err := f.cache.Assume(RecordOf(withIsolation(Pod("q", "", -1, false, 4), "", "50")), "n1", allocator.BestFit); err != nil {
		t.Fatalf("q after p left: %v", err)
	}
}

// A pod whose required tier the node no longer offers is refused at bind,
// with the filter's reason, and nothing is charged.
func TestAssumeTierNotOffered(t *testing.T) {
	fellBack := &gpushare.NodeGPUs{Unit: gpushare.GiB, GPUs: []gpushare.GPUInfo{
		{Index: 0, Units: 16, Healthy: true, Isolation: gpushare.IsolationNone, IsolationReason: "MPS control daemon not answering"},
	}}
	f := start(t, Node("n1", 16, 1, fellBack))
	var unfit *allocator.Unfit
	_, err := f.cache.Assume(RecordOf(withIsolation(Pod("p", "", -1, false, 4), "mps", "")), "n1", allocator.BestFit)
	if !errors.As(err, &unfit) || !unfit.Unresolvable ||
		unfit.Reason != `no GPU offers isolation "mps" (GPU 0: none, MPS control daemon not answering)` {
		t.Fatalf("Assume = %v; want the unoffered tier's reason", err)
	}
	if _, err := f.cache.Assume(RecordOf(withIsolation(Pod("q", "", -1, false, 4), "", "abc")), "n1", allocator.BestFit); !errors.Is(err, gpushare.ErrInvalidIsolation) {
		t.Fatalf("Assume of unreadable annotations = %v; want ErrInvalidIsolation", err)
	}
	f.waitUsed("n1", 0)
}

// A bound pod in flight whose annotations became unreadable still holds its
// memory and holds back its size on the node.
func TestUnreadableInFlightHoldsBack(t *testing.T) {
	bad := withIsolation(Pod("p", "n1", 0, false, 4), "", "abc")
	f := start(t, Node("n1", 32, 2, nil), bad)
	f.waitUsed("n1", 4, 0)
	var unfit *allocator.Unfit
	if _, err := f.cache.Assume(RecordOf(Pod("q", "", -1, false, 4)), "n1", allocator.BestFit); !errors.As(err, &unfit) ||
		!strings.Contains(unfit.Reason, "waiting for pod default/p") {
		t.Fatalf("Assume beside an unreadable in-flight pod = %v; want it to wait", err)
	}
}

// Release drops a terminating pod the caller saw deleted, ignores its late
// updates, and forgets it once this cache's informer delivers the deletion;
// a pod not terminating here is kept whatever the caller says.
func TestReleaseDropsTerminatingUntilDeleted(t *testing.T) {
	ctx := context.Background()
	going := Pod("going", "n1", 1, true, 4)
	now := metav1.Now()
	going.DeletionTimestamp, going.Status.Phase = &now, corev1.PodRunning
	f := start(t, Node("n1", 64, 4, nil), going, Pod("live", "n1", 2, true, 4))
	pods := f.client.CoreV1().Pods("default")
	f.waitUsed("n1", 0, 4, 4, 0)
	// Terminating is not deleted: its containers run through the grace
	// period, and the informer's store still holds it.
	if n := f.cache.Release("n1", []string{"uid-going", "uid-live", "uid-unknown"}); n != 0 {
		t.Fatalf("Release = %d pods; want 0 while the informer still holds going", n)
	}
	f.waitUsed("n1", 0, 4, 4, 0)
	// The store drops a deleted pod before the cache's handler hears of it
	// (kube-scheduler's handler may run first): that is the evidence.
	storedGoing, _, _ := f.cache.podInformer.GetStore().GetByKey("default/going")
	if err := f.cache.podInformer.GetStore().Delete(storedGoing); err != nil {
		t.Fatal(err)
	}
	if n := f.cache.Release("n1", []string{"uid-going", "uid-live", "uid-unknown"}); n != 1 {
		t.Fatalf("Release = %d pods; want 1 (live is not terminating, unknown is not charged)", n)
	}
	if got := f.used("n1"); !slices.Equal(got, []uint64{0, 0, 4, 0}) {
		t.Fatalf("after Release used = %v; want going's 4 units on GPU 1 freed and live's kept", got)
	}
	// A late update of the released pod must not charge it again.
	going.Status.Message = "stopping"
	if _, err := pods.Update(ctx, going, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := pods.Create(ctx, Pod("marker", "n1", 0, true, 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitUsed("n1", 1, 0, 4, 0)
	if err := pods.Delete(ctx, "going", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.eventually("the deletion to clear the release", func() bool {
		f.cache.mu.RLock()
		defer f.cache.mu.RUnlock()
		return len(f.cache.released) == 0
	})
	if n := f.cache.Release("nowhere", []string{"uid-live"}); n != 0 {
		t.Fatalf("Release on an unknown node = %d; want 0", n)
	}
}

// TestSharedInformers: with Config.Shared the cache reads the factory's pod
// and node informers (kube-scheduler's, in plugin mode) and opens no watch of
// pods or nodes of its own; charges follow the shared informer's events.
func TestSharedInformers(t *testing.T) {
	client := fake.NewClientset(Node("n1", 64, 4, nil), Pod("p", "n1", 2, true, 4))
	shared := informers.NewSharedInformerFactory(client, 0)
	schedulerPods := shared.Core().V1().Pods().Informer() // registered first, as the scheduler does
	c, err := New(Config{Client: client, Logger: zaptest.NewLogger(t), AssumeTTL: testTTL, Shared: shared})
	if err != nil {
		t.Fatal(err)
	}
	// Informer() wraps the factory's informer anew each time; the store is the informer's own.
	if c.podInformer.GetStore() != schedulerPods.GetStore() {
		t.Fatal("the cache built a pod informer of its own")
	}
	f := &fixture{t: t, client: client, cache: c}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; shared.Shutdown() })
	sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
	defer scancel()
	if !c.WaitForSync(sctx) {
		t.Fatal("cache did not sync")
	}
	f.waitUsed("n1", 0, 0, 4, 0)
	if r, ok := c.Pod("default", "p"); !ok || r.NodeName != "n1" {
		t.Fatalf("Pod(p) = %+v, %v", r, ok)
	}
	if err := client.CoreV1().Pods("default").Delete(ctx, "p", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitUsed("n1", 0, 0, 0, 0)
	watches := map[string]int{}
	for _, a := range client.Actions() {
		if a.GetVerb() == "watch" {
			watches[a.GetResource().Resource]++
		}
	}
	if watches["pods"] != 1 || watches["nodes"] != 1 {
		t.Errorf("watches = %v, want one of pods and one of nodes", watches)
	}
}

// OnFreed hears of exactly the changes that can end a hold-back or free
// room, after they are visible: a reader it wakes must not see the old view.
func TestOnFreed(t *testing.T) {
	var calls []string
	var c *Cache
	c, err := New(Config{Client: fake.NewClientset(), Logger: zaptest.NewLogger(t), OnFreed: func() {
		n, _ := c.Node("n1")
		calls = append(calls, fmt.Sprintf("used %d, in flight %d", n.GPUs[0].Used+n.GPUs[1].Used, len(n.InFlight)))
	}})
	if err != nil {
		t.Fatal(err)
	}
	c.upsertNode(Node("n1", 32, 2, nil))
	steps := []struct {
		what   string
		change func()
		want   []string
	}{
		{"bound, in flight", func() { c.upsertPod(Pod("p", "n1", 0, false, 4), false) }, nil},
		{"a status update", func() {
			p := Pod("p", "n1", 0, false, 4)
			p.Status.Phase = corev1.PodRunning
			c.upsertPod(p, false)
		}, nil},
		{"allocated by the device plugin", func() { c.upsertPod(Pod("p", "n1", 0, true, 4), false) }, []string{"used 4, in flight 0"}},
		{"allocated again", func() { c.upsertPod(Pod("p", "n1", 0, true, 4), false) }, nil},
		{"deleted", func() { c.deletePod(Pod("p", "n1", 0, true, 4)) }, []string{"used 0, in flight 0"}},
		{"assumed", func() {
			if _, err := c.Assume(RecordOf(Pod("q", "", -1, false, 6)), "n1", allocator.BestFit); err != nil {
				t.Fatal(err)
			}
		}, nil},
		{"forgotten", func() { c.Forget("uid-q") }, []string{"used 0, in flight 0"}},
		{"a pod never charged deleted", func() { c.deletePod(Pod("r", "n1", 1, true, 2)) }, nil},
	}
	for _, s := range steps {
		calls = nil
		s.change()
		if !slices.Equal(calls, s.want) {
			t.Errorf("%s: OnFreed saw %q, want %q", s.what, calls, s.want)
		}
	}
}

// TestForeignBinds: a pod the informer shows bound with a GPU assignment that
// this cache never charged, signed by another binder or by none, is reported
// once; pods of the initial list, pods this cache charged and pods signed
// with this binder's name (another replica's) are not.
func TestForeignBinds(t *testing.T) {
	signed := func(p *corev1.Pod, by string) *corev1.Pod {
		if by != "" {
			p.Annotations[gpushare.AnnotationBoundBy] = by
		}
		return p
	}
	client := fake.NewClientset(Node("n1", 64, 4, nil), signed(Pod("listed", "n1", 0, true, 4), "other"))
	var mu sync.Mutex
	var reported []string
	c, err := New(Config{Client: client, Logger: zaptest.NewLogger(t), AssumeTTL: testTTL, Binder: "me",
		OnForeignBind: func(p *PodRecord) { mu.Lock(); defer mu.Unlock(); reported = append(reported, p.Name) }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	if !c.WaitForSync(ctx) {
		t.Fatal("no sync")
	}
	pods := client.CoreV1().Pods("default")
	mine := Pod("mine", "", -1, false, 4)
	if _, err := c.Assume(RecordOf(mine), "n1", allocator.BestFit); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*corev1.Pod{
		signed(Pod("mine", "n1", 1, false, 4), "me"),      // charged here first
		signed(Pod("replica", "n1", 1, false, 4), "me"),   // another replica of this binder
		signed(Pod("theirs", "n1", 2, false, 4), "other"), // the other binder
		Pod("unsigned", "n1", 3, false, 4),                // Alibaba's extender, or by hand
		Pod("pending", "", -1, false, 4),                  // not bound: nobody's yet
	} {
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// An update of a foreign pod already charged is not a second report.
	again := signed(Pod("theirs", "n1", 2, true, 4), "other")
	if _, err := pods.Update(ctx, again, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := pods.Create(ctx, signed(Pod("marker", "n1", 0, true, 1), "me"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Events come in order: once the marker is charged, every pod before it was seen.
	f := &fixture{t: t, client: client, cache: c}
	f.eventually("the marker charged", func() bool { return f.used("n1")[0] == 4+1 })
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(reported, []string{"theirs", "unsigned"}) {
		t.Fatalf("reported %v, want [theirs unsigned]", reported)
	}
}
