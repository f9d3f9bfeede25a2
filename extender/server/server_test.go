package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/extender/binder"
	"github.com/gpushare/gpushare/extender/cache"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

func gpuNode(name string, total, count int64) *corev1.Node {
	res := corev1.ResourceList{
		gpushare.ResourceName:  *resource.NewQuantity(total, resource.DecimalSI),
		gpushare.ResourceCount: *resource.NewQuantity(count, resource.DecimalSI),
	}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Capacity: res, Allocatable: res}}
}

func gpuPod(name string, units ...int64) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)}}
	for i, u := range units {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{
			Name:      fmt.Sprintf("c%d", i),
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{gpushare.ResourceName: *resource.NewQuantity(u, resource.DecimalSI)}},
		})
	}
	return p
}

type env struct {
	t      *testing.T
	client *fake.Clientset
	cache  *cache.Cache
	srv    *httptest.Server
	reg    *prometheus.Registry
	binds  atomic.Int32 // Binding creates, the bind's only write
}

// bindReactor makes the fake clientset honour pods/binding as the API server
// does: the UID must match and the pod must not be bound yet.
func bindReactor(client *fake.Clientset) k8stesting.ReactionFunc {
	return func(action k8stesting.Action) (bool, runtime.Object, error) {
		ca, ok := action.(k8stesting.CreateAction)
		if !ok || action.GetSubresource() != "binding" {
			return false, nil, nil
		}
		b := ca.GetObject().(*corev1.Binding)
		gvr := schema.GroupVersionResource{Version: "v1", Resource: "pods"}
		obj, err := client.Tracker().Get(gvr, b.Namespace, b.Name)
		if err != nil {
			return true, nil, err
		}
		pod := obj.(*corev1.Pod).DeepCopy()
		if b.UID != "" && b.UID != pod.UID {
			return true, nil, apierrors.NewConflict(gvr.GroupResource(), b.Name, errors.New("uid mismatch"))
		}
		if pod.Spec.NodeName != "" {
			return true, nil, apierrors.NewConflict(gvr.GroupResource(), b.Name, errors.New("already assigned"))
		}
		pod.Spec.NodeName = b.Target.Name
		// As the API server does: the Binding's annotations are merged into the pod.
		if len(b.Annotations) > 0 && pod.Annotations == nil {
			pod.Annotations = map[string]string{}
		}
		for k, v := range b.Annotations {
			pod.Annotations[k] = v
		}
		return true, nil, client.Tracker().Update(gvr, pod, b.Namespace)
	}
}

func newEnv(t *testing.T, objs ...runtime.Object) *env {
	t.Helper()
	return newEnvWatch(t, false, objs...)
}

// newEnvWatch is newEnv; with frozenPods the pod informer lists once and then sees no event: the
// informer lag of a busy cluster, made permanent.
func newEnvWatch(t *testing.T, frozenPods bool, objs ...runtime.Object) *env {
	t.Helper()
	e := &env{t: t, client: fake.NewClientset(objs...)}
	e.client.PrependReactor("create", "pods", bindReactor(e.client))
	if frozenPods {
		e.client.PrependWatchReactor("pods", func(k8stesting.Action) (bool, watch.Interface, error) {
			return true, watch.NewFake(), nil
		})
	}
	e.client.PrependReactor("*", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		switch {
		case a.GetVerb() == "create" && a.GetSubresource() == "binding":
			e.binds.Add(1)
		case a.GetVerb() == "patch" || a.GetVerb() == "update":
			e.t.Errorf("bind wrote the pod with %s; the Binding alone must carry the annotations", a.GetVerb())
		}
		return false, nil, nil
	})
	c, err := cache.New(cache.Config{Client: e.client, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	e.cache = c
	runCache(t, c, 10*time.Second)
	b := binder.New(binder.Config{Client: e.client, Cache: c, Logger: zaptest.NewLogger(t)})
	e.reg = prometheus.NewRegistry()
	s, err := New(Config{Cache: c, Binder: b, Logger: zaptest.NewLogger(t), Registry: e.reg, Version: "v-test", MaxBodyBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	e.srv = httptest.NewServer(s.Handler())
	t.Cleanup(e.srv.Close)
	return e
}

func (e *env) do(method, path string, body any) (int, []byte) {
	e.t.Helper()
	var r io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		r = bytes.NewReader(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			e.t.Fatal(err)
		}
		r = bytes.NewReader(data)
	}
	req, err := http.NewRequest(method, e.srv.URL+path, r)
	if err != nil {
		e.t.Fatal(err)
	}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp.StatusCode, out
}

func (e *env) filter(pod *corev1.Pod, names ...string) extenderv1.ExtenderFilterResult {
	e.t.Helper()
	code, body := e.do("POST", "/gpushare-scheduler/filter", extenderv1.ExtenderArgs{Pod: pod, NodeNames: &names})
	if code != http.StatusOK {
		e.t.Fatalf("filter: %d %s", code, body)
	}
	var res extenderv1.ExtenderFilterResult
	if err := json.Unmarshal(body, &res); err != nil {
		e.t.Fatal(err)
	}
	return res
}

func (e *env) bind(pod *corev1.Pod, node string) (int, string) {
	e.t.Helper()
	code, body := e.do("POST", "/gpushare-scheduler/bind", extenderv1.ExtenderBindingArgs{
		PodName: pod.Name, PodNamespace: pod.Namespace, PodUID: pod.UID, Node: node,
	})
	var res extenderv1.ExtenderBindingResult
	if err := json.Unmarshal(body, &res); err != nil {
		e.t.Fatalf("bind answer %q: %v", body, err)
	}
	return code, res.Error
}

func TestFilterNames(t *testing.T) {
	full := gpuNode("full", 32, 2)
	e := newEnv(t, gpuNode("n1", 32, 2), full, gpuNode("small", 8, 2), gpuNode("cpu", 0, 0))
	// Fill "full" through the real bind path.
	for _, name := range []string{"a", "b"} {
		p := gpuPod(name, 12+int64(len(name)))
		if name == "b" {
			p = gpuPod(name, 11)
		}
		if _, err := e.client.CoreV1().Pods("default").Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if code, msg := e.bind(p, "full"); code != http.StatusOK {
			t.Fatalf("bind %s: %d %s", name, code, msg)
		}
	}
	res := e.filter(gpuPod("p", 8), "n1", "full", "small", "cpu", "ghost")
	if res.NodeNames == nil || strings.Join(*res.NodeNames, ",") != "n1" || res.Nodes != nil {
		t.Fatalf("passing = %v nodes=%v", res.NodeNames, res.Nodes)
	}
	want := map[string]string{
		"full":  allocator.ReasonInsufficient,
		"ghost": "node ghost is not in the gpushare extender's cache",
	}
	for n, reason := range want {
		if res.FailedNodes[n] != reason {
			t.Errorf("FailedNodes[%s] = %q, want %q", n, res.FailedNodes[n], reason)
		}
	}
	if got := res.FailedAndUnresolvableNodes["cpu"]; got != "The node cpu is not for GPU share, need skip" {
		t.Errorf("cpu reason = %q", got)
	}
	if got := res.FailedAndUnresolvableNodes["small"]; !strings.Contains(got, "more than the largest healthy GPU of node small has (4)") {
		t.Errorf("small reason = %q", got)
	}
}

func TestFilterFullNodes(t *testing.T) {
	e := newEnv(t, gpuNode("n1", 32, 2), gpuNode("n2", 4, 1))
	args := extenderv1.ExtenderArgs{Pod: gpuPod("p", 8), Nodes: &corev1.NodeList{Items: []corev1.Node{*gpuNode("n1", 32, 2), *gpuNode("n2", 4, 1)}}}
	code, body := e.do("POST", "/gpushare-scheduler/filter", args)
	var res extenderv1.ExtenderFilterResult
	if err := json.Unmarshal(body, &res); code != http.StatusOK || err != nil {
		t.Fatalf("filter: %d %s %v", code, body, err)
	}
	if res.NodeNames != nil || res.Nodes == nil || len(res.Nodes.Items) != 1 || res.Nodes.Items[0].Name != "n1" {
		t.Fatalf("result = %+v", res)
	}
	if _, ok := res.FailedAndUnresolvableNodes["n2"]; !ok {
		t.Fatalf("n2 not failed: %+v", res)
	}
}

func TestBadRequests(t *testing.T) {
	e := newEnv(t, gpuNode("n1", 32, 2))
	huge := append([]byte(`{"Pod":{"metadata":{"name":"`), bytes.Repeat([]byte("x"), 2<<20)...)
	huge = append(huge, []byte(`"}}`)...)
	negative := gpuPod("neg", 1)
	negative.Spec.Containers[0].Resources.Limits[gpushare.ResourceName] = resource.MustParse("-3")
	tests := []struct {
		name   string
		method string
		path   string
		body   any
		code   int
		substr string
	}{
		{"malformed filter", "POST", "/gpushare-scheduler/filter", []byte(`{"Pod":`), 400, "malformed request body"},
		{"oversized filter", "POST", "/gpushare-scheduler/filter", huge, 413, "larger than"},
		{"filter without pod", "POST", "/gpushare-scheduler/filter", []byte(`{"NodeNames":["n1"]}`), 400, "no Pod"},
		{"filter without nodes", "POST", "/gpushare-scheduler/filter", extenderv1.ExtenderArgs{Pod: gpuPod("p", 1)}, 400, "neither NodeNames nor Nodes"},
		{"malformed prioritize", "POST", "/gpushare-scheduler/prioritize", []byte(`[]`), 400, "malformed"},
		{"malformed bind", "POST", "/gpushare-scheduler/bind", []byte(`{{`), 400, "malformed"},
		{"oversized bind", "POST", "/gpushare-scheduler/bind", huge, 413, "larger than"},
		{"incomplete bind", "POST", "/gpushare-scheduler/bind", extenderv1.ExtenderBindingArgs{PodName: "p"}, 400, "needs PodName"},
		{"unknown inspect node", "GET", "/gpushare-scheduler/inspect/ghost", nil, 404, "ghost"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := e.do(tt.method, tt.path, tt.body)
			if code != tt.code || !strings.Contains(string(body), tt.substr) {
				t.Fatalf("%d %s, want %d containing %q", code, body, tt.code, tt.substr)
			}
			var v map[string]any
			if err := json.Unmarshal(body, &v); err != nil {
				t.Fatalf("error body is not JSON: %s", body)
			}
		})
	}
	// A pod with an invalid request fails every node with the reason, unresolvably.
	names := []string{"n1"}
	code, body := e.do("POST", "/gpushare-scheduler/filter", extenderv1.ExtenderArgs{Pod: negative, NodeNames: &names})
	if code != 200 || !strings.Contains(string(body), "is negative") {
		t.Fatalf("negative request: %d %s", code, body)
	}
}

func TestPrioritize(t *testing.T) {
	e := newEnv(t, gpuNode("empty", 16, 1), gpuNode("busy", 16, 1))
	p := gpuPod("x", 8)
	if _, err := e.client.CoreV1().Pods("default").Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if code, msg := e.bind(p, "busy"); code != 200 {
		t.Fatal(msg)
	}
	names := []string{"empty", "busy", "ghost"}
	code, body := e.do("POST", "/gpushare-scheduler/prioritize", extenderv1.ExtenderArgs{Pod: gpuPod("q", 4), NodeNames: &names})
	var res extenderv1.HostPriorityList
	if err := json.Unmarshal(body, &res); code != 200 || err != nil {
		t.Fatalf("%d %s", code, body)
	}
	if len(res) != 3 || res[1].Score <= res[0].Score || res[2].Score != 0 {
		t.Fatalf("scores = %+v: want busy > empty, ghost 0", res)
	}
}

func TestBindWritesAnnotationsAndInspect(t *testing.T) {
	e := newEnv(t, gpuNode("n1", 32, 2))
	ctx := context.Background()
	p := gpuPod("p", 4)
	if _, err := e.client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if code, msg := e.bind(p, "n1"); code != 200 || msg != "" {
		t.Fatalf("bind: %d %s", code, msg)
	}
	got, err := e.client.CoreV1().Pods("default").Get(ctx, "p", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	a, ok, err := gpushare.DecodePodAssignment(got.Annotations)
	if err != nil || !ok || got.Spec.NodeName != "n1" || a.GPUIndex != 0 || a.PodUnits != 4 || a.DevUnits != 16 || a.Assigned || a.AssumeTime == 0 {
		t.Fatalf("pod after bind: node %q assignment %+v %v %v", got.Spec.NodeName, a, ok, err)
	}
	if _, has := got.Annotations[gpushare.AnnotationAllocation]; has {
		t.Fatal("single-GPU pod got an allocation annotation")
	}
	if n := e.binds.Load(); n != 1 {
		t.Fatalf("%d Binding writes, want 1", n)
	}
	// A retried bind of the same pod to the same node succeeds without new writes.
	if code, msg := e.bind(p, "n1"); code != 200 {
		t.Fatalf("idempotent rebind: %d %s", code, msg)
	}
	code, body := e.do("GET", "/gpushare-scheduler/inspect", nil)
	want := `{"nodes":[{"name":"n1","totalGPU":32,"usedGPU":4,"devs":[{"id":0,"totalGPU":16,"usedGPU":4,"pods":[{"name":"p","namespace":"default","usedGPU":4}]},{"id":1,"totalGPU":16,"usedGPU":0,"pods":[]}]}]}` + "\n"
	if code != 200 || string(body) != want {
		t.Fatalf("inspect = %d\n%s\nwant\n%s", code, body, want)
	}
	code, body = e.do("GET", "/gpushare-scheduler/inspect/n1", nil)
	if code != 200 || string(body) != want {
		t.Fatalf("inspect/n1 = %d %s", code, body)
	}
	code, body = e.do("GET", "/metrics", nil)
	for _, line := range []string{
		`gpushare_extender_gpu_allocated_units{gpu="0",node="n1"} 4`,
		`gpushare_extender_gpu_total_units{gpu="1",node="n1"} 16`,
		`gpushare_extender_binds_total{outcome="bound"} 2`,
		`gpushare_extender_request_duration_seconds_count{verb="bind"} 2`,
	} {
		if code != 200 || !strings.Contains(string(body), line) {
			t.Errorf("metrics lack %q", line)
		}
	}
	code, body = e.do("GET", "/version", nil)
	if code != 200 || !strings.Contains(string(body), "v-test") {
		t.Fatalf("version: %d %s", code, body)
	}
}

func TestBindSplitPod(t *testing.T) {
	e := newEnv(t, gpuNode("n1", 32, 2))
	ctx := context.Background()
	p := gpuPod("big", 10, 10)
	if _, err := e.client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if code, msg := e.bind(p, "n1"); code != 200 {
		t.Fatalf("bind: %s", msg)
	}
	got, err := e.client.CoreV1().Pods("default").Get(ctx, "big", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Annotations[gpushare.AnnotationAllocation] != `{"0":{"0":10},"1":{"1":10}}` {
		t.Fatalf("allocation = %q", got.Annotations[gpushare.AnnotationAllocation])
	}
	if _, has := got.Annotations[gpushare.AnnotationGPUIndex]; has {
		t.Fatal("split pod without init containers got an IDX")
	}
}

func TestBindFailures(t *testing.T) {
	e := newEnv(t, gpuNode("n1", 16, 1))
	ctx := context.Background()
	p := gpuPod("p", 4)
	if _, err := e.client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Wrong UID: refused, nothing written.
	stale := p.DeepCopy()
	stale.UID = "old"
	if code, msg := e.bind(stale, "n1"); code != 500 || !strings.Contains(msg, "UID") {
		t.Fatalf("stale UID: %d %s", code, msg)
	}
	// Unknown node: refused, 400.
	if code, msg := e.bind(p, "ghost"); code != 400 || !strings.Contains(msg, "not in the extender's cache") {
		t.Fatalf("unknown node: %d %s", code, msg)
	}
	// The API server refuses the Binding: the assumption must be forgotten
	// (an unclear answer keeps it: extender/binder's tests).
	var bindErr atomic.Bool
	bindErr.Store(true)
	e.client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() == "binding" && bindErr.Load() {
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "pods/binding"}, "p", errors.New("a webhook says no"))
		}
		return false, nil, nil
	})
	if code, msg := e.bind(p, "n1"); code != 500 || !strings.Contains(msg, "a webhook says no") {
		t.Fatalf("bind error: %d %s", code, msg)
	}
	if n, _ := e.cache.Node("n1"); n.GPUs[0].Used != 0 {
		t.Fatalf("failed bind still charged: %d", n.GPUs[0].Used)
	}
	bindErr.Store(false)
	if code, msg := e.bind(p, "n1"); code != 200 {
		t.Fatalf("bind after recovery: %s", msg)
	}
	code, body := e.do("GET", "/metrics", nil)
	if code != 200 || !strings.Contains(string(body), `gpushare_extender_binds_total{outcome="error"} 3`) {
		t.Fatalf("metrics: %s", body)
	}
}

// TestConcurrentBindsNeverOvercommit binds many pods at once onto one node:
// the binds that succeed must fit together, whatever the interleaving.
func TestConcurrentBindsNeverOvercommit(t *testing.T) {
	e := newEnv(t, gpuNode("n1", 32, 2))
	ctx := context.Background()
	var pods []*corev1.Pod
	for i := range 12 {
		p := gpuPod(fmt.Sprintf("p%d", i), int64(3+i%3)) // 3, 4, 5 units
		if _, err := e.client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pods = append(pods, p)
	}
	var wg sync.WaitGroup
	for _, p := range pods {
		wg.Go(func() { e.bind(p, "n1") })
	}
	wg.Wait()
	list, err := e.client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	used := map[int]uint64{}
	bound := 0
	for _, p := range list.Items {
		if p.Spec.NodeName == "" {
			continue
		}
		bound++
		a, ok, err := gpushare.DecodePodAssignment(p.Annotations)
		if err != nil || !ok {
			t.Fatalf("bound pod %s without assignment: %v", p.Name, err)
		}
		used[a.GPUIndex] += a.PodUnits
	}
	for g, u := range used {
		if u > 16 {
			t.Fatalf("GPU %d over-committed: %d > 16", g, u)
		}
	}
	if bound == 0 {
		t.Fatal("nothing bound")
	}
}

// stubCache reports not-synced, for /readyz.
type stubCache struct{ Cache }

func (stubCache) HasSynced() bool { return false }

func TestNotReady(t *testing.T) {
	s, err := New(Config{Cache: stubCache{}, Binder: binder.New(binder.Config{}), Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/readyz", "/gpushare-scheduler/filter", "/gpushare-scheduler/bind"} {
		method := "POST"
		if path == "/readyz" {
			method = "GET"
		}
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, httptest.NewRequest(method, path, strings.NewReader("{}")))
		if rec.Code != http.StatusServiceUnavailable {
			t.Errorf("%s = %d, want 503", path, rec.Code)
		}
	}
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
	if rec.Code != 200 {
		t.Errorf("healthz = %d", rec.Code)
	}
}

// A pending pod may carry assignment annotations written by hand or copied from a running pod.
// The Binding can only add or replace annotations, so the bind replaces every key it would
// otherwise leave stale: the pod's annotations then read back exactly the placement chosen.
func TestBindOverwritesStaleAnnotations(t *testing.T) {
	stale := map[string]string{
		gpushare.AnnotationGPUIndex:     "7",
		gpushare.AnnotationAllocation:   `{"0":{"5":3}}`,
		gpushare.AnnotationAssigned:     "true",
		gpushare.AnnotationPodUnits:     "99",
		gpushare.AnnotationContainerEnv: `{"c0":{"gpu":5,"pod":3,"container":3,"dev":16}}`,
	}
	for _, tc := range []struct {
		name      string
		units     []int64
		wantAlloc string
		wantIdx   string
	}{
		{"single GPU", []int64{4}, `{"0":{"0":4}}`, "0"},
		{"split", []int64{10, 10}, `{"0":{"0":10},"1":{"1":10}}`, "0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, gpuNode("n1", 32, 2))
			ctx := context.Background()
			p := gpuPod("p", tc.units...)
			p.Annotations = maps.Clone(stale)
			if _, err := e.client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			if code, msg := e.bind(p, "n1"); code != 200 || msg != "" {
				t.Fatalf("bind: %d %s", code, msg)
			}
			got, err := e.client.CoreV1().Pods("default").Get(ctx, "p", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			an := got.Annotations
			if an[gpushare.AnnotationAllocation] != tc.wantAlloc || an[gpushare.AnnotationGPUIndex] != tc.wantIdx ||
				an[gpushare.AnnotationAssigned] != "false" || an[gpushare.AnnotationContainerEnv] != "{}" {
				t.Fatalf("annotations after bind: %v", an)
			}
			reqs, err := gpushare.ContainerRequests(got)
			if err != nil {
				t.Fatal(err)
			}
			a, ok, err := gpushare.DecodePodAssignment(an)
			if err != nil || !ok || a.PodUnits != gpushare.PodUnits(reqs) {
				t.Fatalf("assignment %+v %v %v", a, ok, err)
			}
			charges, err := a.Charges(reqs)
			if err != nil {
				t.Fatal(err)
			}
			var sum uint64
			for g, u := range charges {
				if g != 0 && g != 1 {
					t.Fatalf("charges name GPU %d the node lacks: %v", g, charges)
				}
				sum += u
			}
			if sum != gpushare.PodUnits(reqs) {
				t.Fatalf("charges %v, pod asks for %d", charges, gpushare.PodUnits(reqs))
			}
		})
	}
}

// gpu-mem: 0 asks for no GPU memory. The scheduler still routes the pod's bind to us: it is bound
// without a GPU assignment and charged nothing.
func TestBindZeroUnits(t *testing.T) {
	// The pod watch is frozen after the first list: the informer keeps the pod unbound, as when the
	// scheduler's retry comes before the informer shows the first bind.
	p := gpuPod("zero", 0)
	e := newEnvWatch(t, true, gpuNode("n1", 32, 2), p)
	ctx := context.Background()
	if res := e.filter(p, "n1"); res.NodeNames == nil || len(*res.NodeNames) != 1 {
		t.Fatalf("filter = %+v; want n1 to pass", res)
	}
	for range 2 { // the second is a retried bind of the same pod
		if code, msg := e.bind(p, "n1"); code != 200 || msg != "" {
			t.Fatalf("bind: %d %s", code, msg)
		}
	}
	got, err := e.client.CoreV1().Pods("default").Get(ctx, "zero", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Spec.NodeName != "n1" || len(got.Annotations) != 0 {
		t.Fatalf("pod after bind: node %q, annotations %v", got.Spec.NodeName, got.Annotations)
	}
	code, body := e.do("GET", "/gpushare-scheduler/inspect/n1", nil)
	if code != 200 || !strings.Contains(string(body), `"usedGPU":0`) || strings.Contains(string(body), "zero") {
		t.Fatalf("inspect = %d %s", code, body)
	}
}

// A quantity with a four-digit exponent makes apimachinery's ParseQuantity build a number of that
// many digits: the JSON decode of a 100-byte body would never finish. Such bodies are refused
// before decoding, at once; ordinary bodies with exponents, names included, still pass.
func TestHugeExponentRefusedBeforeDecoding(t *testing.T) {
	e := newEnv(t, gpuNode("n1", 32, 2))
	for _, q := range []string{`"5e-999999999"`, `"1E+0000999999999"`, `5e-999999999`, `"-.5e9999"`} {
		body := []byte(`{"Pod":{"metadata":{"name":"p"},"spec":{"containers":[{"name":"c","resources":{"requests":{"cpu":` + q + `}}}]}},"NodeNames":["n1"]}`)
		done := make(chan struct{})
		var code int
		var out []byte
		go func() { code, out = e.do("POST", "/gpushare-scheduler/filter", body); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("quantity %s: no answer within 10s", q)
		}
		if code != http.StatusBadRequest || !strings.Contains(string(out), "exponent") {
			t.Errorf("quantity %s: %d %s; want 400 naming the exponent", q, code, out)
		}
	}
	// Exponents real quantities use, and names that merely look numeric, are fine.
	body := []byte(`{"Pod":{"metadata":{"name":"p"},"spec":{"containers":[{"name":"c","resources":{"limits":{"cpu":"1e3","aliyun.com/gpu-mem":"4"}}}]}},"NodeNames":["n1","host1e-10000"]}`)
	if code, out := e.do("POST", "/gpushare-scheduler/filter", body); code != http.StatusOK {
		t.Errorf("ordinary body: %d %s", code, out)
	}
}

// The scheduler retries a bind that succeeded (its request timed out) before the pod informer has
// seen the Binding. The retry must succeed, being the same bind, and must not drop the pod's
// charge: otherwise another pod is placed on the GPU it holds (found by fuzzing).
func TestBindRetryBeforeInformerKeepsCharge(t *testing.T) {
	a, b := gpuPod("a", 12), gpuPod("b", 12)
	e := newEnvWatch(t, true, gpuNode("n1", 16, 1), gpuNode("n2", 16, 1), a, b)
	if code, msg := e.bind(a, "n1"); code != http.StatusOK {
		t.Fatalf("bind a: %d %s", code, msg)
	}
	code, msg := e.bind(a, "n1")
	if code != http.StatusOK || msg != "" {
		t.Errorf("retry of a bind that succeeded answered %d %q; want 200", code, msg)
	}
	if n, _ := e.cache.Node("n1"); n.GPUs[0].Used != 12 {
		t.Errorf("after the retry GPU 0 is charged %d units; want a's 12", n.GPUs[0].Used)
	}
	if code, msg := e.bind(a, "n2"); code == http.StatusOK || !strings.Contains(msg, "charged on node n1") {
		t.Errorf("a retry naming another node answered %d %q; want an error naming n1", code, msg)
	}
	// b (12 units) must not fit next to a (12) on the 16-unit GPU.
	if code, _ := e.bind(b, "n1"); code == http.StatusOK {
		t.Error("over-commit: b bound next to a on the 16-unit GPU")
	}
}

// runCache runs c until the test ends and waits up to timeout for it to sync.
func runCache(tb testing.TB, c *cache.Cache, timeout time.Duration) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	tb.Cleanup(func() { cancel(); <-done })
	sctx, scancel := context.WithTimeout(ctx, timeout)
	defer scancel()
	if !c.WaitForSync(sctx) {
		tb.Fatal("cache did not sync")
	}
}

// TestBindRefusesWhatIsNotOurs: a pod naming no gpu-mem, and a node not in the cache or without
// GPUs, are refused with a 400 and an ExtenderBindingResult error, before any API write; a
// gpu-mem: 0 pod is still bound to a GPU node (TestBindZeroUnits), and filter fails the nodes its
// bind would refuse.
func TestBindRefusesWhatIsNotOurs(t *testing.T) {
	plain := gpuPod("plain") // no container names gpu-mem
	plain.Spec.Containers = []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
		Limits: corev1.ResourceList{corev1.ResourceCPU: *resource.NewQuantity(1, resource.DecimalSI)}}}}
	p, zero := gpuPod("p", 4), gpuPod("zero", 0)
	e := newEnv(t, gpuNode("n1", 32, 2), gpuNode("cpu", 0, 0), plain, p, zero)
	for _, tc := range []struct {
		pod        *corev1.Pod
		node, want string
	}{
		{plain, "n1", "does not request aliyun.com/gpu-mem in any container"},
		{p, "ghost", "node ghost is not in the extender's cache"},
		{p, "cpu", "node cpu has no GPU in the extender's cache"},
		{zero, "ghost", "node ghost is not in the extender's cache"},
		{zero, "cpu", "node cpu has no GPU in the extender's cache"},
	} {
		code, body := e.do("POST", "/gpushare-scheduler/bind", extenderv1.ExtenderBindingArgs{
			PodName: tc.pod.Name, PodNamespace: "default", PodUID: tc.pod.UID, Node: tc.node})
		var res extenderv1.ExtenderBindingResult
		if err := json.Unmarshal(body, &res); err != nil || code != http.StatusBadRequest ||
			!strings.Contains(res.Error, tc.want) || !strings.Contains(res.Error, "default/"+tc.pod.Name) {
			t.Errorf("bind %s to %s: %d %s (%v); want 400 with an Error saying %q", tc.pod.Name, tc.node, code, body, err, tc.want)
		}
	}
	if n := e.binds.Load(); n != 0 {
		t.Fatalf("refused binds sent %d Bindings", n)
	}
	for _, name := range []string{"plain", "p", "zero"} {
		if got, err := e.client.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{}); err != nil || got.Spec.NodeName != "" {
			t.Fatalf("pod %s after refused binds: %v %v", name, got, err)
		}
	}
	res := e.filter(zero, "n1", "cpu", "ghost")
	if res.NodeNames == nil || !slices.Equal(*res.NodeNames, []string{"n1"}) ||
		res.FailedAndUnresolvableNodes["cpu"] == "" || res.FailedNodes["ghost"] == "" {
		t.Fatalf("filter of a gpu-mem: 0 pod = %+v; want n1 only, cpu unresolvable, ghost failed", res)
	}
	if code, msg := e.bind(zero, "n1"); code != 200 || msg != "" {
		t.Fatalf("gpu-mem: 0 pod to n1: %d %s", code, msg)
	}
	if code, msg := e.bind(p, "n1"); code != 200 || msg != "" {
		t.Fatalf("p to n1: %d %s", code, msg)
	}
}

// tieredNode is a node whose device plugin publishes each GPU's size and
// effective tier; reasons, when given, say why a GPU fell back.
func tieredNode(tb testing.TB, name string, units uint64, tiers []gpushare.Isolation, reasons ...string) *corev1.Node {
	tb.Helper()
	desc := gpushare.NodeGPUs{Unit: gpushare.GiB}
	for i, tier := range tiers {
		g := gpushare.GPUInfo{Index: i, UUID: fmt.Sprintf("GPU-%d", i), Units: units, Healthy: true, Isolation: tier}
		if i < len(reasons) {
			g.IsolationReason = reasons[i]
		}
		desc.GPUs = append(desc.GPUs, g)
	}
	raw, err := gpushare.EncodeNodeGPUs(desc)
	if err != nil {
		tb.Fatal(err)
	}
	n := gpuNode(name, int64(units)*int64(len(tiers)), int64(len(tiers)))
	n.Annotations = map[string]string{gpushare.AnnotationNodeGPUs: raw}
	return n
}

// isolated returns p with isolation annotations; empty values are left out.
func isolated(p *corev1.Pod, tier, percent string) *corev1.Pod {
	p.Annotations = map[string]string{}
	if tier != "" {
		p.Annotations[gpushare.AnnotationIsolation] = tier
	}
	if percent != "" {
		p.Annotations[gpushare.AnnotationComputePercent] = percent
	}
	return p
}

func TestFilterIsolation(t *testing.T) {
	mps, none := gpushare.IsolationMPS, gpushare.IsolationNone
	e := newEnv(t, tieredNode(t, "mps", 16, []gpushare.Isolation{mps, mps}),
		tieredNode(t, "fellback", 16, []gpushare.Isolation{none, none}, "MPS control daemon not answering"),
		gpuNode("old", 32, 2))
	nodes := []string{"mps", "fellback", "old"}
	tests := []struct {
		name         string
		pod          *corev1.Pod
		pass         string
		unresolvable map[string]string
	}{
		{name: "no annotations: every node", pod: gpuPod("p", 4), pass: "mps,fellback,old"},
		{name: "mps: only where a GPU offers it, each GPU's tier and fallback named", pod: isolated(gpuPod("p", 4), "mps", ""), pass: "mps",
			unresolvable: map[string]string{
				"fellback": `no GPU offers isolation "mps" (GPU 0: none, MPS control daemon not answering; GPU 1: none)`,
				"old":      `no GPU offers isolation "mps" (GPUs 0, 1: none)`,
			}},
		{name: "none: the nodes that do not enforce", pod: isolated(gpuPod("p", 4), "none", ""), pass: "fellback,old",
			unresolvable: map[string]string{"mps": `no GPU offers isolation "none" (GPUs 0, 1: mps)`}},
		{name: "a compute share: only where it can be enforced", pod: isolated(gpuPod("p", 4), "", "30"), pass: "mps",
			unresolvable: map[string]string{
				"old": "no GPU can enforce gpushare.io/compute-percent 30, which needs isolation mps or hami-core (GPUs 0, 1: none)",
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := e.filter(tt.pod, nodes...)
			if got := strings.Join(*res.NodeNames, ","); got != tt.pass {
				t.Fatalf("passing %q, want %q (failed %v, unresolvable %v)", got, tt.pass, res.FailedNodes, res.FailedAndUnresolvableNodes)
			}
			for n, want := range tt.unresolvable {
				if got := res.FailedAndUnresolvableNodes[n]; got != want {
					t.Errorf("node %s: reason %q, want %q", n, got, want)
				}
			}
			// Prioritize agrees: a node the pod cannot go to scores nothing.
			_, body := e.do("POST", "/gpushare-scheduler/prioritize", extenderv1.ExtenderArgs{Pod: tt.pod, NodeNames: &nodes})
			var scores extenderv1.HostPriorityList
			if err := json.Unmarshal(body, &scores); err != nil {
				t.Fatal(err)
			}
			for _, s := range scores {
				if !strings.Contains(tt.pass, s.Host) && s.Score != 0 {
					t.Errorf("node %s scores %d, though filter fails it", s.Host, s.Score)
				}
			}
		})
	}
}

// Invalid isolation annotations are reported like an invalid request: every
// node fails with the reason, unresolvably, and bind refuses the pod.
func TestInvalidIsolationAnnotations(t *testing.T) {
	e := newEnv(t, tieredNode(t, "mps", 16, []gpushare.Isolation{gpushare.IsolationMPS}))
	for _, tc := range []struct{ name, tier, percent, want string }{
		{"zero", "", "0", `invalid gpushare isolation: gpushare.io/compute-percent "0" is not a whole number from 1 to 100`},
		{"percent-sign", "", "30%", `invalid gpushare isolation: gpushare.io/compute-percent "30%" is not a whole number from 1 to 100`},
		{"unknown-tier", "exclusive", "", `invalid gpushare isolation: gpushare.io/isolation "exclusive" is not one of none, mps, hami-core, any`},
		{"share-on-none", "none", "50", `invalid gpushare isolation: gpushare.io/compute-percent "50" cannot be enforced with gpushare.io/isolation "none"`},
	} {
		p := isolated(gpuPod(tc.name, 4), tc.tier, tc.percent)
		res := e.filter(p, "mps")
		if got := res.FailedAndUnresolvableNodes["mps"]; !strings.HasPrefix(got, tc.want) {
			t.Errorf("%s=%q %s=%q: reason %q, want it to start %q", gpushare.AnnotationIsolation, tc.tier, gpushare.AnnotationComputePercent, tc.percent, got, tc.want)
		}
		if _, err := e.client.CoreV1().Pods("default").Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if code, msg := e.bind(p, "mps"); code != http.StatusInternalServerError || !strings.Contains(msg, tc.want) {
			t.Errorf("bind: %d %q; want 500 saying %q", code, msg, tc.want)
		}
	}
	if used := e.inspectUsed(t, "mps"); used != 0 {
		t.Fatalf("%d units charged after refused binds", used)
	}
}

// Rule 2 through the verbs: a pod of the same size as an in-flight pod but
// another compute share fails the filter, resolvably, naming that pod, and
// its bind is refused; it goes once the first pod is allocated.
func TestComputePercentHoldBackThroughVerbs(t *testing.T) {
	mps := gpushare.IsolationMPS
	e := newEnv(t, tieredNode(t, "n1", 16, []gpushare.Isolation{mps, mps}))
	ctx := context.Background()
	pods := e.client.CoreV1().Pods("default")
	p, q := isolated(gpuPod("p", 4), "", "30"), isolated(gpuPod("q", 4), "", "50")
	for _, pod := range []*corev1.Pod{p, q} {
		if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if code, msg := e.bind(p, "n1"); code != http.StatusOK {
		t.Fatalf("bind p: %d %s", code, msg)
	}
	res := e.filter(q, "n1")
	want := `waiting for pod default/p (a 4-unit container of a pod with isolation "any", compute-percent 30, not yet allocated by the device plugin)`
	if got := res.FailedNodes["n1"]; got != want {
		t.Fatalf("filter q: FailedNodes %q, unresolvable %v; want %q", got, res.FailedAndUnresolvableNodes, want)
	}
	if code, msg := e.bind(q, "n1"); code != http.StatusInternalServerError || !strings.Contains(msg, "waiting for pod default/p") {
		t.Fatalf("bind q: %d %q; want 500 naming default/p", code, msg)
	}
	// The device plugin allocates p: q's signature no longer conflicts.
	live, err := pods.Get(ctx, "p", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	live.Annotations[gpushare.AnnotationAssigned] = "true"
	// Written past the reactors, which fail the test on any write but a Binding.
	if err := e.client.Tracker().Update(schema.GroupVersionResource{Version: "v1", Resource: "pods"}, live, "default"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for res = e.filter(q, "n1"); len(*res.NodeNames) == 0; res = e.filter(q, "n1") {
		if time.Now().After(deadline) {
			t.Fatalf("q still held back after p was assigned: %v", res.FailedNodes)
		}
		<-tick.C
	}
	if code, msg := e.bind(q, "n1"); code != http.StatusOK {
		t.Fatalf("bind q after p was assigned: %d %s", code, msg)
	}
}

// inspectUsed reads a node's charged units through GET inspect.
func (e *env) inspectUsed(t *testing.T, node string) uint64 {
	t.Helper()
	code, body := e.do("GET", "/gpushare-scheduler/inspect/"+node, nil)
	var in cache.Inspect
	if err := json.Unmarshal(body, &in); code != http.StatusOK || err != nil || len(in.Nodes) != 1 {
		t.Fatalf("inspect %s: %d %s %v", node, code, body, err)
	}
	return in.Nodes[0].UsedGPU
}
