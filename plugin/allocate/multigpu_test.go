package allocate_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpushare/gpushare/plugin/allocate"
	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/isolation"
)

// onSet annotates the pod as the extender does for a multi-GPU pod (issue
// 15): the index names the set's first GPU, the allocation lists every GPU
// of the set for every regular gpu-mem container, assumed at t0+at seconds.
func onSet(set gpushare.GPUSet, devUnits uint64, at int64) podOpt {
	return func(p *corev1.Pod) {
		reqs, err := gpushare.ContainerRequests(p)
		if err != nil {
			panic(err)
		}
		a := gpushare.PodAssignment{GPUIndex: set.First(), PodUnits: gpushare.PodUnits(reqs), DevUnits: devUnits,
			AssumeTime: t0.Add(time.Duration(at) * time.Second).UnixNano(), Allocation: gpushare.AllocationForSet(reqs, set)}
		ann, err := a.Encode()
		if err != nil {
			panic(err)
		}
		for k, v := range ann {
			p.Annotations[k] = v
		}
	}
}

// A 2-GPU pod's containers are each served on the pod's whole set, named by
// its first GPU, with the container's and the pod's totals.
func TestMatchMultiGPUPod(t *testing.T) {
	set := gpushare.NewGPUSet(1, 2)
	p := pod("multi", []int64{8, 4}, onSet(set, 20, 1))
	in := allocate.Input{Node: node, Inventory: inv(t, 16, 20, 24, 16), Pods: []*corev1.Pod{p}}
	ds, err := allocate.Match(in, []uint64{4, 8})
	if err != nil {
		t.Fatalf("Match = %v", err)
	}
	if len(ds) != 2 || ds[0].Container.Name != "c1" || ds[1].Container.Name != "c0" {
		t.Fatalf("Match = %+v; want c1 then c0 of multi", ds)
	}
	for _, d := range ds {
		want := gpushare.ContainerEnv{GPUIndex: 1, GPUs: set, PodUnits: 12, ContainerUnits: d.Container.Units, DevUnits: 20}
		if d.Pod != p || d.Env != want || len(d.Conflicts) != 0 {
			t.Errorf("%s: decision %+v; want env %+v and no conflicts", d.Container.Name, d, want)
		}
		m := d.Env.Map()
		if m[gpushare.EnvVisibleDevices] != "1,2" || m[gpushare.EnvGPUIndex] != "1,2" || m[gpushare.EnvGPUCount] != "2" {
			t.Errorf("%s: Map() = %v; want NVIDIA_VISIBLE_DEVICES and the index 1,2 and a count of 2", d.Container.Name, m)
		}
		if d.Env.Set() != set || d.Env.UnitsPerGPU() != d.Container.Units/2 {
			t.Errorf("%s: Set() = %v, UnitsPerGPU() = %d", d.Container.Name, d.Env.Set(), d.Env.UnitsPerGPU())
		}
	}
	if ds[0].Env.ContainerUnits != 4 || ds[1].Env.ContainerUnits != 8 {
		t.Errorf("container units %d, %d; want 4, 8", ds[0].Env.ContainerUnits, ds[1].Env.ContainerUnits)
	}
}

// An init container, which the allocation cannot name, runs on the pod's set.
func TestMatchMultiGPUInitContainer(t *testing.T) {
	set := gpushare.NewGPUSet(1, 2)
	p := pod("multi", []int64{8, 4}, initCtr("setup", 6), onSet(set, 16, 1))
	ds, err := allocate.Match(allocate.Input{Node: node, Inventory: inv(t, 16, 16, 16, 16), Pods: []*corev1.Pod{p}}, []uint64{6})
	want := gpushare.ContainerEnv{GPUIndex: 1, GPUs: set, PodUnits: 12, ContainerUnits: 6, DevUnits: 16}
	if err != nil || len(ds) != 1 || ds[0].Container.Name != "setup" || !ds[0].Container.Init || ds[0].Env != want {
		t.Fatalf("Match = %+v, %v; want setup with %+v", ds, err, want)
	}
	if m := ds[0].Env.Map(); m[gpushare.EnvVisibleDevices] != "1,2" || m[gpushare.EnvGPUCount] != "2" {
		t.Errorf("init container's Map() = %v", m)
	}
}

// A multi-GPU pod that cannot be served is skipped, and the refusal says why.
func TestMatchMultiGPUSkips(t *testing.T) {
	for _, tt := range []struct {
		name  string
		gpus  []uint64
		tiers map[int]isolation.Status
		pod   *corev1.Pod
		units uint64
		text  string
	}{
		{"per-GPU share larger than one GPU of the set", []uint64{80, 80, 6}, nil,
			pod("p", []int64{16}, onSet(gpushare.NewGPUSet(1, 2), 80, 1)), 16,
			`container "c0" asks for 8 units, more than GPU 2's 6`},
		{"a set mixing isolation tiers", []uint64{80, 80, 80}, map[int]isolation.Status{0: upNone, 1: upMPS, 2: upHAMi},
			pod("p", []int64{8}, onSet(gpushare.NewGPUSet(1, 2), 80, 1)), 8,
			`its GPUs 1,2 are configured for different isolation tiers (GPU 1 "mps", GPU 2 "hami-core")`},
		{"a set where only one GPU has a tier", []uint64{80, 80, 80}, map[int]isolation.Status{1: upMPS},
			pod("p", []int64{8}, onSet(gpushare.NewGPUSet(1, 2), 80, 1)), 8,
			"different isolation tiers"},
	} {
		ds, err := allocate.Match(allocate.Input{Node: node, Inventory: inv(t, tt.gpus...), Pods: []*corev1.Pod{tt.pod}, Isolation: tt.tiers}, []uint64{tt.units})
		var nm *allocate.NoMatchError
		if ds != nil || !errors.As(err, &nm) || len(nm.Skipped) != 1 || nm.Skipped[0].Pod != "default/p" || !strings.Contains(nm.Skipped[0].Reason, tt.text) {
			t.Errorf("%s: Match = %+v, %v; want default/p skipped with %q", tt.name, ds, err, tt.text)
		}
	}
	// The same set with equal tiers is served, with the tier.
	p := pod("p", []int64{8}, onSet(gpushare.NewGPUSet(1, 2), 80, 1))
	ds, err := allocate.Match(allocate.Input{Node: node, Inventory: inv(t, 80, 80, 80), Pods: []*corev1.Pod{p},
		Isolation: map[int]isolation.Status{0: upNone, 1: upMPS, 2: upMPS}}, []uint64{8})
	if err != nil || len(ds) != 1 || ds[0].Env.Isolation != gpushare.IsolationMPS || ds[0].Env.GPUs != gpushare.NewGPUSet(1, 2) {
		t.Errorf("equal tiers: Match = %+v, %v; want an mps answer on 1,2", ds, err)
	}
}

// A set including a GPU whose tier is down is refused, naming that GPU,
// even when it is not the set's first.
func TestMatchMultiGPUTierDown(t *testing.T) {
	p := pod("p", []int64{8, 4}, onSet(gpushare.NewGPUSet(1, 2), 80, 1))
	in := allocate.Input{Node: node, Inventory: inv(t, 80, 80, 80), Pods: []*corev1.Pod{p},
		Isolation: map[int]isolation.Status{0: upMPS, 1: upMPS, 2: downMP}}
	ds, err := allocate.Match(in, []uint64{8})
	var down *allocate.IsolationDownError
	if ds != nil || !errors.As(err, &down) || down.GPU != 2 || down.Container != "default/p/c0" ||
		!strings.Contains(err.Error(), `GPU 2 of node "n1" is configured for isolation tier "mps", which is down`) {
		t.Fatalf("Match = %+v, %v; want an *IsolationDownError for GPU 2", ds, err)
	}
	// With GPU 2 up the same call is answered: the refusal was GPU 2's.
	in.Isolation = map[int]isolation.Status{0: upMPS, 1: upMPS, 2: upMPS}
	if ds, err := allocate.Match(in, []uint64{8}); err != nil || len(ds) != 1 {
		t.Errorf("all up: Match = %+v, %v", ds, err)
	}
}

// A multi-GPU decision is refused when any GPU of its set is over-committed,
// and the refusal names that GPU.
func TestMatchMultiGPUOvercommit(t *testing.T) {
	assigned := annotate(gpushare.AnnotationAssigned, "true")
	for _, tt := range []struct {
		name    string
		holder  *corev1.Pod
		wantGPU int // -1: answered
	}{
		{"second GPU of the set full", pod("holder", []int64{14}, onGPU(2, 16, 0), assigned), 2},
		{"first GPU of the set full", pod("holder", []int64{11}, onGPU(1, 16, 0), assigned), 1},
		{"exactly full", pod("holder", []int64{10}, onGPU(2, 16, 0), assigned), -1},
		{"a GPU outside the set full", pod("holder", []int64{16}, onGPU(3, 16, 0), assigned, func(p *corev1.Pod) {
			p.Spec.Containers = append(p.Spec.Containers, ctr("extra", 4))
			p.Annotations[gpushare.AnnotationAllocation] = `{"0":{"3":16},"1":{"3":4}}`
			p.Annotations[gpushare.AnnotationPodUnits] = "20"
		}), -1},
	} {
		multi := pod("multi", []int64{8, 4}, onSet(gpushare.NewGPUSet(1, 2), 16, 1))
		in := allocate.Input{Node: node, Inventory: inv(t, 16, 16, 16, 16), Pods: []*corev1.Pod{tt.holder, multi}}
		ds, err := allocate.Match(in, []uint64{8})
		var oc *allocate.OvercommitError
		if tt.wantGPU < 0 {
			if err != nil || len(ds) != 1 || ds[0].Pod != multi {
				t.Errorf("%s: Match = %+v, %v; want multi answered", tt.name, ds, err)
			}
			continue
		}
		if ds != nil || !errors.As(err, &oc) || !errors.Is(err, allocate.ErrOvercommit) || oc.GPU != tt.wantGPU ||
			oc.Container != "default/multi/c0" || !strings.Contains(err.Error(), "default/multi=6") {
			t.Errorf("%s: Match = %+v, %v; want an *OvercommitError for GPU %d naming default/multi=6", tt.name, ds, err, tt.wantGPU)
		}
	}
}

// The signature includes the GPU set: a single-GPU pod and a multi-GPU pod
// with equal container sizes, pod totals, first GPU and GPU sizes conflict.
func TestMatchMultiGPUSetIsPartOfTheSignature(t *testing.T) {
	for _, tt := range []struct {
		name           string
		singleAt, mAt  int64
		first, another string
	}{
		{"single-GPU pod older", 1, 2, "single", "default/multi/c0"},
		{"multi-GPU pod older", 2, 1, "multi", "default/single/c0"},
	} {
		pods := []*corev1.Pod{
			pod("single", []int64{8}, onGPU(1, 80, tt.singleAt)),
			pod("multi", []int64{8}, onSet(gpushare.NewGPUSet(1, 2), 80, tt.mAt)),
		}
		ds, err := allocate.Match(allocate.Input{Node: node, Inventory: inv(t, 80, 80, 80), Pods: pods}, []uint64{8})
		if err != nil || len(ds) != 1 || ds[0].Pod.Name != tt.first || len(ds[0].Conflicts) != 1 || ds[0].Conflicts[0] != tt.another {
			t.Errorf("%s: Match = %+v, %v; want %s with a conflict naming %s", tt.name, ds, err, tt.first, tt.another)
		}
	}
	// Two multi-GPU pods on the same set share the signature: no conflict.
	pods := []*corev1.Pod{
		pod("m1", []int64{8}, onSet(gpushare.NewGPUSet(1, 2), 80, 1)),
		pod("m2", []int64{8}, onSet(gpushare.NewGPUSet(1, 2), 80, 2)),
	}
	ds, err := allocate.Match(allocate.Input{Node: node, Inventory: inv(t, 80, 80, 80), Pods: pods}, []uint64{8})
	if err != nil || len(ds) != 1 || ds[0].Pod.Name != "m1" || len(ds[0].Conflicts) != 0 {
		t.Errorf("same set: Match = %+v, %v; want m1 without conflicts", ds, err)
	}
	// Different sets with the same first GPU conflict too.
	pods[1] = pod("m2", []int64{8}, onSet(gpushare.NewGPUSet(1, 3), 80, 2))
	ds, err = allocate.Match(allocate.Input{Node: node, Inventory: inv(t, 80, 80, 80, 80), Pods: pods}, []uint64{8})
	if err != nil || len(ds) != 1 || ds[0].Pod.Name != "m1" || len(ds[0].Conflicts) != 1 || ds[0].Conflicts[0] != "default/m2/c0" {
		t.Errorf("sets 1,2 and 1,3: Match = %+v, %v; want m1 with a conflict naming m2", ds, err)
	}
}
