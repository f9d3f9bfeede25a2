package explain

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/extender/cache"
	"github.com/gpushare/gpushare/extender/preempt"
	"github.com/gpushare/gpushare/extender/server"
	"github.com/gpushare/gpushare/inspector/internal/fixture"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

// pending is a pod of one gpu-mem container not yet bound.
func pending(name string, units int64) *corev1.Pod {
	p := fixture.Pod("default", name, "", fixture.Container("main", units))
	p.Status.Phase = corev1.PodPending
	return &p
}

// published describes GPUs of the given sizes, all healthy.
func published(sizes ...uint64) gpushare.NodeGPUs {
	desc := gpushare.NodeGPUs{Unit: gpushare.GiB}
	for i, s := range sizes {
		desc.GPUs = append(desc.GPUs, gpushare.GPUInfo{Index: i, UUID: "GPU-" + string(rune('0'+i)), Model: "sim", Units: s, Healthy: true})
	}
	return desc
}

// twoGPUs is node a with two 8 GiB GPUs holding 5 and 6 GiB, allocated.
func twoGPUs() State {
	return State{
		Nodes: []corev1.Node{fixture.Node("a", "10.0.0.1", 16, 2)},
		Pods: []corev1.Pod{
			fixture.SimplePod("default", "c", "a", 5, 0, 8, true),
			fixture.SimplePod("default", "d", "a", 6, 1, 8, true),
		},
	}
}

func why(t *testing.T, st State, pod *corev1.Pod) *Why {
	t.Helper()
	w, err := ExplainWhy(st, pod, allocator.BestFit)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func verdict(t *testing.T, w *Why, node string) NodeVerdict {
	t.Helper()
	for _, v := range w.Nodes {
		if v.Name == node {
			return v
		}
	}
	t.Fatalf("no verdict for node %s in %+v", node, w.Nodes)
	return NodeVerdict{}
}

func TestFragmentation(t *testing.T) {
	w := why(t, twoGPUs(), pending("b", 4))
	v := verdict(t, w, "a")
	if v.Kind != KindFragmented || v.Reason != allocator.ReasonInsufficient {
		t.Fatalf("verdict %+v, want fragmented with the seed's reason", v)
	}
	if want := "fragmentation: 5 GiB free on the node, largest free GPU 3 GiB"; v.Detail != want {
		t.Errorf("detail %q, want %q", v.Detail, want)
	}
	if w.Fitting != 0 || !strings.Contains(w.Summary, "fits on none of 1 nodes: 1 fragmented") {
		t.Errorf("summary %q", w.Summary)
	}
	wantHelp := []string{"freeing 1 GiB on GPU 0 of a (3 GiB of 8 GiB free) makes room for it", "a pod of 3 GiB fits on 1 node now"}
	if !slices.Equal(w.Help, wantHelp) {
		t.Errorf("help %q, want %q", w.Help, wantHelp)
	}
}

func TestInsufficientAndTooBig(t *testing.T) {
	st := twoGPUs()
	if v := verdict(t, why(t, st, pending("b", 6)), "a"); v.Kind != KindInsufficient || !strings.Contains(v.Detail, "5 GiB free on the node's usable GPUs, the pod needs 6 GiB") {
		t.Errorf("6 GiB: %+v, want insufficient", v)
	}
	v := verdict(t, why(t, st, pending("b", 9)), "a")
	if v.Kind != KindTooBig || !strings.Contains(v.Reason, "more than the largest healthy GPU of node a has (8)") {
		t.Errorf("9 GiB: %+v, want too-big with the extender's reason", v)
	}
}

func TestWaitingNamesTheInFlightPod(t *testing.T) {
	// x is bound with a 4-unit container in a 6-unit pod, not yet allocated:
	// a 4-unit pod must wait (the plugin could not tell the two apart).
	x := fixture.Pod("ml", "x", "a", fixture.Container("main", 4), fixture.Container("side", 2))
	x = fixture.Assign(x, gpushare.PodAssignment{GPUIndex: 0, PodUnits: 6, DevUnits: 8, AssumeTime: 1})
	st := State{Nodes: []corev1.Node{fixture.Node("a", "", 16, 2)}, Pods: []corev1.Pod{x}}
	w := why(t, st, pending("b", 4))
	v := verdict(t, w, "a")
	if v.Kind != KindWaiting || !slices.Equal(v.WaitingFor, []string{"ml/x"}) || !strings.HasPrefix(v.Reason, "waiting for pod ml/x") {
		t.Fatalf("verdict %+v, want waiting for ml/x", v)
	}
	if len(w.Help) == 0 || !strings.Contains(w.Help[0], "allocating ml/x") {
		t.Errorf("help %q, want the in-flight pod first", w.Help)
	}
}

func TestNodeKinds(t *testing.T) {
	sick := published(8, 8)
	sick.GPUs[0].Healthy, sick.GPUs[0].Reason = false, "XID 79"
	sick.GPUs[1].Healthy, sick.GPUs[1].Reason = false, "XID 48"
	mig, err := gpushare.EncodeSkippedGPUs([]gpushare.SkippedGPU{{Index: 0, UUID: "GPU-0", Model: "A100", Reason: "MIG mode is enabled"}})
	if err != nil {
		t.Fatal(err)
	}
	tainted := fixture.Node("tainted", "", 16, 2)
	tainted.Spec.Taints = []corev1.Taint{{Key: "gpu", Value: "reserved", Effect: corev1.TaintEffectNoSchedule}}
	st := State{Nodes: []corev1.Node{
		fixture.Node("cpu", "", 0, 0),
		fixture.WithAnnotation(fixture.Node("mig", "", 0, 0), gpushare.AnnotationSkippedGPUs, mig),
		fixture.WithGPUs(fixture.Node("sick", "", 16, 2), sick),
		tainted,
	}}
	w := why(t, st, pending("b", 4))
	for node, want := range map[string]struct{ kind, text string }{
		"cpu":     {KindNotGPUShare, "The node cpu is not for GPU share, need skip"},
		"mig":     {KindNotGPUShare, "MIG mode is enabled"},
		"sick":    {KindUnhealthy, "GPU 0 XID 79, GPU 1 XID 48"},
		"tainted": {KindScheduler, "node(s) had untolerated taint {gpu: reserved}"},
	} {
		v := verdict(t, w, node)
		all := v.Reason + " " + v.Detail + " " + strings.Join(v.Scheduler, " ")
		if v.Kind != want.kind || !strings.Contains(all, want.text) || v.Fits {
			t.Errorf("%s: %+v, want %s naming %q", node, v, want.kind, want.text)
		}
	}
}

func TestIsolationNotOffered(t *testing.T) {
	pod := pending("b", 4)
	pod.Annotations = map[string]string{gpushare.AnnotationIsolation: "mps"}
	st := State{Nodes: []corev1.Node{fixture.WithGPUs(fixture.Node("a", "", 16, 2), published(8, 8))}}
	w := why(t, st, pod)
	v := verdict(t, w, "a")
	if v.Kind != KindIsolation || !strings.HasPrefix(v.Reason, `no GPU offers isolation "mps"`) || w.Pod.Isolation != "mps" {
		t.Errorf("%+v, want isolation", v)
	}
}

func TestSelectorMismatch(t *testing.T) {
	pod := pending("b", 4)
	pod.Spec.NodeSelector = map[string]string{"pool": "infer"}
	v := verdict(t, why(t, State{Nodes: []corev1.Node{fixture.Node("a", "", 16, 2)}}, pod), "a")
	if v.Kind != KindScheduler || v.Fits || !slices.Equal(v.Scheduler, []string{"node(s) didn't match Pod's node affinity/selector"}) {
		t.Errorf("%+v, want the scheduler's selector reason", v)
	}
}

func TestBoundPod(t *testing.T) {
	st := twoGPUs()
	d := st.Pods[1]
	w := why(t, st, &d)
	if w.Status != "bound" || w.Bound == nil || w.Bound.Node != "a" || !slices.Equal(w.Bound.GPUs, []int{1}) || !w.Bound.Assigned {
		t.Fatalf("bound %+v", w.Bound)
	}
	// Without d, GPU 1 is empty and GPU 0 has 3 free: a 6 GiB pod goes back to GPU 1.
	if w.Bound.Replay == nil || w.Bound.Replay.Node != "a" || !slices.Equal(w.Bound.Replay.GPUs, []int{1}) ||
		!strings.Contains(w.Bound.Why, "chooses the same") {
		t.Errorf("replay %+v: %s", w.Bound.Replay, w.Bound.Why)
	}
}

func TestBadPods(t *testing.T) {
	st := twoGPUs()
	plain := fixture.Pod("default", "web", "", corev1.Container{Name: "main"})
	if _, err := ExplainWhy(st, &plain, allocator.BestFit); err == nil || !strings.Contains(err.Error(), "asks for no aliyun.com/gpu-mem") {
		t.Errorf("pod without gpu-mem: %v", err)
	}
	bad := pending("b", 4)
	bad.Annotations = map[string]string{gpushare.AnnotationIsolation: "fast"}
	if _, err := ExplainWhy(st, bad, allocator.BestFit); err == nil || !strings.Contains(err.Error(), "cannot be placed on any node") {
		t.Errorf("invalid isolation: %v", err)
	}
	if _, err := ExplainFit(st, pending("b", 1), allocator.BestFit, 0); err == nil {
		t.Error("--replicas 0 accepted")
	}
}

func TestFitReplicas(t *testing.T) {
	st := State{Nodes: []corev1.Node{fixture.Node("a", "", 16, 2), fixture.Node("b", "", 8, 1)}}
	f, err := ExplainFit(st, pending("w", 3), allocator.BestFit, 7)
	if err != nil {
		t.Fatal(err)
	}
	// Two copies per 8 GiB GPU, three GPUs: six copies, the seventh fits nowhere.
	if f.Placed != 6 || f.Stopped == nil || f.Stopped.Copy != 7 {
		t.Fatalf("placed %d, stopped %+v", f.Placed, f.Stopped)
	}
	if !strings.Contains(f.Summary, "6 of 7 copies fit; copy 7 fits nowhere") {
		t.Errorf("summary %q", f.Summary)
	}
	// a has 2 GiB free on each of two GPUs (4 in all), b 2 on its one.
	for i, want := range []string{KindFragmented, KindInsufficient} {
		if v := f.Stopped.Nodes[i]; v.Kind != want {
			t.Errorf("copy 7 on %s: %+v, want %s", v.Name, v, want)
		}
	}
	one, err := ExplainFit(st, pending("w", 3), allocator.BestFit, 1)
	if err != nil || one.Placed != 1 || !strings.Contains(one.Summary, "would land on") {
		t.Fatalf("one copy: %+v, %v", one, err)
	}
}

// snapshots is the extender's Cache over fixed snapshots, for server.Filter.
type snapshots map[string]*allocator.Node

func (s snapshots) HasSynced() bool { return true }
func (s snapshots) Nodes(names []string) []*allocator.Node {
	out := make([]*allocator.Node, len(names))
	for i, n := range names {
		out[i] = s[n]
	}
	return out
}
func (s snapshots) All() []*allocator.Node                                   { return nil }
func (s snapshots) Inspect(string) (cache.Inspect, bool)                     { return cache.Inspect{}, false }
func (s snapshots) Holders(string) (*allocator.Node, []preempt.Holder, bool) { return nil, nil, false }
func (s snapshots) Pod(string, string) (*cache.PodRecord, bool)              { return nil, false }

// TestReasonsAreTheFilters: every reason why prints is the text the
// extender's filter verb answers for the same node and pod.
func TestReasonsAreTheFilters(t *testing.T) {
	x := fixture.Pod("ml", "x", "a", fixture.Container("main", 4), fixture.Container("side", 2))
	x = fixture.Assign(x, gpushare.PodAssignment{GPUIndex: 0, PodUnits: 6, DevUnits: 8, AssumeTime: 1})
	st := twoGPUs()
	st.Nodes = append(st.Nodes, fixture.Node("cpu", "", 0, 0), fixture.Node("w", "", 16, 2))
	x.Spec.NodeName = "w"
	st.Pods = append(st.Pods, x)
	for _, units := range []int64{4, 9} {
		pod := pending("b", units)
		w := why(t, st, pod)
		views, _ := buildViews(st, pod)
		snap := snapshots{}
		var names []string
		for _, v := range views {
			snap[v.node.Name], names = v.alloc, append(names, v.node.Name)
		}
		res := server.Filter(snap, allocator.BestFit, &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &names}, names)
		for _, v := range w.Nodes {
			want := res.FailedNodes[v.Name] + res.FailedAndUnresolvableNodes[v.Name]
			if v.Reason != want {
				t.Errorf("%d GiB on %s: reason %q, the filter's %q", units, v.Name, v.Reason, want)
			}
		}
	}
}
