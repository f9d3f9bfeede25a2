package podsource_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gpushare/gpushare/plugin/podsource"
)

const nodeName = "gpu-1"

func testPod(name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)},
		Spec:       corev1.PodSpec{NodeName: nodeName},
	}
}

func testNode(labels map[string]string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, Labels: labels}}
}

// waitFor polls the source on each change until cond holds or the deadline passes.
func waitFor(t *testing.T, s *podsource.Source, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ch := s.Changed()
		if cond() {
			return
		}
		select {
		case <-ch:
		case <-time.After(time.Until(deadline)):
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func start(t *testing.T, client *fake.Clientset, opts ...zap.Option) *podsource.Source {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := podsource.New(client, nodeName, zaptest.NewLogger(t, zaptest.WrapOptions(opts...)))
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); s.Shutdown() })
	return s
}

func TestStoreFollowsPodsAndNode(t *testing.T) {
	ctx := t.Context()
	client := fake.NewClientset(testPod("a"), testNode(nil))
	// Reactors go in before Start: the fake's chain is not safe to change
	// while informers call it.
	var lists atomic.Int32
	client.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		lists.Add(1)
		return false, nil, nil
	})
	s := start(t, client)
	if p, ok := s.Pod("default", "a"); !ok || p.UID != "uid-a" {
		t.Fatalf("after Start: pod a = %v, %v", p, ok)
	}
	if n, ok := s.Node(); !ok || n.Name != nodeName {
		t.Fatalf("after Start: node = %v, %v", n, ok)
	}
	// A pod bound a moment ago reaches the store without a LIST.
	if _, err := client.CoreV1().Pods("default").Create(ctx, testPod("b"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, s, "pod b", func() bool { _, ok := s.Pod("default", "b"); return ok })
	if got := s.Pods(); len(got) != 2 || got[0].Name != "a" || got[1].Name != "b" {
		t.Errorf("Pods = %v", got)
	}
	if err := client.CoreV1().Pods("default").Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, s, "pod a deleted", func() bool { _, ok := s.Pod("default", "a"); return !ok })
	if _, err := client.CoreV1().Nodes().Update(ctx, testNode(map[string]string{"cgpu.disable.isolation": "true"}), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, s, "node label", func() bool { n, ok := s.Node(); return ok && n.Labels["cgpu.disable.isolation"] == "true" })

	for range 3 {
		_ = s.Pods()
	}
	// One list at Start; changes and reads came through the watch and the cache.
	if lists.Load() != 1 {
		t.Errorf("listed pods %d times; want only Start's list", lists.Load())
	}

	// The fake clientset ignores field selectors, so check what was asked:
	// only this node's pods and this node, never the cluster's.
	want := map[string]string{"pods": "spec.nodeName=" + nodeName, "nodes": "metadata.name=" + nodeName}
	seen := map[string]bool{}
	for _, a := range client.Actions() {
		var sel string
		switch a := a.(type) {
		case k8stesting.ListAction:
			sel = a.GetListRestrictions().Fields.String()
		case k8stesting.WatchAction:
			sel = a.GetWatchRestrictions().Fields.String()
		default:
			continue
		}
		res := a.GetResource().Resource
		if sel != want[res] {
			t.Errorf("%s %s with field selector %q; want %q", a.GetVerb(), res, sel, want[res])
		}
		seen[a.GetVerb()+" "+res] = true
	}
	for _, v := range []string{"list pods", "watch pods", "list nodes", "watch nodes"} {
		if !seen[v] {
			t.Errorf("no %s call; saw %v", v, seen)
		}
	}
}

// When the server says the watched version is gone, the informer lists
// again and picks up what it missed: a pod created meanwhile, and a pod
// deleted meanwhile, which arrives as a DeletedFinalStateUnknown tombstone.
func TestRelistOnExpiredWatch(t *testing.T) {
	ctx := t.Context()
	client := fake.NewClientset(testNode(nil), testPod("gone"))
	var lists atomic.Int32
	client.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		lists.Add(1)
		return false, nil, nil
	})
	// The first pod watch is one the test controls; the tracker never
	// sends it anything, so what happens next is missed until a relist.
	var once sync.Once
	expired := watch.NewFake()
	client.PrependWatchReactor("pods", func(k8stesting.Action) (bool, watch.Interface, error) {
		handled := false
		once.Do(func() { handled = true })
		if handled {
			return true, expired, nil
		}
		return false, nil, nil
	})
	core, logs := observer.New(zap.DebugLevel)
	s := start(t, client, zap.WrapCore(func(c zapcore.Core) zapcore.Core { return zapcore.NewTee(c, core) }))
	if _, ok := s.Pod("default", "gone"); !ok {
		t.Fatal("pod gone not in the first list")
	}
	if _, err := client.CoreV1().Pods("default").Create(ctx, testPod("missed"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := client.CoreV1().Pods("default").Delete(ctx, "gone", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// Error blocks until the informer reads it, so its watch is open.
	expired.Error(&apierrors.NewResourceExpired("too old resource version").ErrStatus)
	// The handler logs before it wakes waiters, so the wait covers the log.
	tombstones := func() int {
		return logs.FilterMessage("deleted").FilterField(zap.String("key", "default/gone")).FilterField(zap.Bool("tombstone", true)).Len()
	}
	waitFor(t, s, "the relist and its tombstone", func() bool {
		_, missed := s.Pod("default", "missed")
		_, gone := s.Pod("default", "gone")
		return missed && !gone && tombstones() > 0
	})
	if lists.Load() < 2 {
		t.Errorf("lists = %d; want a relist", lists.Load())
	}
	if n := tombstones(); n != 1 {
		t.Errorf("delete handler saw %d tombstones for default/gone; want 1", n)
	}
}

func TestPatchPod(t *testing.T) {
	ctx := t.Context()
	client := fake.NewClientset(testPod("a"), testNode(nil))

	var bodies []string
	var mu sync.Mutex
	conflicts := 1
	client.PrependReactor("patch", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		bodies = append(bodies, string(a.(k8stesting.PatchAction).GetPatch()))
		if conflicts > 0 {
			conflicts--
			return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "pods"}, "a", errors.New("changed"))
		}
		return false, nil, nil
	})
	s := start(t, client)
	calls := 0
	err := s.PatchPod(ctx, "default", "a", "uid-a", func(p *corev1.Pod) (map[string]string, error) {
		calls++
		return map[string]string{"k": "v" + string(rune('0'+calls))}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if calls != 2 {
		t.Errorf("compute called %d times; want 2 (one conflict)", calls)
	}
	got, err := client.CoreV1().Pods("default").Get(ctx, "a", metav1.GetOptions{})
	if err != nil || got.Annotations["k"] != "v2" {
		t.Errorf("pod annotations after patch = %v, %v", got.Annotations, err)
	}
	mu.Lock()
	for _, b := range bodies {
		if !strings.Contains(b, `"resourceVersion"`) {
			t.Errorf("patch %s carries no resourceVersion precondition", b)
		}
	}
	mu.Unlock()

	if err := s.PatchPod(ctx, "default", "a", "other-uid", func(*corev1.Pod) (map[string]string, error) {
		t.Error("compute called for a replaced pod")
		return nil, nil
	}); !errors.Is(err, podsource.ErrPodReplaced) {
		t.Errorf("patch with a stale UID = %v; want ErrPodReplaced", err)
	}
	if err := s.PatchPod(ctx, "default", "gone", "uid-gone", func(*corev1.Pod) (map[string]string, error) {
		return map[string]string{"k": "v"}, nil
	}); !errors.Is(err, podsource.ErrPodReplaced) {
		t.Errorf("patch of a missing pod = %v; want ErrPodReplaced", err)
	}
	boom := errors.New("boom")
	if err := s.PatchPod(ctx, "default", "a", "uid-a", func(*corev1.Pod) (map[string]string, error) {
		return nil, boom
	}); !errors.Is(err, boom) {
		t.Errorf("compute error = %v; want it wrapped", err)
	}
}

func TestStartGivesUpWithContext(t *testing.T) {
	client := fake.NewClientset()
	client.PrependReactor("list", "*", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("apiserver down")
	})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	s := podsource.New(client, nodeName, zaptest.NewLogger(t))
	if err := s.Start(ctx); err == nil {
		t.Fatal("Start succeeded with the API server down")
	}
	s.Shutdown()
}
