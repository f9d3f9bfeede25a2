package allocate_test

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpushare/gpushare/plugin/allocate"
	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/inventory"
)

const node = "n1"

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// inv builds an inventory of GPUs with the given GiB sizes.
func inv(t *testing.T, gib ...uint64) *inventory.Inventory {
	t.Helper()
	var gpus []inventory.GPU
	for i, g := range gib {
		gpus = append(gpus, inventory.GPU{Index: i, UUID: fmt.Sprintf("GPU-%d", i), MemoryMiB: g * 1024})
	}
	in, err := inventory.New(gpus, gpushare.GiB)
	if err != nil {
		t.Fatal(err)
	}
	return in
}

// podOpt changes a test pod.
type podOpt func(*corev1.Pod)

func ctr(name string, units int64) corev1.Container {
	c := corev1.Container{Name: name}
	if units > 0 {
		c.Resources.Limits = corev1.ResourceList{gpushare.ResourceName: *resource.NewQuantity(units, resource.DecimalSI)}
	}
	return c
}

// pod builds a pending pod on node with one container per size (named c0, c1, ...).
func pod(name string, sizes []int64, opts ...podOpt) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name),
			CreationTimestamp: metav1.NewTime(t0), Annotations: map[string]string{}},
		Spec:   corev1.PodSpec{NodeName: node},
		Status: corev1.PodStatus{Phase: corev1.PodPending},
	}
	for i, s := range sizes {
		p.Spec.Containers = append(p.Spec.Containers, ctr(fmt.Sprintf("c%d", i), s))
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

// onGPU annotates the pod as the extender does with a GPU index, assumed at t0+at seconds.
func onGPU(gpu int, devUnits uint64, at int64) podOpt {
	return func(p *corev1.Pod) {
		reqs, _ := gpushare.ContainerRequests(p)
		a := gpushare.PodAssignment{GPUIndex: gpu, PodUnits: gpushare.PodUnits(reqs), DevUnits: devUnits,
			AssumeTime: t0.Add(time.Duration(at) * time.Second).UnixNano(), Allocation: gpushare.AllocationForGPU(reqs, gpu)}
		ann, err := a.Encode()
		if err != nil {
			panic(err)
		}
		for k, v := range ann {
			p.Annotations[k] = v
		}
	}
}

func annotate(k, v string) podOpt { return func(p *corev1.Pod) { p.Annotations[k] = v } }
func phase(ph corev1.PodPhase) podOpt {
	return func(p *corev1.Pod) { p.Status.Phase = ph }
}
func created(sec int64) podOpt {
	return func(p *corev1.Pod) { p.CreationTimestamp = metav1.NewTime(t0.Add(time.Duration(sec) * time.Second)) }
}
func initCtr(name string, units int64) podOpt {
	return func(p *corev1.Pod) { p.Spec.InitContainers = append(p.Spec.InitContainers, ctr(name, units)) }
}

func env(gpu int, pod, ctr, dev uint64) gpushare.ContainerEnv {
	return gpushare.ContainerEnv{GPUIndex: gpu, PodUnits: pod, ContainerUnits: ctr, DevUnits: dev}
}

// want is one expected decision: pod/container and env.
type want struct {
	pod, container string
	env            gpushare.ContainerEnv
	conflicts      []string
}

func TestMatch(t *testing.T) {
	now := metav1.NewTime(t0)
	tests := []struct {
		name     string
		gpus     []uint64
		pods     []*corev1.Pod
		served   allocate.Served
		isoOff   bool
		units    []uint64
		want     []want
		wantErr  error
		wantText []string // substrings of the error message
	}{
		{
			name: "seed: one GPU, no extender annotations",
			gpus: []uint64{15}, pods: []*corev1.Pod{pod("a", []int64{4})}, units: []uint64{4},
			want: []want{{"a", "c0", env(0, 4, 4, 15), nil}},
		},
		{
			name: "no annotations on a node with two GPUs is refused, naming the extender",
			gpus: []uint64{15, 15}, pods: []*corev1.Pod{pod("a", []int64{4})}, units: []uint64{4},
			wantErr: allocate.ErrNoMatch, wantText: []string{"default/a cannot be served", "scheduler extender", `node "n1"`},
		},
		{
			name: "the GPU its annotations name, not the first free one",
			gpus: []uint64{80, 80, 80}, pods: []*corev1.Pod{pod("a", []int64{8}, onGPU(2, 80, 1))}, units: []uint64{8},
			want: []want{{"a", "c0", env(2, 8, 8, 80), nil}},
		},
		{
			name:  "equal sizes, equal signatures: oldest assume time first, no conflict",
			gpus:  []uint64{80, 80},
			pods:  []*corev1.Pod{pod("late", []int64{8}, onGPU(1, 80, 5)), pod("early", []int64{8}, onGPU(1, 80, 2))},
			units: []uint64{8},
			want:  []want{{"early", "c0", env(1, 8, 8, 80), nil}},
		},
		{
			name:  "ambiguous set: equal sizes on different GPUs; oldest is answered and the conflict reported",
			gpus:  []uint64{80, 80},
			pods:  []*corev1.Pod{pod("b", []int64{8}, onGPU(1, 80, 5)), pod("a", []int64{8}, onGPU(0, 80, 2))},
			units: []uint64{8},
			want:  []want{{"a", "c0", env(0, 8, 8, 80), []string{"default/b/c0"}}},
		},
		{
			name:  "ambiguous set: equal container size, different pod totals",
			gpus:  []uint64{80},
			pods:  []*corev1.Pod{pod("a", []int64{8}, onGPU(0, 80, 1)), pod("b", []int64{8, 2}, onGPU(0, 80, 2))},
			units: []uint64{8},
			want:  []want{{"a", "c0", env(0, 8, 8, 80), []string{"default/b/c0"}}},
		},
		{
			name:  "other sizes are never candidates",
			gpus:  []uint64{80, 80},
			pods:  []*corev1.Pod{pod("small", []int64{4}, onGPU(0, 80, 1)), pod("big", []int64{16}, onGPU(1, 80, 2))},
			units: []uint64{16},
			want:  []want{{"big", "c0", env(1, 16, 16, 80), nil}},
		},
		{
			name: "multi-container pod: each container gets its own GPU from the allocation",
			gpus: []uint64{80, 80},
			pods: []*corev1.Pod{pod("m", []int64{2, 3}, annotate(gpushare.AnnotationAllocation, `{"0":{"0":2},"1":{"1":3}}`),
				annotate(gpushare.AnnotationPodUnits, "5"), annotate(gpushare.AnnotationAssumeTime, "1"))},
			units: []uint64{3, 2},
			want:  []want{{"m", "c1", env(1, 5, 3, 80), nil}, {"m", "c0", env(0, 5, 2, 80), nil}},
		},
		{
			name:  "two requests of one size in one call: containers in spec order",
			gpus:  []uint64{80},
			pods:  []*corev1.Pod{pod("m", []int64{2, 2}, onGPU(0, 80, 1))},
			units: []uint64{2, 2},
			want:  []want{{"m", "c0", env(0, 4, 2, 80), nil}, {"m", "c1", env(0, 4, 2, 80), nil}},
		},
		{
			name:  "init container before regular ones",
			gpus:  []uint64{80},
			pods:  []*corev1.Pod{pod("i", []int64{2}, initCtr("setup", 2), onGPU(0, 80, 1))},
			units: []uint64{2},
			want:  []want{{"i", "setup", env(0, 2, 2, 80), nil}},
		},
		{
			name:   "served in memory: the next container of the pod",
			gpus:   []uint64{80},
			pods:   []*corev1.Pod{pod("i", []int64{2}, initCtr("setup", 2), onGPU(0, 80, 1))},
			served: allocate.Served{"uid-i": {"setup": env(0, 2, 2, 80)}},
			units:  []uint64{2},
			want:   []want{{"i", "c0", env(0, 2, 2, 80), nil}},
		},
		{
			name: "served on the pod's record: the next pod",
			gpus: []uint64{80},
			pods: []*corev1.Pod{
				pod("a", []int64{4}, onGPU(0, 80, 1), annotate(gpushare.AnnotationContainerEnv, `{"c0":{"gpu":0,"pod":4,"container":4,"dev":80}}`)),
				pod("b", []int64{4}, onGPU(0, 80, 2)),
			},
			units: []uint64{4},
			want:  []want{{"b", "c0", env(0, 4, 4, 80), nil}},
		},
		{
			name:    "everything served: refused, never a bogus device",
			gpus:    []uint64{80},
			pods:    []*corev1.Pod{pod("a", []int64{4}, onGPU(0, 80, 1))},
			served:  allocate.Served{"uid-a": {"c0": env(0, 4, 4, 80)}},
			units:   []uint64{4},
			wantErr: allocate.ErrNoMatch, wantText: []string{"4 GiB units"},
		},
		{
			name: "assigned, finished, deleted and foreign pods are not in flight",
			gpus: []uint64{80},
			pods: []*corev1.Pod{
				pod("assigned", []int64{4}, onGPU(0, 80, 1), annotate(gpushare.AnnotationAssigned, "true")),
				pod("done", []int64{4}, onGPU(0, 80, 1), phase(corev1.PodSucceeded)),
				pod("failed", []int64{4}, onGPU(0, 80, 1), phase(corev1.PodFailed)),
				pod("deleted", []int64{4}, onGPU(0, 80, 1), func(p *corev1.Pod) { p.DeletionTimestamp = &now }),
				pod("elsewhere", []int64{4}, onGPU(0, 80, 1), func(p *corev1.Pod) { p.Spec.NodeName = "n2" }),
			},
			units:   []uint64{4},
			wantErr: allocate.ErrNoMatch,
		},
		{
			// The kubelet may have started it under an earlier answer meant
			// for another pod of the same signature; that pod's call comes now.
			name:  "a running pod not yet recorded is still in flight",
			gpus:  []uint64{80},
			pods:  []*corev1.Pod{pod("ran", []int64{4}, onGPU(0, 80, 1), phase(corev1.PodRunning))},
			units: []uint64{4},
			want:  []want{{"ran", "c0", env(0, 4, 4, 80), nil}},
		},
		{
			name:  "a pod whose status is not reported yet is in flight",
			gpus:  []uint64{80},
			pods:  []*corev1.Pod{pod("new", []int64{4}, onGPU(0, 80, 1), phase(""))},
			units: []uint64{4},
			want:  []want{{"new", "c0", env(0, 4, 4, 80), nil}},
		},
		{
			name:    "sizes waiting are listed when nothing matches",
			gpus:    []uint64{80},
			pods:    []*corev1.Pod{pod("a", []int64{4}, onGPU(0, 80, 1))},
			units:   []uint64{5},
			wantErr: allocate.ErrNoMatch, wantText: []string{"default/a/c0=4"},
		},
		{
			name: "malformed annotation: skipped, named in the error, other pods unaffected",
			gpus: []uint64{80},
			pods: []*corev1.Pod{
				pod("bad", []int64{4}, onGPU(0, 80, 1), annotate(gpushare.AnnotationGPUIndex, "zero")),
				pod("good", []int64{4}, onGPU(0, 80, 2)),
			},
			units: []uint64{4},
			want:  []want{{"good", "c0", env(0, 4, 4, 80), nil}},
		},
		{
			name:    "malformed annotation alone",
			gpus:    []uint64{80},
			pods:    []*corev1.Pod{pod("bad", []int64{4}, onGPU(0, 80, 1), annotate(gpushare.AnnotationGPUIndex, "zero"))},
			units:   []uint64{4},
			wantErr: allocate.ErrNoMatch, wantText: []string{"default/bad cannot be served", "ALIYUN_COM_GPU_MEM_IDX"},
		},
		{
			name:    "malformed container-env record",
			gpus:    []uint64{80},
			pods:    []*corev1.Pod{pod("bad", []int64{4}, onGPU(0, 80, 1), annotate(gpushare.AnnotationContainerEnv, "[]"))},
			units:   []uint64{4},
			wantErr: allocate.ErrNoMatch, wantText: []string{"container-env"},
		},
		{
			name:    "GPU the node lacks",
			gpus:    []uint64{80},
			pods:    []*corev1.Pod{pod("a", []int64{4}, onGPU(3, 80, 1))},
			units:   []uint64{4},
			wantErr: allocate.ErrNoMatch, wantText: []string{"no GPU 3"},
		},
		{
			name:    "container larger than its GPU",
			gpus:    []uint64{15, 80},
			pods:    []*corev1.Pod{pod("a", []int64{16}, onGPU(0, 15, 1))},
			units:   []uint64{16},
			wantErr: allocate.ErrNoMatch, wantText: []string{"more than GPU 0's 15"},
		},
		{
			name: "allocation disagreeing with the request",
			gpus: []uint64{80},
			pods: []*corev1.Pod{pod("a", []int64{4}, annotate(gpushare.AnnotationAllocation, `{"0":{"0":3}}`),
				annotate(gpushare.AnnotationGPUIndex, "0"))},
			units:   []uint64{4},
			wantErr: allocate.ErrNoMatch, wantText: []string{"gives 3 units"},
		},
		{
			name:    "invalid request quantity",
			gpus:    []uint64{80},
			pods:    []*corev1.Pod{pod("a", []int64{-4}, onGPU(0, 80, 1))},
			units:   []uint64{4},
			wantErr: allocate.ErrNoMatch,
		},
		{
			name:  "no assume time: creation time orders, then name",
			gpus:  []uint64{80},
			pods:  []*corev1.Pod{pod("z", []int64{4}, created(1)), pod("y", []int64{4}, created(2)), pod("x", []int64{4}, created(2))},
			units: []uint64{4},
			want:  []want{{"z", "c0", env(0, 4, 4, 80), nil}},
		},
		{
			name:   "isolation off on the node reaches the env",
			gpus:   []uint64{80},
			pods:   []*corev1.Pod{pod("a", []int64{4}, onGPU(0, 80, 1))},
			isoOff: true, units: []uint64{4},
			want: []want{{"a", "c0", gpushare.ContainerEnv{GPUIndex: 0, PodUnits: 4, ContainerUnits: 4, DevUnits: 80, DisableIsolation: true}, nil}},
		},
		{
			name:    "a second request in the call that matches nobody fails the whole call",
			gpus:    []uint64{80},
			pods:    []*corev1.Pod{pod("a", []int64{4}, onGPU(0, 80, 1))},
			units:   []uint64{4, 4},
			wantErr: allocate.ErrNoMatch,
		},
		{name: "zero devices", gpus: []uint64{80}, units: []uint64{0}, wantErr: allocate.ErrInvalidRequest},
		{name: "no requests", gpus: []uint64{80}, units: nil, wantErr: allocate.ErrInvalidRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := allocate.Input{Node: node, Inventory: inv(t, tt.gpus...), DisableIsolation: tt.isoOff, Pods: tt.pods, Served: tt.served}
			var servedBefore string
			if tt.served != nil {
				servedBefore = fmt.Sprint(tt.served)
			}
			got, err := allocate.Match(in, tt.units)
			if tt.served != nil && fmt.Sprint(tt.served) != servedBefore {
				t.Errorf("Match modified Input.Served")
			}
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) || got != nil {
					t.Fatalf("Match = %v, %v; want error %v", got, err, tt.wantErr)
				}
				for _, s := range tt.wantText {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q does not mention %q", err, s)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("Match error: %v", err)
			}
			var gotW []want
			for _, d := range got {
				gotW = append(gotW, want{d.Pod.Name, d.Container.Name, d.Env, d.Conflicts})
			}
			if !reflect.DeepEqual(gotW, tt.want) {
				t.Errorf("Match = %+v; want %+v", gotW, tt.want)
			}
		})
	}
}

func TestMatchWithoutInventory(t *testing.T) {
	if _, err := allocate.Match(allocate.Input{}, []uint64{1}); !errors.Is(err, allocate.ErrInvalidRequest) {
		t.Errorf("Match without inventory = %v; want ErrInvalidRequest", err)
	}
}

// Serving every container in turn, as the kubelet does, gives each pod
// exactly the GPU its annotations name when the extender's rule holds, in
// whichever order the pods' calls arrive.
func TestMatchServesEveryContainerOnce(t *testing.T) {
	in := allocate.Input{Node: node, Inventory: inv(t, 80, 80), Served: allocate.Served{}}
	for i := range 6 {
		gpu := i % 2
		size := int64(4 + gpu) // one size per GPU keeps signatures equal
		in.Pods = append(in.Pods, pod(fmt.Sprintf("p%d", i), []int64{size}, onGPU(gpu, 80, int64(i))))
	}
	got := map[string]int{}
	for _, size := range []uint64{5, 4, 4, 5, 4, 5} {
		ds, err := allocate.Match(in, []uint64{size})
		if err != nil {
			t.Fatal(err)
		}
		d := ds[0]
		if len(d.Conflicts) > 0 || d.Env.GPUIndex != int(size-4) {
			t.Fatalf("call for %d: %+v", size, d)
		}
		in.Served.Add(d.Pod.UID, d.Container.Name, d.Env)
		got[d.Pod.Name]++
	}
	if len(got) != 6 {
		t.Errorf("served %v; want each of 6 pods once", got)
	}
	if _, err := allocate.Match(in, []uint64{4}); !errors.Is(err, allocate.ErrNoMatch) {
		t.Errorf("a seventh call = %v; want ErrNoMatch", err)
	}
}
