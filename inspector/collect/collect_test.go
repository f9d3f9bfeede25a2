package collect_test

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpushare/gpushare/inspector/collect"
	"github.com/gpushare/gpushare/inspector/internal/fixture"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

func TestPercentTruncatesExactly(t *testing.T) {
	// float64 arithmetic, as the old CLI used, gives 28.999999999999996 here.
	r := collect.Build([]corev1.Node{fixture.Node("n", "1.1.1.1", 100, 1)},
		[]corev1.Pod{fixture.SimplePod("d", "p", "n", 29, 0, 100, true)})
	if r.AllocatedPercent != 29 || r.Nodes[0].AllocatedPercent != 29 {
		t.Errorf("percent %d/%d, want 29", r.AllocatedPercent, r.Nodes[0].AllocatedPercent)
	}
	r = collect.Build([]corev1.Node{fixture.Node("n", "1.1.1.1", 3, 1)},
		[]corev1.Pod{fixture.SimplePod("d", "p", "n", 2, 0, 3, true)})
	if r.AllocatedPercent != 66 {
		t.Errorf("2/3 is %d%%, want 66", r.AllocatedPercent)
	}
}

func TestWhichNodesAndPodsCount(t *testing.T) {
	done := fixture.SimplePod("d", "done", "n", 4, 0, 15, true)
	done.Status.Phase = corev1.PodSucceeded
	failed := fixture.SimplePod("d", "failed", "n", 4, 0, 15, true)
	failed.Status.Phase = corev1.PodFailed
	noGPU := fixture.Pod("d", "cpu", "n", fixture.Container("c", 0))
	elsewhere := fixture.SimplePod("d", "elsewhere", "cpu-node", 4, 0, 15, true)
	unbound := fixture.SimplePod("d", "unbound", "", 4, -1, 0, false)
	r := collect.Build(
		[]corev1.Node{fixture.Node("n", "", 15, 1), fixture.Node("cpu-node", "1.2.3.4", 0, 0)},
		[]corev1.Pod{done, failed, noGPU, elsewhere, unbound, fixture.SimplePod("d", "live", "n", 4, 0, 15, true)})
	if len(r.Nodes) != 1 || r.Nodes[0].Name != "n" || r.Nodes[0].Address != "unknown" {
		t.Fatalf("nodes %+v", r.Nodes)
	}
	if n := r.Nodes[0]; len(n.Pods) != 1 || n.Pods[0].Name != "live" || n.Allocated != 4 {
		t.Errorf("pods %+v allocated %d, want only live, 4", n.Pods, n.Allocated)
	}
}

func TestKubernetesRequestRule(t *testing.T) {
	always := corev1.ContainerRestartPolicyAlways
	p := fixture.Pod("d", "p", "n", fixture.Container("a", 2), fixture.Container("b", 3))
	side := fixture.Container("side", 1)
	side.RestartPolicy = &always
	p.Spec.InitContainers = []corev1.Container{fixture.Container("big-init", 9), side}
	p = fixture.Assign(p, gpushare.PodAssignment{GPUIndex: 0, PodUnits: 9, DevUnits: 15, AssumeTime: 1})
	r := collect.Build([]corev1.Node{fixture.Node("n", "", 15, 1)}, []corev1.Pod{p})
	// max(big-init 9, a+b+side 6) = 9, as the scheduler and the extender count it; the old CLI said 5.
	if got := r.Nodes[0].Pods[0].Units; got != 9 || r.Nodes[0].GPUs[0].Allocated != 9 {
		t.Errorf("units %d, GPU0 %d; want 9", got, r.Nodes[0].GPUs[0].Allocated)
	}
}

func TestSplitChargesPerGPU(t *testing.T) {
	p := fixture.Pod("d", "p", "n", fixture.Container("a", 2), fixture.Container("b", 3))
	p.Spec.InitContainers = []corev1.Container{fixture.Container("i", 4)}
	p = fixture.Assign(p, gpushare.PodAssignment{GPUIndex: 1, PodUnits: 5, DevUnits: 15, AssumeTime: 1,
		Allocation: gpushare.Allocation{0: {0: 2}, 1: {1: 3}}})
	r := collect.Build([]corev1.Node{fixture.Node("n", "", 30, 2)}, []corev1.Pod{p})
	n := r.Nodes[0]
	// GPU1 holds b and the init container (on the index GPU): max(4, 3) = 4.
	if n.GPUs[0].Allocated != 2 || n.GPUs[1].Allocated != 4 || n.Allocated != 6 {
		t.Errorf("GPUs %+v allocated %d, want 2 and 4", n.GPUs, n.Allocated)
	}
}

func TestMalformedInputIsSkippedNotFatal(t *testing.T) {
	good := fixture.SimplePod("d", "good", "n", 1, 0, 15, true)
	badIdx := fixture.WithPodAnnotation(fixture.SimplePod("d", "bad-idx", "n", 2, 0, 15, true), gpushare.AnnotationGPUIndex, "-1")
	badAlloc := fixture.WithPodAnnotation(fixture.SimplePod("d", "bad-alloc", "n", 2, 0, 15, true), gpushare.AnnotationAllocation, `{"0":`)
	badEnv := fixture.WithPodAnnotation(fixture.SimplePod("d", "bad-env", "n", 3, 0, 15, true), gpushare.AnnotationContainerEnv, "[]")
	wrongAlloc := fixture.Assign(fixture.SimplePod("d", "wrong-alloc", "n", 2, -1, 0, false),
		gpushare.PodAssignment{GPUIndex: 0, PodUnits: 2, DevUnits: 15, AssumeTime: 1, Allocation: gpushare.Allocation{0: {0: 5}}})
	badQty := fixture.Pod("d", "bad-qty", "n", fixture.Container("c", 1))
	badQty.Spec.Containers[0].Resources.Limits[gpushare.ResourceName] = resource.MustParse("1500m")
	node := fixture.WithAnnotation(fixture.Node("n", "", 30, 2), gpushare.AnnotationNodeGPUs, `{"unit":"3GiB"}`)

	r := collect.Build([]corev1.Node{node}, []corev1.Pod{good, badIdx, badAlloc, badEnv, wrongAlloc, badQty})
	var skipped []string
	for _, s := range r.Skipped {
		skipped = append(skipped, s.Kind+" "+s.Name)
	}
	want := "Node n,Pod bad-alloc,Pod bad-env,Pod bad-idx,Pod bad-qty,Pod wrong-alloc"
	if strings.Join(skipped, ",") != want {
		t.Errorf("skipped %v, want %s", skipped, want)
	}
	n := r.Nodes[0]
	// bad-env keeps its charge: only its limits are unknown.
	if n.Allocated != 4 || len(n.Pods) != 2 || n.GPUSizes != collect.SizesDerived || n.GPUs[1].Total != 15 {
		t.Errorf("node %+v", n)
	}
}

// What a pod's isolation annotations ask is shown as set; an unreadable
// value is named and the pod still counts, and each GPU carries the tier and
// fallback reason its plugin published.
func TestIsolation(t *testing.T) {
	desc := gpushare.NodeGPUs{Unit: gpushare.GiB, GPUs: []gpushare.GPUInfo{
		{Index: 0, Units: 15, Healthy: true, Isolation: gpushare.IsolationMPS},
		{Index: 1, Units: 15, Healthy: true, Isolation: gpushare.IsolationNone, IsolationReason: "MPS control daemon not answering"},
	}}
	with := func(p corev1.Pod, kv ...string) corev1.Pod {
		for i := 0; i+1 < len(kv); i += 2 {
			p = fixture.WithPodAnnotation(p, kv[i], kv[i+1])
		}
		return p
	}
	pods := []corev1.Pod{
		with(fixture.SimplePod("d", "a-mps", "n", 1, 0, 15, true), gpushare.AnnotationIsolation, "mps", gpushare.AnnotationComputePercent, "25"),
		with(fixture.SimplePod("d", "b-share", "n", 1, 0, 15, true), gpushare.AnnotationComputePercent, "100"),
		with(fixture.SimplePod("d", "c-any", "n", 1, 1, 15, true), gpushare.AnnotationIsolation, "any"),
		fixture.SimplePod("d", "d-plain", "n", 1, 1, 15, true),
		with(fixture.SimplePod("d", "e-bad", "n", 2, 1, 15, true), gpushare.AnnotationIsolation, "mps", gpushare.AnnotationComputePercent, "0.5"),
	}
	r := collect.Build([]corev1.Node{fixture.WithGPUs(fixture.Node("n", "", 30, 2), desc)}, pods)
	n := r.Nodes[0]
	if g := n.GPUs; g[0].Isolation != "mps" || g[0].IsolationReason != "" || !g[0].Enforces() ||
		g[1].Isolation != "none" || g[1].IsolationReason != "MPS control daemon not answering" || g[1].Enforces() {
		t.Errorf("GPUs %+v; want mps, and none with the fallback reason", g)
	}
	type asks struct {
		tier    string
		percent int
	}
	want := []asks{{"mps", 25}, {"", 100}, {"any", 0}, {"", 0}, {"", 0}}
	for i, p := range n.Pods {
		if got := (asks{p.Isolation, p.ComputePercent}); got != want[i] {
			t.Errorf("pod %s asks %+v, want %+v", p.Name, got, want[i])
		}
	}
	if n.Allocated != 6 || len(r.Skipped) != 1 || r.Skipped[0].Name != "e-bad" ||
		!strings.Contains(r.Skipped[0].Reason, `gpushare.io/compute-percent "0.5" is not a whole number`) {
		t.Errorf("allocated %d, skipped %+v; want e-bad's 2 units counted and its share named", n.Allocated, r.Skipped)
	}
}

func TestUnknownGPUStillCounts(t *testing.T) {
	r := collect.Build([]corev1.Node{fixture.Node("n", "", 15, 1)}, []corev1.Pod{fixture.SimplePod("d", "p", "n", 3, 2, 15, true)})
	n := r.Nodes[0]
	if len(n.GPUs) != 2 || n.GPUs[1].Index != 2 || n.GPUs[1].Known || n.Allocated != 3 {
		t.Errorf("GPUs %+v allocated %d", n.GPUs, n.Allocated)
	}
}

func TestUnitLabel(t *testing.T) {
	desc := gpushare.NodeGPUs{Unit: 256, GPUs: []gpushare.GPUInfo{{Index: 0, Units: 320, Healthy: true}}}
	cases := []struct {
		name  string
		nodes []corev1.Node
		want  string
	}{
		{"empty", nil, "GiB"},
		{"GiB guess", []corev1.Node{fixture.Node("a", "", 100, 1)}, "GiB"},
		{"MiB guess", []corev1.Node{fixture.Node("a", "", 202, 2)}, "MiB"},
		{"no count: default", []corev1.Node{fixture.Node("a", "", 16000, 0)}, "GiB"},
		{"published", []corev1.Node{fixture.WithGPUs(fixture.Node("b", "", 320, 1), desc)}, "256MiB"},
		{"mixed units: MiB", []corev1.Node{fixture.Node("a", "", 16000, 1), fixture.WithGPUs(fixture.Node("b", "", 320, 1), desc)}, "MiB"},
	}
	for _, tc := range cases {
		if got := collect.Build(tc.nodes, nil).Unit; got != tc.want {
			t.Errorf("%s: unit %q, want %q", tc.name, got, tc.want)
		}
	}
}

// Nodes that count in different units are reported in MiB, every figure
// converted, so totals add up and no node's numbers wear another's unit.
func TestMixedUnitsInMiB(t *testing.T) {
	gib := fixture.WithGPUs(fixture.Node("g", "", 80, 1), gpushare.NodeGPUs{Unit: gpushare.GiB, GPUs: []gpushare.GPUInfo{{Index: 0, Units: 80, Healthy: true}}})
	quarter := fixture.WithGPUs(fixture.Node("q", "", 320, 1), gpushare.NodeGPUs{Unit: 256, GPUs: []gpushare.GPUInfo{{Index: 0, Units: 320, Healthy: true}}})
	pod := fixture.SimplePod("default", "p", "g", 8, 0, 80, true)
	r := collect.Build([]corev1.Node{gib, quarter}, []corev1.Pod{pod})
	if r.Unit != "MiB" || r.Total != 80*1024+320*256 || r.Allocated != 8*1024 {
		t.Fatalf("report unit %q total %d allocated %d; want MiB, %d, %d", r.Unit, r.Total, r.Allocated, 80*1024+320*256, 8*1024)
	}
	g := r.Nodes[0]
	if g.Total != 80*1024 || g.GPUs[0].Total != 80*1024 || g.GPUs[0].Allocated != 8*1024 || g.Pods[0].Units != 8*1024 ||
		g.Pods[0].GPUs[0].Units != 8*1024 || g.Pods[0].Containers[0].Units != 8*1024 || g.AllocatedPercent != 10 {
		t.Errorf("GiB node in MiB: %+v", g)
	}
	if q := r.Nodes[1]; q.Total != 320*256 || q.GPUs[0].Total != 320*256 {
		t.Errorf("256MiB node in MiB: %+v", q)
	}
}

// FuzzBuild feeds arbitrary annotation values: Build must never panic and
// must account every charged unit in the node total.
func FuzzBuild(f *testing.F) {
	f.Add("0", `{"0":{"1":2}}`, `{"main":{"gpu":0,"pod":2,"container":2,"dev":15}}`, `{"unit":"GiB","gpus":[{"index":0,"units":15,"healthy":true}]}`)
	f.Add("63", "{}", "{}", "null")
	f.Add("1", "{}", "{}", `{"unit":"GiB","gpus":[{"index":0,"units":15,"healthy":true,"isolation":"mps"},{"index":1,"units":15,"healthy":false,"isolation":"x","isolationReason":"daemon down"}]}`)
	f.Fuzz(func(t *testing.T, idx, alloc, env, gpus string) {
		p := fixture.Pod("d", "p", "n", fixture.Container("main", 2))
		p.Annotations = map[string]string{gpushare.AnnotationGPUIndex: idx, gpushare.AnnotationAllocation: alloc, gpushare.AnnotationContainerEnv: env}
		node := fixture.WithAnnotation(fixture.Node("n", "", 30, 2), gpushare.AnnotationNodeGPUs, gpus)
		r := collect.Build([]corev1.Node{node}, []corev1.Pod{p})
		var sum uint64
		for _, g := range r.Nodes[0].GPUs {
			sum += g.Allocated
		}
		if sum+r.Nodes[0].Pending != r.Nodes[0].Allocated {
			t.Errorf("GPU sum %d + pending %d != allocated %d", sum, r.Nodes[0].Pending, r.Nodes[0].Allocated)
		}
	})
}

// A multi-GPU pod (issue 15) is charged on each GPU of its set with its
// units / k there, so the GPUs add up to the pod; each container lists all
// its GPUs with its units per GPU.
func TestMultiGPUChargesEachGPU(t *testing.T) {
	four := fixture.Pod("d", "four", "n", fixture.Container("a", 12), fixture.Container("b", 4))
	four.Spec.InitContainers = []corev1.Container{fixture.Container("i", 8)}
	four = fixture.RecordSet(fixture.MultiGPU(four, gpushare.NewGPUSet(0, 1, 2, 3), 15, true), gpushare.NewGPUSet(0, 1, 2, 3), 15)
	pods := []corev1.Pod{
		fixture.MultiGPUPod("d", "two", "n", 8, gpushare.NewGPUSet(1, 3), 15, true),
		four,
		fixture.SimplePod("d", "one", "n", 5, 1, 15, true),
	}
	r := collect.Build([]corev1.Node{fixture.Node("n", "", 60, 4)}, pods)
	if len(r.Skipped) != 0 {
		t.Fatalf("skipped %v", r.Skipped)
	}
	n := r.Nodes[0]
	// four: max(init 8/4, (12+4)/4) = 4 on each; two: 4 on GPUs 1 and 3; one: 5 on GPU 1.
	want := []uint64{4, 13, 4, 8}
	var sum uint64
	for i, g := range n.GPUs {
		if g.Allocated != want[i] {
			t.Errorf("GPU%d allocated %d, want %d", i, g.Allocated, want[i])
		}
		sum += g.Allocated
	}
	if sum != 29 || n.Allocated != 29 {
		t.Errorf("GPU sum %d, node %d; want 29 (16 + 8 + 5)", sum, n.Allocated)
	}

	pod := func(name string) collect.Pod {
		for _, p := range n.Pods {
			if p.Name == name {
				return p
			}
		}
		t.Fatalf("no pod %s in %+v", name, n.Pods)
		return collect.Pod{}
	}
	two := pod("two")
	if fmt.Sprint(two.GPUs) != "[{1 4} {3 4}]" || fmt.Sprint(two.GPUSet) != "[1 3]" || two.Units != 8 {
		t.Errorf("two: GPUs %v set %v units %d; want 4 on 1 and 3", two.GPUs, two.GPUSet, two.Units)
	}
	c := two.Containers[0]
	if *c.GPU != 1 || fmt.Sprint(c.GPUs) != "[1 3]" || c.UnitsPerGPU != 4 || c.State != collect.StateAllocated {
		t.Errorf("two's container %+v", c)
	}
	for _, c := range pod("four").Containers {
		if fmt.Sprint(c.GPUs) != "[0 1 2 3]" || c.UnitsPerGPU != c.Units/4 || c.State != collect.StateAllocated {
			t.Errorf("four's container %+v", c)
		}
	}
	// Single-GPU pods keep their shape: no set, no per-GPU units.
	if one := pod("one"); one.GPUSet != nil || one.Containers[0].GPUs != nil || one.Containers[0].UnitsPerGPU != 0 || *one.Containers[0].GPU != 1 {
		t.Errorf("one: %+v", one)
	}
}

// A recorded environment matches a multi-GPU container only with the same
// set and the same units on each GPU.
func TestMultiGPURecordMismatch(t *testing.T) {
	set := gpushare.NewGPUSet(0, 1)
	base := fixture.MultiGPUPod("d", "p", "n", 8, set, 15, true)
	cases := []struct {
		name string
		env  gpushare.ContainerEnv
		want string
	}{
		{"same set and units", gpushare.ContainerEnv{GPUIndex: 0, GPUs: set, PodUnits: 8, ContainerUnits: 8, DevUnits: 15}, collect.StateAllocated},
		{"first GPU only", gpushare.ContainerEnv{GPUIndex: 0, PodUnits: 8, ContainerUnits: 8, DevUnits: 15}, collect.StateMismatch},
		{"other set", gpushare.ContainerEnv{GPUIndex: 0, GPUs: gpushare.NewGPUSet(0, 2), PodUnits: 8, ContainerUnits: 8, DevUnits: 15}, collect.StateMismatch},
		{"per-GPU units", gpushare.ContainerEnv{GPUIndex: 0, GPUs: set, PodUnits: 8, ContainerUnits: 4, DevUnits: 15}, collect.StateMismatch},
	}
	for _, tc := range cases {
		p := fixture.Record(base, gpushare.ContainerEnvs{"main": tc.env})
		r := collect.Build([]corev1.Node{fixture.Node("n", "", 30, 2)}, []corev1.Pod{p})
		n := r.Nodes[0]
		if got := n.Pods[0].Containers[0].State; got != tc.want {
			t.Errorf("%s: state %s, want %s", tc.name, got, tc.want)
		}
		// The charge reads from the assignment, whatever the record says.
		if n.GPUs[0].Allocated != 4 || n.GPUs[1].Allocated != 4 {
			t.Errorf("%s: GPUs %+v, want 4 and 4", tc.name, n.GPUs)
		}
	}
}

// A multi-GPU assignment that breaks the contract is skipped, not charged:
// an uneven split, an index annotation that is not the set's first GPU,
// containers on different sets, units that do not divide over the set.
func TestMultiGPUBadAssignmentIsSkipped(t *testing.T) {
	assign := func(name string, p corev1.Pod, idx int, units uint64, a gpushare.Allocation) corev1.Pod {
		p.Name = name
		return fixture.Assign(p, gpushare.PodAssignment{GPUIndex: idx, PodUnits: units, DevUnits: 15, AssumeTime: 1, Allocation: a})
	}
	one := fixture.Pod("d", "", "n", fixture.Container("main", 8))
	two := fixture.Pod("d", "", "n", fixture.Container("a", 4), fixture.Container("b", 4))
	odd := fixture.Pod("d", "", "n", fixture.Container("main", 4))
	odd.Spec.InitContainers = []corev1.Container{fixture.Container("i", 3)}
	pods := []corev1.Pod{
		assign("uneven", one, 0, 8, gpushare.Allocation{0: {0: 3, 1: 5}}),
		assign("wrong-idx", one, 1, 8, gpushare.Allocation{0: {0: 4, 1: 4}}),
		assign("two-sets", two, 0, 8, gpushare.Allocation{0: {0: 2, 1: 2}, 1: {0: 2, 2: 2}}),
		assign("odd-init", odd, 0, 4, gpushare.Allocation{0: {0: 2, 1: 2}}),
		fixture.MultiGPUPod("d", "good", "n", 8, gpushare.NewGPUSet(0, 1), 15, true),
	}
	r := collect.Build([]corev1.Node{fixture.Node("n", "", 45, 3)}, pods)
	var skipped []string
	for _, s := range r.Skipped {
		skipped = append(skipped, s.Name)
	}
	if got := strings.Join(skipped, ","); got != "odd-init,two-sets,uneven,wrong-idx" {
		t.Errorf("skipped %s (%v)", got, r.Skipped)
	}
	if n := r.Nodes[0]; n.Allocated != 8 || len(n.Pods) != 1 || n.GPUs[0].Allocated != 4 || n.GPUs[1].Allocated != 4 || n.GPUs[2].Allocated != 0 {
		t.Errorf("node %+v; want only good, 4 on GPUs 0 and 1", n)
	}
}

// A multi-GPU pod bound without its assignment yet is pending with its whole request.
func TestMultiGPUPending(t *testing.T) {
	p := fixture.Pod("d", "p", "n", fixture.Container("main", 8))
	p.Labels = map[string]string{gpushare.LabelPodGPUCount: "2"}
	r := collect.Build([]corev1.Node{fixture.Node("n", "", 30, 2)}, []corev1.Pod{p})
	n := r.Nodes[0]
	if n.Pending != 8 || n.Allocated != 8 || !n.Pods[0].Pending || n.Pods[0].GPUSet != nil || n.Pods[0].Containers[0].GPUs != nil {
		t.Errorf("node %+v", n)
	}
}
