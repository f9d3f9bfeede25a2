//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/extender/app"
	"github.com/gpushare/gpushare/extender/cache"
	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/test/cluster"
)

// extInstance is one in-process extender serving on a fixed loopback address.
type extInstance struct {
	cancel context.CancelFunc
	done   chan error
}

// startExtender serves the real extender on addr and waits until /readyz answers 200.
func startExtender(t testing.TB, addr string, client kubernetes.Interface) *extInstance {
	t.Helper()
	var ln net.Listener
	var err error
	// The previous instance's socket may linger for a moment after it closed.
	deadline := time.Now().Add(10 * time.Second)
	for ln, err = net.Listen("tcp", addr); err != nil; ln, err = net.Listen("tcp", addr) {
		if time.Now().After(deadline) {
			t.Fatalf("listen %s: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond) // retry pacing for a busy port, not synchronisation
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &extInstance{cancel: cancel, done: make(chan error, 1)}
	go func() {
		e.done <- app.Run(ctx, ln, app.Config{
			Client: client, Logger: zaptest.NewLogger(t).Named("extender"), Policy: allocator.BestFit,
			// A crash, not a graceful stop: in-flight requests are cut off.
			ShutdownGrace: time.Nanosecond, Version: "e2e",
		})
	}()
	pollUntil(t, 30*time.Second, "extender ready", func() bool {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return e
}

func (e *extInstance) stop(t testing.TB) {
	t.Helper()
	e.cancel()
	select {
	case err := <-e.done:
		if err != nil {
			t.Errorf("extender: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("extender did not stop within 20s of its context ending")
	}
}

// ourExtender is kube-scheduler's entry for our extender at base (scheme://host:port): every verb,
// node-cache capable, for the pods that ask for gpu-mem.
func ourExtender(base string) cluster.Extender {
	return cluster.Extender{
		URLPrefix: base + gpushare.ExtenderURLPrefix, FilterVerb: "filter", PrioritizeVerb: "prioritize",
		Weight: 1, BindVerb: "bind", PreemptVerb: "preempt", NodeCacheCapable: true, HTTPTimeout: 30 * time.Second,
		ManagedResources: []cluster.ManagedResource{{Name: string(gpushare.ResourceName)}},
	}
}

// createBurstPods creates burstPod(0) to burstPod(n-1), 16 requests at a time.
func createBurstPods(ctx context.Context, t *testing.T, client kubernetes.Interface, n int) {
	t.Helper()
	var wg sync.WaitGroup
	work := make(chan int)
	for range 16 {
		wg.Go(func() {
			for i := range work {
				if _, err := client.CoreV1().Pods("default").Create(ctx, burstPod(i), metav1.CreateOptions{}); err != nil {
					t.Errorf("create pod %d: %v", i, err)
				}
			}
		})
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
}

// defaultPods lists the pods of namespace default.
func defaultPods(ctx context.Context, t *testing.T, client kubernetes.Interface) []corev1.Pod {
	t.Helper()
	l, err := client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}

// boundCount counts the pods of items bound to a node.
func boundCount(items []corev1.Pod) int {
	n := 0
	for _, p := range items {
		if p.Spec.NodeName != "" {
			n++
		}
	}
	return n
}

func pollUntil(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		<-tick.C
	}
}

// burstNodes are 50 Node objects: 24 with 8×80, 25 with 4×24, one mixed (80, 24, 40, 16).
// startBurstBed starts a cluster without a scheduler, with the burst's nodes, and returns it, a
// client with the extender's API limits (QPS 500, burst 1000) and the nodes' specs and GPU sizes.
func startBurstBed(t *testing.T) (*cluster.Cluster, kubernetes.Interface, []cluster.NodeSpec, map[string][]uint64) {
	t.Helper()
	c := cluster.StartT(t, cluster.Config{NoScheduler: true})
	cfg := c.RESTConfig()
	cfg.QPS, cfg.Burst = 500, 1000
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	specs, sizes := burstNodes(t)
	if err := c.CreateNodes(t.Context(), specs); err != nil {
		t.Fatal(err)
	}
	return c, client, specs, sizes
}

func burstNodes(t *testing.T) ([]cluster.NodeSpec, map[string][]uint64) {
	t.Helper()
	var specs []cluster.NodeSpec
	sizes := map[string][]uint64{}
	add := func(name string, gpus []uint64, annotations map[string]string) {
		var total uint64
		for _, g := range gpus {
			total += g
		}
		specs = append(specs, cluster.NodeSpec{Name: name, Annotations: annotations, Resources: map[corev1.ResourceName]int64{
			gpushare.ResourceName: int64(total), gpushare.ResourceCount: int64(len(gpus)),
		}})
		sizes[name] = gpus
	}
	for i := range 24 {
		add(fmt.Sprintf("big-%02d", i), []uint64{80, 80, 80, 80, 80, 80, 80, 80}, nil)
	}
	for i := range 25 {
		add(fmt.Sprintf("small-%02d", i), []uint64{24, 24, 24, 24}, nil)
	}
	mixed := gpushare.NodeGPUs{Unit: gpushare.GiB, GPUs: []gpushare.GPUInfo{
		{Index: 0, Units: 80, Healthy: true}, {Index: 1, Units: 24, Healthy: true},
		{Index: 2, Units: 40, Healthy: true}, {Index: 3, Units: 16, Healthy: true},
	}}
	desc, err := gpushare.EncodeNodeGPUs(mixed)
	if err != nil {
		t.Fatal(err)
	}
	add("mixed", []uint64{80, 24, 40, 16}, map[string]string{gpushare.AnnotationNodeGPUs: desc})
	return specs, sizes
}

func units(n int64) corev1.ResourceRequirements {
	return corev1.ResourceRequirements{Limits: corev1.ResourceList{gpushare.ResourceName: *resource.NewQuantity(n, resource.DecimalSI)}}
}

// burstPod is pod i of the mix: single containers of 1..80 units, two-container
// pods, pods with a GPU init container, and one pod in 50 too big for any GPU.
func burstPod(i int) *corev1.Pod {
	cycle := []int64{1, 2, 4, 8, 12, 16, 20, 24, 40, 80}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("burst-%03d", i), Namespace: "default"}}
	c := func(name string, n int64) corev1.Container {
		return corev1.Container{Name: name, Image: "registry.k8s.io/pause:3.10", Resources: units(n)}
	}
	switch {
	case i%50 == 49:
		p.Spec.Containers = []corev1.Container{c("main", 100)}
	case i%25 == 3:
		p.Spec.Containers = []corev1.Container{c("a", 16), c("b", 16)}
	case i%30 == 7:
		p.Spec.InitContainers = []corev1.Container{c("init", 20)}
		p.Spec.Containers = []corev1.Container{c("main", 4)}
	default:
		p.Spec.Containers = []corev1.Container{c("main", cycle[i%len(cycle)])}
	}
	return p
}

// fakeAssigner plays the device plugin's part that matters to the extender:
// once a pod is bound it marks it ASSIGNED=true, which releases the hold-back.
func fakeAssigner(ctx context.Context, t *testing.T, client kubernetes.Interface) {
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace("default"))
	work := make(chan *corev1.Pod, 1024)
	enqueue := func(obj any) {
		p, ok := obj.(*corev1.Pod)
		if ok && p.Spec.NodeName != "" && p.Annotations[gpushare.AnnotationAssigned] == "false" {
			select {
			case work <- p:
			case <-ctx.Done():
			}
		}
	}
	if _, err := factory.Core().V1().Pods().Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, o any) { enqueue(o) },
	}); err != nil {
		t.Fatal(err)
	}
	factory.Start(ctx.Done())
	patch := []byte(`{"metadata":{"annotations":{"` + gpushare.AnnotationAssigned + `":"true"}}}`)
	for range 4 {
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case p := <-work:
					_, err := client.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.MergePatchType, patch, metav1.PatchOptions{})
					if err != nil && ctx.Err() == nil {
						t.Logf("assign %s: %v", p.Name, err)
					}
				}
			}
		}()
	}
}

// unschedulable returns the scheduler's message for a pod it judged
// unschedulable; empty when it did not (yet), or failed on an error it retries.
func unschedulable(p *corev1.Pod) string {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return c.Message
		}
	}
	return ""
}

func TestExtenderBurst(t *testing.T) {
	t.Parallel()
	runBurst(t, false)
}

func TestExtenderBurstRestart(t *testing.T) {
	t.Parallel()
	runBurst(t, true)
}

// runBurst creates 500 pods at once on 50 nodes through the real kube-scheduler
// and the in-process extender (restarted mid-burst when restart is set), then
// checks that every pod is bound or pending with a reason, that no GPU is
// over-committed by the annotations, and that /inspect agrees with them.
func runBurst(t *testing.T, restart bool) {
	const pods = 500
	ctx := t.Context()
	addr := "127.0.0.1:" + freeLoopbackPort(t)
	c, client, specs, sizes := startBurstBed(t)
	ext := startExtender(t, addr, client)
	defer func() { ext.stop(t) }()
	if err := c.StartScheduler(ctx, cluster.SchedulerConfig{
		ClientQPS: 500, ClientBurst: 1000, Extenders: []cluster.Extender{ourExtender("http://" + addr)},
	}); err != nil {
		t.Fatal(err)
	}
	fakeAssigner(ctx, t, client)

	start := time.Now()
	createBurstPods(ctx, t, client, pods)

	list := func() []corev1.Pod { return defaultPods(ctx, t, client) }
	bound := boundCount
	if restart {
		pollUntil(t, 3*time.Minute, "a third of the pods bound", func() bool { return bound(list()) >= pods/3 })
		ext.stop(t)
		t.Logf("extender stopped with %d pods bound", bound(list()))
		ext = startExtender(t, addr, client)
	}
	items := settleBurst(t, list)
	n := bound(items)
	t.Logf("%d of %d pods bound in %v", n, pods, time.Since(start).Round(time.Millisecond))

	want := charges(t, items, sizes)
	for _, p := range items {
		if p.Spec.NodeName != "" {
			continue
		}
		msg := unschedulable(&p)
		if mustIndex(t, p.Name)%50 == 49 {
			if !strings.Contains(msg, "more than the largest healthy GPU") {
				t.Errorf("too-big pod %s pending with %q", p.Name, msg)
			}
			continue
		}
		t.Logf("pending %s: %s", p.Name, msg)
	}
	if tooBig := pods / 50; n < pods-tooBig-pods/20 {
		t.Errorf("only %d of %d schedulable pods bound", n, pods-tooBig)
	}
	// /inspect converges on exactly the annotations' totals.
	var diff string
	pollUntil(t, time.Minute, "inspect agrees with annotations", func() bool {
		want = charges(t, list(), sizes)
		diff = inspectDiff("http://"+addr, want, sizes, len(specs))
		return diff == ""
	})
	if t.Failed() {
		t.Log("last inspect difference:", diff)
	}
}

// charges recomputes per-GPU usage from the bound pods' annotations and
// fails the test on any over-committed or unknown GPU.
func charges(t *testing.T, items []corev1.Pod, sizes map[string][]uint64) map[string]map[int]uint64 {
	t.Helper()
	want := map[string]map[int]uint64{} // node → GPU → units
	for _, p := range items {
		if p.Spec.NodeName == "" {
			continue
		}
		r, err := allocator.NewRequest(&p)
		if err != nil {
			t.Fatal(err)
		}
		a, ok, err := gpushare.DecodePodAssignment(p.Annotations)
		if err != nil || !ok {
			t.Fatalf("bound pod %s has no readable assignment: %v", p.Name, err)
		}
		pl, err := allocator.PlacementFromAssignment(a, r)
		if err != nil {
			t.Fatalf("pod %s: %v", p.Name, err)
		}
		if a.PodUnits != r.Units {
			t.Errorf("pod %s: POD annotation %d, request %d", p.Name, a.PodUnits, r.Units)
		}
		if want[p.Spec.NodeName] == nil {
			want[p.Spec.NodeName] = map[int]uint64{}
		}
		for g, u := range allocator.Charges(r, pl) {
			want[p.Spec.NodeName][g] += u
		}
	}
	for node, gpus := range want {
		for g, u := range gpus {
			if g < 0 || g >= len(sizes[node]) {
				t.Fatalf("node %s: pods charge missing GPU %d", node, g)
			}
			if u > sizes[node][g] {
				t.Fatalf("node %s GPU %d over-committed: %d > %d", node, g, u, sizes[node][g])
			}
		}
	}
	return want
}

func mustIndex(t *testing.T, name string) int {
	var i int
	if _, err := fmt.Sscanf(name, "burst-%d", &i); err != nil {
		t.Fatal(errors.Join(errors.New("pod name "+name), err))
	}
	return i
}

// inspectDiff compares a replica's /inspect with the per-GPU charges of the annotations; "" when equal.
func inspectDiff(base string, want map[string]map[int]uint64, sizes map[string][]uint64, nodes int) string {
	resp, err := probeClient.Get(base + gpushare.ExtenderURLPrefix + "/inspect")
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	var in cache.Inspect
	if err := json.NewDecoder(resp.Body).Decode(&in); err != nil {
		return err.Error()
	}
	if len(in.Nodes) != nodes {
		return fmt.Sprintf("%d nodes in inspect, want %d", len(in.Nodes), nodes)
	}
	for _, node := range in.Nodes {
		for _, d := range node.Devs {
			if d.UsedGPU != want[node.Name][d.ID] || d.TotalGPU != sizes[node.Name][d.ID] {
				return fmt.Sprintf("node %s GPU %d: inspect %d/%d, annotations %d/%d", node.Name, d.ID, d.UsedGPU, d.TotalGPU, want[node.Name][d.ID], sizes[node.Name][d.ID])
			}
		}
	}
	return ""
}

// settleBurst polls until the burst has settled: every bound pod served by the (fake) plugin,
// every other pod judged unschedulable (not a transient extender error), and the bound count
// unchanged for two seconds. It returns the pods as last listed.
func settleBurst(t *testing.T, list func() []corev1.Pod) []corev1.Pod {
	t.Helper()
	var items []corev1.Pod
	lastBound, since := -1, time.Now()
	pollUntil(t, 5*time.Minute, "every pod bound or unschedulable with a reason", func() bool {
		items = list()
		for _, p := range items {
			if p.Spec.NodeName != "" && p.Annotations[gpushare.AnnotationAssigned] != "true" {
				return false
			}
			if p.Spec.NodeName == "" && unschedulable(&p) == "" {
				return false
			}
		}
		if n := boundCount(items); n != lastBound {
			lastBound, since = n, time.Now()
		}
		return time.Since(since) > 2*time.Second
	})
	return items
}
