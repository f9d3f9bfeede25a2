package server

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/extender/binder"
	"github.com/gpushare/gpushare/extender/preempt"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

// runningPod is gpuPod(name, units) at priority, running on node with its
// units confirmed on GPU gpu of a 16-unit card.
func runningPod(t *testing.T, name string, priority int32, node string, gpu int, units int64) *corev1.Pod {
	t.Helper()
	p := gpuPod(name, units)
	ann, err := gpushareAssignment(gpu, units).Encode()
	if err != nil {
		t.Fatal(err)
	}
	p.Spec.NodeName, p.Annotations, p.Spec.Priority = node, ann, &priority
	p.Status.Phase = corev1.PodRunning
	return p
}

func gpushareAssignment(gpu int, units int64) gpushare.PodAssignment {
	return gpushare.PodAssignment{GPUIndex: gpu, PodUnits: uint64(units), DevUnits: 16, Assigned: true, AssumeTime: 1}
}

// cpuPod asks no gpu-mem.
func cpuPod(name string, priority int32, node string) *corev1.Pod {
	p := gpuPod(name)
	p.Spec.Containers = []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
		Limits: corev1.ResourceList{corev1.ResourceCPU: *resource.NewQuantity(1, resource.DecimalSI)}}}}
	p.Spec.NodeName, p.Spec.Priority = node, &priority
	p.Status.Phase = corev1.PodRunning
	return p
}

func preemptor(units int64, priority int32) *corev1.Pod {
	p := gpuPod("preemptor", units)
	p.Spec.Priority = &priority
	return p
}

// preemptObjects: n1 (2 × 16) holds two low pods on GPU 0 and a low and a
// mid pod on GPU 1, plus a CPU-only pod; n2 is full of pods above the
// preemptor; n3 is empty; n4 has a terminating low pod filling GPU 0 and a mid
// pod filling GPU 1.
func preemptObjects(t *testing.T) []runtime.Object {
	term := runningPod(t, "term", 1, "n4", 0, 16)
	now := metav1.Now()
	term.DeletionTimestamp, term.Finalizers = &now, []string{"example.com/hold"}
	return []runtime.Object{
		gpuNode("n1", 32, 2), gpuNode("n2", 32, 2), gpuNode("n3", 32, 2), gpuNode("n4", 32, 2),
		runningPod(t, "lowA", 100, "n1", 0, 8), runningPod(t, "lowB", 100, "n1", 0, 8),
		runningPod(t, "low2", 100, "n1", 1, 8), runningPod(t, "mid", 200, "n1", 1, 8),
		cpuPod("plain", 100, "n1"),
		runningPod(t, "top0", 5000, "n2", 0, 16), runningPod(t, "top1", 5000, "n2", 1, 16),
		term, runningPod(t, "mid4", 200, "n4", 1, 16),
	}
}

func (e *env) preempt(args any) extenderv1.ExtenderPreemptionResult {
	e.t.Helper()
	code, body := e.do("POST", "/gpushare-scheduler/preempt", args)
	if code != http.StatusOK {
		e.t.Fatalf("preempt: %d %s", code, body)
	}
	var res extenderv1.ExtenderPreemptionResult
	if err := json.Unmarshal(body, &res); err != nil {
		e.t.Fatalf("preempt answer %s: %v", body, err)
	}
	return res
}

func meta(pdb int64, uids ...string) *extenderv1.MetaVictims {
	v := &extenderv1.MetaVictims{NumPDBViolations: pdb}
	for _, u := range uids {
		v.Pods = append(v.Pods, &extenderv1.MetaPod{UID: u})
	}
	return v
}

func uidsOf(v *extenderv1.MetaVictims) []string {
	var out []string
	for _, p := range v.Pods {
		out = append(out, p.UID)
	}
	slices.Sort(out)
	return out
}

// checkVictims compares a node's answer with want, UIDs as a set.
func checkVictims(t *testing.T, res extenderv1.ExtenderPreemptionResult, node string, want *extenderv1.MetaVictims) {
	t.Helper()
	got, ok := res.NodeNameToMetaVictims[node]
	if want == nil {
		if ok {
			t.Errorf("%s: victims %v, want the node dropped", node, uidsOf(got))
		}
		return
	}
	if !ok || got == nil {
		t.Errorf("%s dropped, want victims %v", node, uidsOf(want))
		return
	}
	if !reflect.DeepEqual(uidsOf(got), uidsOf(want)) || got.NumPDBViolations != want.NumPDBViolations {
		t.Errorf("%s: victims %v (%d PDB violations), want %v (%d)", node, uidsOf(got), got.NumPDBViolations, uidsOf(want), want.NumPDBViolations)
	}
}

// schedulerChoice is what kube-scheduler's total-based preemption hands the
// extender: on n1 a low pod on each GPU (16 units in all, yet no GPU with 16
// free) plus the CPU-only pod it needed for CPU, one PDB violation.
func schedulerChoice() map[string]*extenderv1.MetaVictims {
	return map[string]*extenderv1.MetaVictims{
		"n1":    meta(1, "uid-lowB", "uid-low2", "uid-plain"),
		"n2":    meta(0, "uid-top0"),
		"n3":    meta(3, "uid-x"),
		"n4":    meta(0, "uid-term"),
		"ghost": meta(0, "uid-y"),
	}
}

func TestPreemptMetaVictims(t *testing.T) {
	e := newEnv(t, preemptObjects(t)...)
	// Before preemption the preemptor fits nowhere but n3.
	if f := e.filter(preemptor(16, 1000), "n1", "n2", "n3", "n4"); !reflect.DeepEqual(*f.NodeNames, []string{"n3"}) {
		t.Fatalf("filter = %v, want n3 alone", *f.NodeNames)
	}
	res := e.preempt(extenderv1.ExtenderPreemptionArgs{Pod: preemptor(16, 1000), NodeNameToMetaVictims: schedulerChoice()})
	// n1: both of GPU 0's low pods (lowA, which the scheduler did not pick,
	// adds a PDB violation), the CPU pod kept, low2 (GPU 1) no longer needed.
	checkVictims(t, res, "n1", meta(2, "uid-lowA", "uid-lowB", "uid-plain"))
	checkVictims(t, res, "n2", meta(0, "uid-top0")) // its victim frees GPU 0: the scheduler's answer
	checkVictims(t, res, "n3", meta(3, "uid-x"))    // fits already: the scheduler's answer
	checkVictims(t, res, "n4", meta(0, "uid-term")) // the terminating pod's memory frees GPU 0
	checkVictims(t, res, "ghost", nil)              // not in the cache
	if len(res.NodeNameToMetaVictims) != 4 {
		t.Errorf("answer has %d nodes, want 4: %v", len(res.NodeNameToMetaVictims), res.NodeNameToMetaVictims)
	}

	// 8 units, the scheduler's victim freeing 8 on GPU 1: its answer stands.
	res = e.preempt(extenderv1.ExtenderPreemptionArgs{Pod: preemptor(8, 1000), NodeNameToMetaVictims: map[string]*extenderv1.MetaVictims{
		"n1": meta(0, "uid-mid"),
	}})
	checkVictims(t, res, "n1", meta(0, "uid-mid"))
	// No victim handed: one low pod of n1 is enough (the cheapest: priority 100, one pod).
	res = e.preempt(extenderv1.ExtenderPreemptionArgs{Pod: preemptor(8, 1000), NodeNameToMetaVictims: map[string]*extenderv1.MetaVictims{"n1": meta(0)}})
	got := res.NodeNameToMetaVictims["n1"]
	if got == nil || len(got.Pods) != 1 || !slices.Contains([]string{"uid-lowA", "uid-lowB", "uid-low2"}, got.Pods[0].UID) || got.NumPDBViolations != 1 {
		t.Errorf("8 units on n1: %+v, want one low pod and 1 PDB violation", got)
	}

	// At priority 150 only the low pods are below: GPU 0's two still do.
	res = e.preempt(extenderv1.ExtenderPreemptionArgs{Pod: preemptor(16, 150), NodeNameToMetaVictims: map[string]*extenderv1.MetaVictims{
		"n1": meta(0, "uid-lowA", "uid-lowB"),
		"n4": meta(0),
	}})
	checkVictims(t, res, "n1", meta(0, "uid-lowA", "uid-lowB"))
	checkVictims(t, res, "n4", nil) // mid4 is above 150, term terminating
	// At priority 100 nothing on n1 is below.
	res = e.preempt(extenderv1.ExtenderPreemptionArgs{Pod: preemptor(16, 100), NodeNameToMetaVictims: map[string]*extenderv1.MetaVictims{"n1": meta(0, "uid-lowA")}})
	checkVictims(t, res, "n1", nil)
}

func TestPreemptWholePodVictims(t *testing.T) {
	objs := preemptObjects(t)
	e := newEnv(t, objs...)
	pods := map[string]*corev1.Pod{}
	for _, o := range objs {
		if p, ok := o.(*corev1.Pod); ok {
			pods[p.Name] = p
		}
	}
	args := extenderv1.ExtenderPreemptionArgs{Pod: preemptor(16, 1000), NodeNameToVictims: map[string]*extenderv1.Victims{
		"n1":    {Pods: []*corev1.Pod{pods["lowB"], pods["low2"], pods["plain"]}, NumPDBViolations: 1},
		"n2":    {Pods: []*corev1.Pod{pods["top0"]}},
		"n3":    {Pods: []*corev1.Pod{pods["mid"]}, NumPDBViolations: 3},
		"ghost": {Pods: []*corev1.Pod{pods["lowA"]}},
	}}
	res := e.preempt(args)
	checkVictims(t, res, "n1", meta(2, "uid-lowA", "uid-lowB", "uid-plain"))
	checkVictims(t, res, "n2", meta(0, "uid-top0"))
	checkVictims(t, res, "n3", meta(3, "uid-mid"))
	checkVictims(t, res, "ghost", nil)
	if len(res.NodeNameToMetaVictims) != 3 {
		t.Errorf("answer has %d nodes, want 3: %v", len(res.NodeNameToMetaVictims), res.NodeNameToMetaVictims)
	}
}

// TestPreemptKeepsTheSchedulersVictims: a victim the scheduler chose that
// also requests CPU (it may have needed it for that) stays in the answer,
// which adds the GPU pods that make the preemptor fit; a victim holding only
// GPU memory is replaced when other pods serve better, unless the preemptor
// has required anti-affinity (the scheduler may have chosen it for that).
func TestPreemptKeepsTheSchedulersVictims(t *testing.T) {
	both := runningPod(t, "both", 100, "n5", 1, 8)
	both.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")}
	objs := append(preemptObjects(t), gpuNode("n5", 32, 2), both,
		runningPod(t, "lowC", 100, "n5", 0, 8), runningPod(t, "lowF", 100, "n5", 0, 8), runningPod(t, "mid5", 200, "n5", 1, 8))
	e := newEnv(t, objs...)
	// CPU needed both; 16 units in all made it add lowC. GPU 0 still has 8.
	res := e.preempt(extenderv1.ExtenderPreemptionArgs{Pod: preemptor(16, 1000), NodeNameToMetaVictims: map[string]*extenderv1.MetaVictims{
		"n5": meta(0, "uid-both", "uid-lowC"),
	}})
	checkVictims(t, res, "n5", meta(1, "uid-both", "uid-lowC", "uid-lowF"))

	picky := preemptor(16, 1000)
	picky.Spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{TopologyKey: "kubernetes.io/hostname"}}}}
	for pod, want := range map[*corev1.Pod]*extenderv1.MetaVictims{
		preemptor(16, 1000): meta(2, "uid-lowA", "uid-lowB", "uid-plain"), // low2 only held GPU memory
		picky:               meta(2, "uid-lowA", "uid-lowB", "uid-low2", "uid-plain"),
	} {
		res = e.preempt(extenderv1.ExtenderPreemptionArgs{Pod: pod, NodeNameToMetaVictims: map[string]*extenderv1.MetaVictims{
			"n1": meta(1, "uid-lowB", "uid-low2", "uid-plain"),
		}})
		checkVictims(t, res, "n1", want)
	}
}

// TestPreemptWithoutGPUMem: a pod asking no gpu-mem gets the scheduler's
// victims back unchanged on every node; a pod whose request cannot be read
// gets every node dropped.
func TestPreemptWithoutGPUMem(t *testing.T) {
	e := newEnv(t, preemptObjects(t)...)
	pod := cpuPod("cpu-preemptor", 1000, "")
	handed := schedulerChoice()
	res := e.preempt(extenderv1.ExtenderPreemptionArgs{Pod: pod, NodeNameToMetaVictims: handed})
	for node, want := range schedulerChoice() {
		if node == "ghost" {
			continue
		}
		checkVictims(t, res, node, want)
	}
	negative := preemptor(1, 1000)
	negative.Spec.Containers[0].Resources.Limits[gpushare.ResourceName] = resource.MustParse("-3")
	res = e.preempt(extenderv1.ExtenderPreemptionArgs{Pod: negative, NodeNameToMetaVictims: schedulerChoice()})
	if len(res.NodeNameToMetaVictims) != 0 {
		t.Errorf("unreadable request: %v, want every node dropped", res.NodeNameToMetaVictims)
	}
}

func TestPreemptBadRequests(t *testing.T) {
	e := newEnv(t, gpuNode("n1", 32, 2))
	huge := append([]byte(`{"Pod":{"metadata":{"name":"`), strings.Repeat("x", 2<<20)...)
	huge = append(huge, `"}}`...)
	for _, tt := range []struct {
		name   string
		body   any
		code   int
		substr string
	}{
		{"without pod", []byte(`{"NodeNameToMetaVictims":{"n1":{"Pods":[]}}}`), 400, "no Pod"},
		{"malformed", []byte(`{"Pod":`), 400, "malformed"},
		{"over the body limit", huge, 413, "larger than"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			code, body := e.do("POST", "/gpushare-scheduler/preempt", tt.body)
			if code != tt.code || !strings.Contains(string(body), tt.substr) {
				t.Fatalf("%d %s, want %d containing %q", code, body, tt.code, tt.substr)
			}
		})
	}
	if code, _ := e.do("GET", "/gpushare-scheduler/preempt", nil); code != http.StatusMethodNotAllowed {
		t.Errorf("GET preempt = %d, want 405", code)
	}
}

func TestPreemptNotReady(t *testing.T) {
	s, err := New(Config{Cache: stubCache{}, Binder: binder.New(binder.Config{}), Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	body, err := json.Marshal(extenderv1.ExtenderPreemptionArgs{Pod: preemptor(8, 1000)})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest("POST", "/gpushare-scheduler/preempt", strings.NewReader(string(body))))
	if rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("preempt before sync = %d %s, want 503", rec.Code, rec.Body)
	}
}

// TestPreemptFunction calls Preempt directly on the real cache: the answer
// never names a pod twice and the pod fits the node without our victims.
func TestPreemptFunction(t *testing.T) {
	e := newEnv(t, preemptObjects(t)...)
	for _, units := range []int64{1, 4, 8, 9, 12, 16, 17} {
		res := Preempt(e.cache, allocator.BestFit, &extenderv1.ExtenderPreemptionArgs{Pod: preemptor(units, 1000), NodeNameToMetaVictims: schedulerChoice()})
		for node, v := range res.NodeNameToMetaVictims {
			uids := uidsOf(v)
			if len(slices.Compact(slices.Clone(uids))) != len(uids) {
				t.Errorf("%d units, %s: a pod named twice: %v", units, node, uids)
			}
		}
		v := res.NodeNameToMetaVictims["n1"]
		if units > 16 {
			if v != nil {
				t.Errorf("%d units: n1 victims %v, want n1 dropped (bigger than any GPU)", units, uidsOf(v))
			}
			continue
		}
		if v == nil {
			t.Fatalf("%d units: n1 dropped", units)
		}
		// Every victim the scheduler did not choose adds one violation.
		extra := int64(0)
		for _, u := range uidsOf(v) {
			if !slices.Contains([]string{"uid-lowB", "uid-low2", "uid-plain"}, u) {
				extra++
			}
		}
		if v.NumPDBViolations != 1+extra {
			t.Errorf("%d units: %d PDB violations for %v, want %d", units, v.NumPDBViolations, uidsOf(v), 1+extra)
		}
		if !slices.Contains(uidsOf(v), "uid-plain") {
			t.Errorf("%d units: the CPU-only victim was dropped: %v", units, uidsOf(v))
		}
	}
}

// holdersCache answers Holders from a fixed node, for FuzzPreempt.
type holdersCache struct {
	Cache
	node    *allocator.Node
	holders []preempt.Holder
}

func (c holdersCache) Holders(name string) (*allocator.Node, []preempt.Holder, bool) {
	if name != c.node.Name {
		return nil, nil, false
	}
	return c.node, c.holders, true
}

// FuzzPreempt: whatever the scheduler hands over, an answered node lets the
// pod fit once the answer's GPU holders are gone, keeps every victim the
// scheduler chose (none of these holders is GPU memory alone), adds only
// lower-priority evictable holders, and never counts fewer PDB violations
// than the scheduler did.
func FuzzPreempt(f *testing.F) {
	f.Add(uint8(16), int32(1000), "abcx", uint8(1))
	f.Add(uint8(8), int32(150), "cz", uint8(0))
	f.Add(uint8(40), int32(1000), "", uint8(5))
	f.Add(uint8(0), int32(1000), "a", uint8(2))
	hs := []preempt.Holder{
		{UID: "a", Name: "default/a", Priority: 100, Charges: map[int]uint64{0: 8}, Evictable: true},
		{UID: "b", Name: "default/b", Priority: 100, Charges: map[int]uint64{0: 8}, Evictable: true},
		{UID: "c", Name: "default/c", Priority: 100, Charges: map[int]uint64{1: 8}, Evictable: true},
		{UID: "d", Name: "default/d", Priority: 200, Charges: map[int]uint64{1: 4, 2: 4}, Evictable: true},
		{UID: "e", Name: "default/e", Priority: 50, Charges: map[int]uint64{2: 12}, Evictable: false},
	}
	n := &allocator.Node{Name: "n1", GPUShare: true, GPUs: []allocator.GPU{
		{Index: 0, Units: 16, Used: 16, Healthy: true},
		{Index: 1, Units: 16, Used: 12, Healthy: true},
		{Index: 2, Units: 16, Used: 16, Healthy: true},
	}, InFlight: []allocator.InFlight{{Pod: "default/c", PodUnits: 8, Slots: []allocator.Slot{{Units: 8, GPUs: gpushare.NewGPUSet(1)}}}}}
	c := holdersCache{node: n, holders: hs}
	f.Fuzz(func(t *testing.T, units uint8, priority int32, theirs string, pdb uint8) {
		pod := preemptor(int64(units), priority)
		handed := meta(int64(pdb))
		for _, u := range theirs {
			handed.Pods = append(handed.Pods, &extenderv1.MetaPod{UID: string(u)})
		}
		res := Preempt(c, allocator.BestFit, &extenderv1.ExtenderPreemptionArgs{Pod: pod,
			NodeNameToMetaVictims: map[string]*extenderv1.MetaVictims{"n1": handed, "ghost": meta(0, "q")}})
		if _, ok := res.NodeNameToMetaVictims["ghost"]; ok && units > 0 {
			t.Fatal("a node the cache does not know is answered")
		}
		v, ok := res.NodeNameToMetaVictims["n1"]
		if !ok {
			return
		}
		if units == 0 {
			if !reflect.DeepEqual(v, handed) {
				t.Fatalf("no gpu-mem: %+v, want the scheduler's %+v", v, handed)
			}
			return
		}
		r := allocator.RequestOf("default/preemptor", []gpushare.ContainerRequest{{Name: "c0", Units: uint64(units)}})
		var gone []preempt.Holder
		for _, h := range hs {
			if slices.ContainsFunc(handed.Pods, func(p *extenderv1.MetaPod) bool { return p.UID == h.UID }) {
				gone = append(gone, h)
			}
		}
		if _, unfit := allocator.Place(preempt.Without(n, gone), r, allocator.BestFit); unfit == nil {
			if !reflect.DeepEqual(v, handed) {
				t.Fatalf("fits once the scheduler's victims are gone: %+v, want the scheduler's %+v", v, handed)
			}
			return
		}
		for _, p := range handed.Pods {
			if !slices.Contains(uidsOf(v), p.UID) {
				t.Fatalf("the scheduler's victim %s was dropped: %v", p.UID, uidsOf(v))
			}
		}
		var ours []preempt.Holder
		added := 0
		for _, p := range v.Pods {
			i := slices.IndexFunc(hs, func(h preempt.Holder) bool { return h.UID == p.UID })
			if i < 0 {
				continue
			}
			ours = append(ours, hs[i])
			if slices.ContainsFunc(handed.Pods, func(q *extenderv1.MetaPod) bool { return q.UID == p.UID }) {
				continue
			}
			added++
			if h := hs[i]; !h.Evictable || h.Priority >= priority {
				t.Fatalf("added victim %+v at preemptor priority %d", h, priority)
			}
		}
		if _, unfit := allocator.Place(preempt.Without(n, ours), r, allocator.BestFit); unfit != nil {
			t.Fatalf("does not fit without %v: %s", uidsOf(v), unfit.Reason)
		}
		if v.NumPDBViolations != handed.NumPDBViolations+int64(added) {
			t.Fatalf("%d PDB violations, handed %d, %d added", v.NumPDBViolations, handed.NumPDBViolations, added)
		}
	})
}
