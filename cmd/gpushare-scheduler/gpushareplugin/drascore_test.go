package gpushareplugin

import (
	"context"
	"fmt"
	"reflect"
	"testing"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/structured"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/utils/ptr"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/plugin/dra/slice"
	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/webhook/translate"
)

// fakeDRA is the part of the scheduler's DRA manager the score reads.
type fakeDRA struct {
	fwk.SharedDRAManager
	claims map[string]*resourceapi.ResourceClaim
	slices []*resourceapi.ResourceSlice
	state  *structured.AllocatedState
}

type fakeClaims struct {
	fwk.ResourceClaimTracker
	d *fakeDRA
}

type fakeSlices struct{ d *fakeDRA }

func (d *fakeDRA) ResourceClaims() fwk.ResourceClaimTracker { return fakeClaims{d: d} }
func (d *fakeDRA) ResourceSlices() fwk.ResourceSliceLister  { return fakeSlices{d: d} }
func (s fakeSlices) ListWithDeviceTaintRules() ([]*resourceapi.ResourceSlice, error) {
	return s.d.slices, nil
}
func (c fakeClaims) GatherAllocatedState() (*structured.AllocatedState, error) { return c.d.state, nil }
func (c fakeClaims) Get(ns, name string) (*resourceapi.ResourceClaim, error) {
	if rc, ok := c.d.claims[ns+"/"+name]; ok {
		return rc, nil
	}
	return nil, fmt.Errorf("claim %s/%s not found", ns, name)
}

// draSlice publishes one 80 GiB GPU for node name.
func draSlice(node string) *resourceapi.ResourceSlice {
	return &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: node + "-slice"}, Spec: resourceapi.ResourceSliceSpec{
		Driver: gpushare.DRADriverName, NodeName: ptr.To(node), Pool: resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
		Devices: []resourceapi.Device{{Name: "gpu-0", Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			gpushare.DRACapacityMemory: {Value: resource.MustParse("80Gi")}}}}}}
}

// A pod whose claim asks the gpushare driver for 8 GiB is scored by where
// the allocator will put it: under bestfit the node whose GPU already holds
// 60 GiB above the empty one, under spread the reverse. A pod without such
// a claim, or whose claim is not created yet, is not scored.
func TestScoreDRAClaims(t *testing.T) {
	tmpl := translate.Shape{MiB: []uint64{8192}, Count: 1}.Template("default")
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default"}, Spec: corev1.PodSpec{
		ResourceClaims: []corev1.PodResourceClaim{{Name: gpushare.DRAPodClaimName, ResourceClaimTemplateName: ptr.To(tmpl.Name)}}},
		Status: corev1.PodStatus{ResourceClaimStatuses: []corev1.PodResourceClaimStatus{{Name: gpushare.DRAPodClaimName, ResourceClaimName: ptr.To("p-claim")}}}}
	state := &structured.AllocatedState{AllocatedDevices: sets.New[structured.DeviceID](), AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity: structured.NewConsumedCapacityCollection()}
	state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(structured.MakeDeviceID(gpushare.DRADriverName, "full", "gpu-0"),
		map[resourceapi.QualifiedName]resource.Quantity{gpushare.DRACapacityMemory: resource.MustParse("60Gi")}))
	dra := &fakeDRA{claims: map[string]*resourceapi.ResourceClaim{"default/p-claim": {Spec: tmpl.Spec.Spec}},
		slices: []*resourceapi.ResourceSlice{draSlice("full"), draSlice("empty")}, state: state}
	var nodes []fwk.NodeInfo
	for _, name := range []string{"full", "empty"} {
		info := framework.NewNodeInfo()
		info.SetNode(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
		nodes = append(nodes, info)
	}
	scores := func(p *Plugin, pod *corev1.Pod) (map[string]int64, *fwk.Status) {
		cs := framework.NewCycleState()
		if s := p.PreScore(context.Background(), cs, pod, nodes); !s.IsSuccess() {
			return nil, s
		}
		out := map[string]int64{}
		for _, n := range nodes {
			v, s := p.Score(context.Background(), cs, pod, n)
			if !s.IsSuccess() {
				t.Fatal(s)
			}
			out[n.Node().Name] = v
		}
		return out, nil
	}
	for _, tc := range []struct {
		policy allocator.Policy
		fuller bool
	}{{allocator.BestFit, true}, {allocator.Spread, false}} {
		p := &Plugin{policy: tc.policy, log: zap.NewNop(), dra: dra}
		got, s := scores(p, pod)
		if s != nil {
			t.Fatalf("%v: PreScore %v", tc.policy, s)
		}
		if (got["full"] > got["empty"]) != tc.fuller || got["full"] == got["empty"] {
			t.Errorf("%v: scores %v", tc.policy, got)
		}
	}
	p := &Plugin{policy: allocator.BestFit, log: zap.NewNop(), dra: dra}
	plain := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "plain", Namespace: "default"}}
	pending := pod.DeepCopy()
	pending.Status.ResourceClaimStatuses = nil
	for name, pod := range map[string]*corev1.Pod{"no claim": plain, "claim not made yet": pending} {
		if _, s := scores(p, pod); s.Code() != fwk.Skip {
			t.Errorf("%s: PreScore %v, want Skip", name, s)
		}
	}
	if _, s := scores(&Plugin{policy: allocator.BestFit, log: zap.NewNop()}, pod); s.Code() != fwk.Skip {
		t.Errorf("without DRA: PreScore %v, want Skip", s)
	}

	// A slice the driver replaces (a new object: the empty node's GPU now publishes 8 GiB) is read
	// anew, and the cache keeps only the slices listed.
	before, _ := scores(p, pod)
	small := draSlice("empty")
	small.Spec.Devices[0].Capacity[gpushare.DRACapacityMemory] = resourceapi.DeviceCapacity{Value: resource.MustParse("8Gi")}
	dra.slices = []*resourceapi.ResourceSlice{dra.slices[0], small}
	after, _ := scores(p, pod)
	if after["empty"] != 100 || before["empty"] == 100 {
		t.Errorf("the replaced slice: score %d before, %d after; want 100 (the 8 GiB claim fills the new 8 GiB GPU)", before["empty"], after["empty"])
	}
	if len(p.slices.m) != 2 || p.slices.m[small].devs == nil {
		t.Errorf("the cache holds %d slices, the new one %v", len(p.slices.m), p.slices.m[small].devs)
	}
	// The same list again keeps the grouping; another driver's slice beside ours rebuilds it.
	grouped := reflect.ValueOf(p.slices.byNode).Pointer()
	if scores(p, pod); reflect.ValueOf(p.slices.byNode).Pointer() != grouped {
		t.Error("an unchanged list of slices was grouped again")
	}
	other := draSlice("empty")
	other.Name, other.Spec.Driver = "nic", "nic.example.com"
	dra.slices = append(dra.slices, other)
	if scores(p, pod); reflect.ValueOf(p.slices.byNode).Pointer() == grouped || len(p.slices.listed) != 3 || len(p.slices.m) != 2 {
		t.Errorf("a new slice of another driver: listed %d, ours %d; want the list rebuilt, 3 listed, 2 ours", len(p.slices.listed), len(p.slices.m))
	}
}

// draBench is nodes DRA nodes of 8 × 80 GiB GPUs as the driver publishes them (plugin/dra/slice),
// two 4-GPU NVLink domains each, every GPU holding 20 GiB of claims, and a pod of one 8 GiB claim.
func draBench(b *testing.B, nodes int) (*Plugin, *corev1.Pod, []fwk.NodeInfo) {
	b.Helper()
	state := &structured.AllocatedState{AllocatedDevices: sets.New[structured.DeviceID](), AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity: structured.NewConsumedCapacityCollection()}
	dra := &fakeDRA{claims: map[string]*resourceapi.ResourceClaim{}, state: state}
	infos := make([]fwk.NodeInfo, nodes)
	for i := range nodes {
		name := fmt.Sprintf("node-%05d", i)
		gpus := make([]slice.GPU, 8)
		for g := range gpus {
			gpus[g] = slice.GPU{Index: g, UUID: fmt.Sprintf("GPU-%08x-0000-4000-8000-%012x", i, g), Model: "NVIDIA H100 80GB HBM3", MemoryMiB: 80 << 10,
				NUMANode: g / 4, NVLinkDomain: fmt.Sprintf("%s-nv%d", name, g/4), Tier: gpushare.IsolationNone}
		}
		devs, err := slice.Devices(gpus, gpushare.GiB)
		if err != nil {
			b.Fatal(err)
		}
		dra.slices = append(dra.slices, &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: name + "-slice"}, Spec: resourceapi.ResourceSliceSpec{
			Driver: gpushare.DRADriverName, NodeName: ptr.To(name), Pool: resourceapi.ResourcePool{Name: name, Generation: 1, ResourceSliceCount: 1}, Devices: devs}})
		for _, d := range devs {
			state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(structured.MakeDeviceID(gpushare.DRADriverName, name, d.Name),
				map[resourceapi.QualifiedName]resource.Quantity{gpushare.DRACapacityMemory: resource.MustParse("20Gi")}))
		}
		infos[i] = framework.NewNodeInfo()
		infos[i].SetNode(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
	}
	tmpl := translate.Shape{MiB: []uint64{8192}, Count: 1}.Template("default")
	dra.claims["default/p-claim"] = &resourceapi.ResourceClaim{Spec: tmpl.Spec.Spec}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default"}, Spec: corev1.PodSpec{
		ResourceClaims: []corev1.PodResourceClaim{{Name: gpushare.DRAPodClaimName, ResourceClaimTemplateName: ptr.To(tmpl.Name)}}},
		Status: corev1.PodStatus{ResourceClaimStatuses: []corev1.PodResourceClaimStatus{{Name: gpushare.DRAPodClaimName, ResourceClaimName: ptr.To("p-claim")}}}}
	return &Plugin{policy: allocator.BestFit, log: zap.NewNop(), dra: dra}, pod, infos
}

// BenchmarkScoreDRA is one DRA pod's PreScore and Score over every node: what the DRA score adds
// to kube-scheduler's work per pod.
func BenchmarkScoreDRA(b *testing.B) {
	for _, nodes := range []int{100, 1000} {
		b.Run(fmt.Sprintf("nodes=%d", nodes), func(b *testing.B) {
			p, pod, infos := draBench(b, nodes)
			ctx := context.Background()
			for b.Loop() {
				cs := framework.NewCycleState()
				if s := p.PreScore(ctx, cs, pod, infos); !s.IsSuccess() {
					b.Fatal(s)
				}
				for _, n := range infos {
					if _, s := p.Score(ctx, cs, pod, n); !s.IsSuccess() {
						b.Fatal(s)
					}
				}
			}
		})
	}
}
