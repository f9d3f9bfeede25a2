//go:build e2e

package e2e

import (
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

// Priority classes of the preemption test: low and mid fill the node, high preempts, and bump
// outranks only low.
var preemptClasses = map[string]int32{"gs-low": 100, "gs-mid": 200, "gs-bump": 150, "gs-high": 1000}

// preemptFill is the full node, in creation order, with the GPU best fit puts each pod on when
// they come one at a time: GPU 0 two low 40s, GPU 1 two mid 40s, GPU 2 four low 20s, GPU 3 a low
// 40 and two mid 20s, GPUs 4-7 a mid 80 each.
var preemptFill = []struct {
	name, class string
	units       int64
	gpu         int
}{
	{"a1", "gs-low", 40, 0}, {"a2", "gs-low", 40, 0},
	{"b1", "gs-mid", 40, 1}, {"b2", "gs-mid", 40, 1},
	{"c1", "gs-low", 20, 2}, {"c2", "gs-low", 20, 2}, {"c3", "gs-low", 20, 2}, {"c4", "gs-low", 20, 2},
	{"d1", "gs-low", 40, 3}, {"d2", "gs-mid", 20, 3}, {"d3", "gs-mid", 20, 3},
	{"e1", "gs-mid", 80, 4}, {"e2", "gs-mid", 80, 5}, {"e3", "gs-mid", 80, 6}, {"e4", "gs-mid", 80, 7},
}

func classPod(name, class string, units int64) *corev1.Pod {
	p := (sysPod{name: name, sizes: []int64{units}}).object()
	p.Spec.PriorityClassName = class
	return p
}

// preemptStep is one preemptor and what it must evict: gpu is where it then runs, -1 when it
// stays Pending.
type preemptStep struct {
	pod     string
	class   string
	units   int64
	evicted []string
	gpu     int
}

// TestPreemptionFreesOneGPU: a full node of 8 × 80 GiB holding low- and mid-priority pods, through
// the real kube-scheduler (its preemption calling our preempt verb), our extender and device
// plugin. A high-priority pod of 80 GiB evicts exactly the two low pods of GPU 0 (the cheapest
// GPU to free: the lowest priorities, the fewest pods) and runs there. A pod of 80 GiB that
// outranks only the low pods evicts GPU 2's four low 20s: the scheduler's own preemption, counting
// the node's total, picks the newest low pods, which free 80 GiB over GPUs 2 and 3 and on neither
// alone, and the verb replaces them. A high-priority pod of 20 GiB then gets the scheduler's
// choice unchanged (d1, whose 40 GiB on GPU 3 make room), and another 80 GiB pod with no low pod
// left evicts nothing. After every step every GPU's total adds up in annotations and checkpoints,
// and every container's env equals its annotations.
func TestPreemptionFreesOneGPU(t *testing.T) {
	t.Parallel()
	b := startSystem(t)
	b.runPreemption(t, []preemptStep{
		{"h80", "gs-high", 80, []string{"a1", "a2"}, 0},
		{"bump80", "gs-bump", 80, []string{"c1", "c2", "c3", "c4"}, 2},
		{"h20", "gs-high", 20, []string{"d1"}, 3},
		{"bump80b", "gs-bump", 80, nil, -1},
	})
	// The answers came from our verb, not from the scheduler alone: two nodes answered with victims
	// on one GPU, one with the scheduler's own.
	chosen, unchanged := b.preemptAnswers(t, "chosen"), b.preemptAnswers(t, "unchanged")
	if chosen < 2 || unchanged < 1 {
		t.Errorf("the extender's preempt verb answered %v nodes with victims of its own and %v unchanged; want at least 2 and 1", chosen, unchanged)
	}
}

// TestPreemptionKeepsTheSchedulersCPUVictim: the same full node, whose one CPU core d1 (a low
// 40 on GPU 3) holds 600m of. A high-priority pod of 40 GiB that also asks 600m of CPU needs d1
// gone for the CPU; kube-scheduler's preemption picks d1 alone (it frees the 40 GiB too), and
// since the pod then fits on GPU 3, our verb must answer d1 unchanged. Before round 3 the verb
// dropped d1 (it holds gpu-mem) for the cheapest GPU victim, a low 40 of GPU 0; the pod, still
// short of CPU, preempted again and two pods were evicted where one was needed.
func TestPreemptionKeepsTheSchedulersCPUVictim(t *testing.T) {
	t.Parallel()
	b := startSystem(t)
	cpu := func(p *corev1.Pod) {
		if p.Name == "d1" || p.Name == "hcpu" {
			p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("600m")}
		}
	}
	b.runPreemptionWith(t, []preemptStep{{"hcpu", "gs-high", 40, []string{"d1"}, 3}}, cpu)
	if unchanged := b.preemptAnswers(t, "unchanged"); unchanged < 1 {
		t.Errorf("the extender answered %v nodes with the scheduler's victims unchanged; want at least 1", unchanged)
	}
}

// TestPluginModePreemption is the same node through gpushare-scheduler, whose preemption is
// kube-scheduler's own with our Filter judging each what-if: every eviction frees room on the one
// GPU the preemptor then runs on, never memory scattered over GPUs. The scheduler spares the oldest
// pods first, so it evicts the newest GPU's pods (four low 20s for the 80 GiB pod, where the verb
// evicts two low 40s); its victims are exactly these, predicted from that order. A pod that only
// lower-priority pods could make room for, once none is left, evicts nothing. No step evicts more:
// pods the scheduler saw deleted before the plugin's watch did are not counted again (they made it
// preempt a second time in three runs of four before the plugin released them).
func TestPluginModePreemption(t *testing.T) {
	t.Parallel()
	b := startPluginSystem(t)
	b.runPreemption(t, []preemptStep{
		{"h80", "gs-high", 80, []string{"c1", "c2", "c3", "c4"}, 2},
		{"h20", "gs-high", 20, []string{"d1"}, 3},
		{"bump80", "gs-bump", 80, []string{"a1", "a2"}, 0},
		{"bump80b", "gs-bump", 80, nil, -1},
	})
}

// runPreemption fills node pre-0 (preemptFill), then creates each step's preemptor and checks
// which pods it evicted and where it runs, auditing every GPU after every step.
func (b *systemBed) runPreemption(t *testing.T, steps []preemptStep) {
	t.Helper()
	b.runPreemptionWith(t, steps, nil)
}

// runPreemptionWith is runPreemption with every pod it creates, fill and preemptors, changed by
// edit first (nil: none).
func (b *systemBed) runPreemptionWith(t *testing.T, steps []preemptStep, edit func(*corev1.Pod)) {
	t.Helper()
	ctx := t.Context()
	b.addNode(t, "pre-0", "simulated:dgxh100")
	for name, value := range preemptClasses {
		pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Value: value}
		if _, err := b.client.SchedulingV1().PriorityClasses().Create(ctx, pc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	create := func(name, class string, units int64) {
		p := classPod(name, class, units)
		if edit != nil {
			edit(p)
		}
		createAll(t, b.client, []*corev1.Pod{p})
	}
	for _, f := range preemptFill {
		create(f.name, f.class, f.units)
		p := b.waitAllRunning(t, map[string]*corev1.Pod{f.name: nil}, waitLong)[0]
		if got := p.Annotations[gpushare.AnnotationGPUIndex]; got != fmt.Sprint(f.gpu) {
			t.Fatalf("fill pod %s went to GPU %s, the test expects %d (best fit, one pod at a time)", f.name, got, f.gpu)
		}
	}
	alive := map[string]bool{}
	for _, f := range preemptFill {
		alive[f.name] = true
	}
	b.auditPreemption(t, alive, "the full node")
	for _, s := range steps {
		began := time.Now()
		create(s.pod, s.class, s.units)
		if s.gpu < 0 {
			b.waitPreemptionRefused(t, s.pod)
		} else {
			p := b.waitAllRunning(t, map[string]*corev1.Pod{s.pod: nil}, waitLong)[0]
			if got := p.Annotations[gpushare.AnnotationGPUIndex]; got != fmt.Sprint(s.gpu) {
				t.Errorf("%s runs on GPU %s, want %d", s.pod, got, s.gpu)
			}
			alive[s.pod] = true
		}
		gone := b.gonePods(t, alive)
		if !slices.Equal(gone, s.evicted) {
			t.Errorf("%s (%d units, %s): evicted %v, want exactly %v", s.pod, s.units, s.class, gone, s.evicted)
		}
		for _, g := range gone {
			delete(alive, g)
		}
		t.Logf("%s (%d units, %s): evicted %v, %v", s.pod, s.units, s.class, gone, time.Since(began).Round(time.Millisecond))
		b.auditPreemption(t, alive, "after "+s.pod)
	}
}

// preemptAnswers reads gpushare_extender_preempt_nodes_total{outcome} from the extender.
func (b *systemBed) preemptAnswers(t *testing.T, outcome string) float64 {
	t.Helper()
	return seriesValue(t, b.extAddr, `gpushare_extender_preempt_nodes_total{outcome="`+outcome+`"}`)
}

// seriesValue reads one series (name and labels as the exposition spells them)
// from the /metrics of the extender at addr; 0 when it has none.
func seriesValue(t *testing.T, addr, series string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	return 0
}

// gonePods lists, sorted, the pods of alive that are deleted or being deleted.
func (b *systemBed) gonePods(t *testing.T, alive map[string]bool) []string {
	t.Helper()
	var gone []string
	for _, name := range slices.Sorted(maps.Keys(alive)) {
		p, err := b.client.CoreV1().Pods("default").Get(t.Context(), name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			gone = append(gone, name)
		case err != nil:
			t.Fatal(err)
		case p.DeletionTimestamp != nil:
			gone = append(gone, name)
		}
	}
	return gone
}

// waitPreemptionRefused waits for the scheduler to give up on pod after trying preemption, and
// checks that it nominated no node (a preemption that goes ahead nominates one before it evicts).
func (b *systemBed) waitPreemptionRefused(t *testing.T, pod string) {
	t.Helper()
	if !hasEvent(t.Context(), t, b, pod, "FailedScheduling", "preemption:") {
		t.Fatalf("pod %s: no FailedScheduling event reporting preemption", pod)
	}
	p, err := b.client.CoreV1().Pods("default").Get(t.Context(), pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.NodeName != "" || p.Status.NominatedNodeName != "" {
		t.Errorf("pod %s: node %q, nominated %q; want neither", pod, p.Spec.NodeName, p.Status.NominatedNodeName)
	}
	t.Logf("pod %s stays Pending: %s", pod, unschedulable(p))
}

// auditPreemption waits until exactly the pods of alive exist (evicted ones gone for good), then
// runs the system checks on them: checkpoint env against annotations, every GPU's total.
func (b *systemBed) auditPreemption(t *testing.T, alive map[string]bool, when string) {
	t.Helper()
	pollUntil(t, waitLong, "evicted pods gone "+when, func() bool {
		l, err := b.client.CoreV1().Pods("default").List(t.Context(), metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, p := range l.Items {
			if !alive[p.Name] && p.Spec.NodeName != "" {
				return false
			}
		}
		return true
	})
	names := map[string]*corev1.Pod{}
	for name := range alive {
		names[name] = nil
	}
	items := b.waitAllRunning(t, names, waitLong)
	v := b.verifySystem(t, items)
	var used []string
	for g, u := range v.byAnnotations["pre-0"] {
		used = append(used, fmt.Sprintf("%d:%d", g, u))
	}
	slices.Sort(used)
	t.Logf("%s: GPU units used %s", when, strings.Join(used, " "))
}
