//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/test/cluster"
)

// Half-failures (issue 12): an API call that took effect while its caller saw it fail, and a
// watch that stays open but delivers nothing. The extender binary reaches the API server through
// a cluster.FaultProxy that injects them, as its ServiceAccount with the shipped RBAC.
//
// Every test uses one node of two 8-unit GPUs and three pods: c (5 units) fills one GPU, a (6)
// takes the other, and b (4) then fits neither (3 and 2 units free) although the node has room
// for it by its total (16 - 11 = 5), so kube-scheduler's own resource check lets it through and
// only the extender's per-GPU accounting keeps it off. Were a's charge forgotten, b would go on
// a's GPU: 10 units on 8.
const (
	hfNode = "hf-gpu"
	// hfStallMax bounds how long the extender's pod watch is held; each test releases it as soon
	// as b has been judged.
	hfStallMax = 40 * time.Second
)

var hfSizes = map[string][]uint64{hfNode: {8, 8}}

// halfBed is the bed of one half-failure test.
type halfBed struct {
	t      *testing.T
	c      *cluster.Cluster
	proxy  *cluster.FaultProxy
	extURL string
}

// startHalfBed starts the control plane, the node, the extender binary (with extra arguments)
// behind a fault proxy, and kube-scheduler calling the extender.
func startHalfBed(t *testing.T, extArgs ...string) *halfBed {
	t.Helper()
	ctx := t.Context()
	own, err := cluster.OwnBinaries(t.TempDir(), false)
	if err != nil {
		t.Fatal(err)
	}
	c := cluster.StartT(t, cluster.Config{NoScheduler: true})
	applyExtenderRBAC(t, c)
	proxy, err := c.StartFaultProxy("hf-extender", saExtender)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { t.Logf("%v", proxy); proxy.Close() })
	if err := c.CreateNodes(ctx, []cluster.NodeSpec{{Name: hfNode, Resources: map[corev1.ResourceName]int64{
		gpushare.ResourceName: 16, gpushare.ResourceCount: 2,
	}}}); err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + freeLoopbackPort(t)
	args := append([]string{"-listen=" + addr, "-kubeconfig=" + proxy.Kubeconfig()}, extArgs...)
	if _, err := c.StartProgram("gpushare-scheduler-extender", filepath.Join(own, "gpushare-scheduler-extender"), args); err != nil {
		t.Fatal(err)
	}
	b := &halfBed{t: t, c: c, proxy: proxy, extURL: "http://" + addr}
	if err := cluster.Poll(ctx, waitLong, "extender /readyz", func(context.Context) (bool, error) {
		return httpGetOK(probeClient, b.extURL+"/readyz")
	}); err != nil {
		t.Fatal(err)
	}
	if err := c.StartScheduler(ctx, cluster.SchedulerConfig{Extenders: []cluster.Extender{ourExtender(b.extURL)}}); err != nil {
		t.Fatal(err)
	}
	return b
}

func (b *halfBed) create(name string, units int64) {
	b.t.Helper()
	if _, err := b.c.Client().CoreV1().Pods("default").Create(b.t.Context(), gpuPod(name, units, nil), metav1.CreateOptions{}); err != nil {
		b.t.Fatal(err)
	}
}

func (b *halfBed) get(name string) *corev1.Pod {
	b.t.Helper()
	p, err := b.c.Client().CoreV1().Pods("default").Get(b.t.Context(), name, metav1.GetOptions{})
	if err != nil {
		b.t.Fatal(err)
	}
	return p
}

func (b *halfBed) waitBound(name string) {
	b.t.Helper()
	if _, err := b.c.WaitForPod(b.t.Context(), "default", name, waitLong, "bound", cluster.PodBound); err != nil {
		b.t.Fatal(err)
	}
}

// settled checks the annotations charge no GPU beyond its size and waits until the extender's
// /inspect equals them.
func (b *halfBed) settled() {
	b.t.Helper()
	var diff string
	pollUntil(b.t, waitLong, "the extender's /inspect to equal the annotations", func() bool {
		want := charges(b.t, defaultPods(b.t.Context(), b.t, b.c.Client()), hfSizes)
		diff = inspectDiff(b.extURL, want, hfSizes, 1)
		return diff == ""
	})
}

// fill binds c and waits until the extender charges it from its informer, so every later
// difference comes from the faults.
func (b *halfBed) fill() {
	b.t.Helper()
	b.create("c", 5)
	b.waitBound("c")
	b.settled()
}

// stallPodWatch holds the extender's pod watch from now: the informer learns nothing about pods
// (a's creation, its bind, b) until the stall is released.
func (b *halfBed) stallPodWatch() *cluster.Stall {
	s := b.proxy.StallWatches(cluster.MatchWatch("pods"), hfStallMax, false)
	b.t.Cleanup(s.Release)
	return s
}

// judgeB creates b while the extender's pod watch is held and checks that b is refused while a
// exists (a charge forgotten would place it on a's GPU), then that b binds once a is deleted.
func (b *halfBed) judgeB(stall *cluster.Stall) {
	t := b.t
	b.create("b", 4)
	var pod *corev1.Pod
	pollUntil(t, waitLong, "b bound or judged unschedulable", func() bool {
		pod = b.get("b")
		return pod.Spec.NodeName != "" || unschedulable(pod) != ""
	})
	select {
	case <-stall.Done():
		t.Fatalf("the pod watch stall ended before b was judged: the extender's informer may have caught up, the test proves nothing")
	default:
	}
	if stall.Held() == 0 {
		t.Fatal("the extender's pod watch delivered nothing during the stall: nothing was held back")
	}
	if pod.Spec.NodeName != "" {
		a := b.get("a")
		t.Errorf("b (4 units) was bound to %s, GPU %s, while a (6 of 8 units) holds GPU %s: the extender lost a's charge",
			pod.Spec.NodeName, pod.Annotations[gpushare.AnnotationGPUIndex], a.Annotations[gpushare.AnnotationGPUIndex])
		charges(t, defaultPods(t.Context(), t, b.c.Client()), hfSizes) // names the over-committed GPU
		t.FailNow()
	}
	t.Logf("b waits while the extender's pod watch is held: %s", unschedulable(pod))

	stall.Release()
	b.settled()
	if p := b.get("b"); p.Spec.NodeName != "" {
		t.Fatalf("b bound to %s after the watch resumed, while a exists", p.Spec.NodeName)
	}
	zero := int64(0)
	if err := b.c.Client().CoreV1().Pods("default").Delete(t.Context(), "a", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	b.settled() // the extender has seen a go
	b.nudge("b")
	b.waitBound("b")
	b.settled()
}

// nudge updates a pending pod's labels so kube-scheduler tries it again. The scheduler retries a
// pod the extender refused on any cluster event, a's deletion included, but it learns of the
// deletion from its own watch and may retry before the extender's informer has seen it; refused
// again, the pod would then wait for the next event or the scheduler's 5-minute flush.
func (b *halfBed) nudge(name string) {
	b.t.Helper()
	patch := []byte(`{"metadata":{"labels":{"gpushare-e2e/nudge":"` + strconv.FormatInt(time.Now().UnixNano(), 10) + `"}}}`)
	if _, err := b.c.Client().CoreV1().Pods("default").Patch(b.t.Context(), name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		b.t.Fatal(err)
	}
}

// TestLostBindAnswerDropped: the API server commits a's Binding but the extender never gets the
// answer (its connection is reset). a stays bound, its GPU stays charged, and b is kept off it.
func TestLostBindAnswerDropped(t *testing.T) {
	t.Parallel()
	runLostBindAnswer(t, cluster.Fault{Kind: cluster.DropAnswer})
}

// TestLostBindAnswer503: as TestLostBindAnswerDropped, but the extender gets a 503 for the
// Binding the API server committed.
func TestLostBindAnswer503(t *testing.T) {
	t.Parallel()
	runLostBindAnswer(t, cluster.Fault{Kind: cluster.ErrorAnswer, Code: 503})
}

// runLostBindAnswer holds the extender's pod watch from before a is created, so its informer
// cannot restore a's charge on its own: only what the extender does about the failed Binding
// decides whether b over-commits a's GPU. Without the stall the informer's event usually comes
// within milliseconds, and a forgotten charge would go unnoticed by luck of timing.
func runLostBindAnswer(t *testing.T, fault cluster.Fault) {
	start := time.Now()
	b := startHalfBed(t)
	b.fill()
	b.proxy.SetRules(cluster.Rule{Match: cluster.MatchBinding("default", "a"), Fault: fault, Times: 1})
	stall := b.stallPodWatch()
	b.create("a", 6)
	b.waitBound("a")
	pollUntil(t, 10*time.Second, fmt.Sprintf("the proxy to have injected %s", fault.Kind), func() bool {
		return b.proxy.Count(fault.Kind) == 1
	})
	b.judgeB(stall)
	t.Logf("%s of a's Binding: a bound, b held back, then bound when a was deleted (%v)", fault.Kind, time.Since(start).Round(time.Millisecond))
}

// TestStalledWatchPastAssumeTTL: the extender's pod watch delivers nothing for longer than its
// assume TTL (2s here) right after a's Binding succeeded, so the informer cannot confirm the bind
// in time. a's charge must survive the TTL (the extender can ask the API server), and b, arriving
// after the TTL, must be kept off a's GPU.
func TestStalledWatchPastAssumeTTL(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second
	start := time.Now()
	b := startHalfBed(t, "-assume-ttl="+ttl.String())
	b.fill()
	stall := b.stallPodWatch()
	b.create("a", 6)
	b.waitBound("a")
	// b must arrive after a's assumption has run out: the TTL, plus the extender's expiry tick
	// (TTL/4), plus a second of slack. This wait is the scenario's timing, not a synchronisation.
	select {
	case <-t.Context().Done():
		return
	case <-time.After(ttl + ttl/4 + time.Second):
	}
	b.judgeB(stall)
	t.Logf("a's charge outlived a %v assume TTL with the pod watch held; b held back, then bound when a was deleted (%v)", ttl, time.Since(start).Round(time.Millisecond))
}

// TestLateBindingCommit: the API server answers a's Binding 504 at once and commits it 20 s later
// (it went on with the request after answering, or etcd committed a write its client gave up on).
// The extender reads a back unbound in between; b, created then, must not be placed on a's GPU:
// the late commit would put 10 units on 8. Every Binding of a is treated so, so a retried bind
// cannot place a elsewhere first.
func TestLateBindingCommit(t *testing.T) {
	t.Parallel()
	const late = 20 * time.Second
	start := time.Now()
	b := startHalfBed(t)
	b.fill()
	b.proxy.SetRules(cluster.Rule{Match: cluster.MatchBinding("default", "a"), Fault: cluster.Fault{Kind: cluster.LateCommit, Delay: late}})
	b.create("a", 6)
	addr := strings.TrimPrefix(b.extURL, "http://")
	pollUntil(t, waitLong, "the extender to have read a back after its 504", func() bool {
		return seriesValue(t, addr, `gpushare_extender_binds_ambiguous_total{resolution="pending"}`)+
			seriesValue(t, addr, `gpushare_extender_binds_ambiguous_total{resolution="released"}`) >= 1
	})
	b.create("b", 4)
	var judged bool
	pollUntil(t, waitLong, "a's late Binding to be committed", func() bool {
		if b.proxy.Count(cluster.LateCommitted) > 0 {
			return true
		}
		if unschedulable(b.get("b")) != "" {
			judged = true
		}
		return false
	})
	if pod := b.get("b"); pod.Spec.NodeName != "" {
		a := b.get("a")
		t.Errorf("b (4 units) was bound to GPU %s while a's Binding (6 of 8 units, GPU %s) was in flight: the extender dropped a's charge on an unclear answer",
			pod.Annotations[gpushare.AnnotationGPUIndex], a.Annotations[gpushare.AnnotationGPUIndex])
		charges(t, defaultPods(t.Context(), t, b.c.Client()), hfSizes) // names the over-committed GPU
		t.FailNow()
	}
	if !judged {
		t.Fatal("b was never judged unschedulable before a's Binding was committed: the test proves nothing")
	}
	b.waitBound("a")
	b.settled()
	if p := b.get("b"); p.Spec.NodeName != "" {
		t.Fatalf("b bound to %s beside a", p.Spec.NodeName)
	}
	zero := int64(0)
	if err := b.c.Client().CoreV1().Pods("default").Delete(t.Context(), "a", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	b.settled()
	b.nudge("b")
	b.waitBound("b")
	b.settled()
	t.Logf("a's Binding answered 504 and committed %v later; b held back meanwhile, then bound when a was deleted (%v; %v)", late, time.Since(start).Round(time.Millisecond), b.proxy)
}
