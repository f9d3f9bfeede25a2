package collect_test

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpushare/gpushare/inspector/collect"
	"github.com/gpushare/gpushare/inspector/internal/fixture"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

// draReport builds the shared DRA cluster (fixture.DRACluster).
func draReport(t *testing.T) *collect.Report {
	t.Helper()
	nodes, pods, slices, claims := fixture.DRACluster()
	return collect.BuildObjects(collect.Objects{Nodes: nodes, Pods: pods, Slices: slices, Claims: claims})
}

// node returns the report's node called name.
func node(t *testing.T, r *collect.Report, name string) collect.Node {
	t.Helper()
	for _, n := range r.Nodes {
		if n.Name == name {
			return n
		}
	}
	t.Fatalf("no node %s in %+v", name, r.Nodes)
	return collect.Node{}
}

// A DRA node's GPUs come from its slice, in the driver's unit (GiB: an
// H100's 81,559 MiB is 79), its charges from the allocated claims, health
// from the taint; a device-plugin node beside it counts as before.
func TestDRANodeFromSliceAndClaims(t *testing.T) {
	r := draReport(t)
	if len(r.Skipped) != 0 {
		t.Errorf("skipped %v", r.Skipped)
	}
	n := node(t, r, "dra-0")
	if n.Mode != collect.ModeDRA || n.GPUSizes != collect.SizesPublished || n.Total != 8*79 || n.Address != "10.7.0.1" {
		t.Fatalf("node %s mode %q sizes %q total %d", n.Name, n.Mode, n.GPUSizes, n.Total)
	}
	want := []uint64{11, 16, 16, 8, 79, 0, 4, 0}
	for i, g := range n.GPUs {
		if g.Index != i || g.Total != 79 || g.Allocated != want[i] || !g.Known || g.UUID != fixture.DRAUUID(i) ||
			g.Model != "NVIDIA H100 80GB HBM3" || g.Isolation != "none" {
			t.Errorf("GPU %+v; want index %d, 79 total, %d allocated", g, i, want[i])
		}
		if g.Healthy != (i != 5) {
			t.Errorf("GPU%d healthy %v", i, g.Healthy)
		}
	}
	if g := n.GPUs[5]; g.Reason != "fatal-xid-48, NoSchedule" {
		t.Errorf("GPU5 reason %q", g.Reason)
	}
	// The shared claim counts once; the orphan counts though no pod uses it.
	if n.Allocated != 134 || n.AllocatedPercent != 21 || n.Pending != 0 {
		t.Errorf("allocated %d (%d%%), pending %d; want 134 (21%%), 0", n.Allocated, n.AllocatedPercent, n.Pending)
	}
	if dp := node(t, r, "dp-0"); dp.Mode != "" || dp.Claims != nil || dp.Allocated != 5 || dp.Total != 30 {
		t.Errorf("device-plugin node %+v", dp)
	}
	if r.Unit != "GiB" || r.Total != 632+30 || r.Allocated != 139 {
		t.Errorf("cluster %d/%d %s; want 139/662 GiB", r.Allocated, r.Total, r.Unit)
	}
}

// Every allocated claim on the node is listed with its shares and the pods
// reserving it; a claim two pods share shows in both, charged once.
func TestDRAClaimsAndPods(t *testing.T) {
	n := node(t, draReport(t), "dra-0")
	var claims []string
	for _, c := range n.Claims {
		claims = append(claims, fmt.Sprintf("%s/%s=%d%v", c.Namespace, c.Name, c.Units, c.Pods))
	}
	want := "default/tiny-gpu=1[default/tiny] ml/big=79[ml/big] ml/cache=8[ml/reader-a ml/reader-b] ml/infer-gpu=10[ml/infer] ml/orphan=4[] ml/train-gpu=32[ml/train]"
	if got := strings.Join(claims, " "); got != want {
		t.Errorf("claims %s\nwant   %s", got, want)
	}
	var pods []string
	for _, p := range n.Pods {
		pods = append(pods, fmt.Sprintf("%s/%s=%d%v", p.Namespace, p.Name, p.Units, p.GPUs))
	}
	want = "default/tiny=1[{0 1}] ml/big=79[{4 79}] ml/infer=10[{0 10}] ml/reader-a=8[{3 8}] ml/reader-b=8[{3 8}] ml/train=32[{1 16} {2 16}]"
	if got := strings.Join(pods, " "); got != want {
		t.Errorf("pods %s\nwant %s", got, want)
	}
	train := n.Pods[5]
	c := train.Claims[0]
	if len(train.Claims) != 1 || c.Name != "train-gpu" || c.UID != "uid-train-gpu" || c.Pods != nil || len(c.Shares) != 2 ||
		c.Shares[1] != (collect.Share{Index: 2, Device: fixture.DRADevice(2), Request: "gpu", ShareID: "share-train-gpu-1", Units: 16}) {
		t.Errorf("train's claims %+v", train.Claims)
	}
	if len(train.Containers) != 2 {
		t.Fatalf("train's containers %+v", train.Containers)
	}
	for i, name := range []string{"warmup", "main"} {
		ct := train.Containers[i]
		if ct.Name != name || ct.Init != (i == 0) || ct.Units != 32 || *ct.GPU != 1 || fmt.Sprint(ct.GPUs) != "[1 2]" ||
			ct.UnitsPerGPU != 16 || ct.State != collect.StateAllocated || fmt.Sprint(ct.Claims) != "[train-gpu]" || ct.Env != nil {
			t.Errorf("container %+v", ct)
		}
	}
}

// A container naming one request of a claim holds only that request's shares.
func TestDRAContainerRequest(t *testing.T) {
	p := fixture.Pod("ml", "p", "n", fixture.Container("a", 0), fixture.Container("b", 0))
	fixture.UseClaim(&p, &p.Spec.Containers[0], "two", "small")
	fixture.UseClaim(&p, &p.Spec.Containers[1], "two", "large")
	claim := fixture.Claim("ml", "two", "n", gpushare.GiB, []fixture.ClaimShare{{GPU: 0, Units: 2, Request: "small"}, {GPU: 1, Units: 6, Request: "large/h100"}}, p)
	r := collect.BuildObjects(collect.Objects{Nodes: []corev1.Node{fixture.Node("n", "", 0, 0)}, Pods: []corev1.Pod{p},
		Slices: []resourceapi.ResourceSlice{fixture.Slice("n", gpushare.GiB, fixture.H100(0), fixture.H100(1))}, Claims: []resourceapi.ResourceClaim{claim}})
	got := r.Nodes[0].Pods[0].Containers
	if len(got) != 2 || got[0].Units != 2 || *got[0].GPU != 0 || got[1].Units != 6 || *got[1].GPU != 1 || got[1].GPUs != nil {
		t.Errorf("containers %+v; want a 2 on GPU 0, b 6 on GPU 1", got)
	}
}

// A DRA node counts in its driver's unit (one unit is the capacity's
// validRange.min); beside a GiB node the report is in MiB, every figure
// converted, claims included.
func TestDRAUnits(t *testing.T) {
	q := gpushare.Unit(256)
	p := fixture.ClaimPod("ml", "p", "q", "c")
	claim := fixture.Claim("ml", "c", "q", q, []fixture.ClaimShare{{GPU: 0, Units: 3}}, p)
	objects := collect.Objects{Nodes: []corev1.Node{fixture.Node("q", "", 0, 0)}, Pods: []corev1.Pod{p},
		Slices: []resourceapi.ResourceSlice{fixture.Slice("q", q, fixture.H100(0))}, Claims: []resourceapi.ResourceClaim{claim}}
	r := collect.BuildObjects(objects)
	if n := r.Nodes[0]; r.Unit != "256MiB" || n.Total != 81559/256 || n.Allocated != 3 || n.Claims[0].Shares[0].Units != 3 {
		t.Errorf("unit %s, node %+v; want 256MiB, %d total, 3 allocated", r.Unit, n, 81559/256)
	}
	objects.Nodes = append(objects.Nodes, fixture.Node("old", "", 15, 1))
	r = collect.BuildObjects(objects)
	n := node(t, r, "q")
	if r.Unit != "MiB" || n.Total != 81559/256*256 || n.Allocated != 768 || n.Claims[0].Units != 768 ||
		n.Claims[0].Shares[0].Units != 768 || n.Pods[0].Claims[0].Units != 768 || n.Pods[0].Claims[0].Shares[0].Units != 768 ||
		n.Pods[0].Units != 768 || n.Pods[0].Containers[0].Units != 768 {
		t.Errorf("unit %s, node %+v; want MiB, each figure ×256", r.Unit, n)
	}
}

// Without a request policy the unit is GiB when every GPU is whole GiB,
// else MiB.
func TestDRAUnitWithoutPolicy(t *testing.T) {
	for _, tc := range []struct {
		mib  int64
		want string
	}{{80 * 1024, "GiB"}, {81559, "MiB"}} {
		s := fixture.Slice("n", gpushare.GiB, fixture.H100(0))
		c := s.Spec.Devices[0].Capacity[gpushare.DRACapacityMemory]
		c.RequestPolicy, c.Value = nil, *resource.NewQuantity(tc.mib<<20, resource.BinarySI)
		s.Spec.Devices[0].Capacity[gpushare.DRACapacityMemory] = c
		r := collect.BuildObjects(collect.Objects{Nodes: []corev1.Node{fixture.Node("n", "", 0, 0)}, Slices: []resourceapi.ResourceSlice{s}})
		if r.Unit != tc.want {
			t.Errorf("%d MiB without a policy: unit %s, want %s", tc.mib, r.Unit, tc.want)
		}
	}
}

// Only our driver's newest generation of each pool counts; other drivers'
// slices, slices of unlisted nodes and pods of other nodes do not.
func TestDRASliceSelection(t *testing.T) {
	old := fixture.Slice("n", gpushare.GiB, fixture.H100(0), fixture.H100(1), fixture.H100(2))
	cur := fixture.Slice("n", gpushare.GiB, fixture.H100(0), fixture.H100(1))
	cur.Spec.Pool.Generation = 2
	other := fixture.Slice("n", gpushare.GiB, fixture.H100(3))
	other.Spec.Driver = "gpu.nvidia.com"
	gone := fixture.Slice("gone", gpushare.GiB, fixture.H100(0))
	r := collect.BuildObjects(collect.Objects{Nodes: []corev1.Node{fixture.Node("n", "", 0, 0), fixture.Node("cpu", "", 0, 0)},
		Slices: []resourceapi.ResourceSlice{old, cur, other, gone}})
	if len(r.Nodes) != 1 || len(r.Nodes[0].GPUs) != 2 || r.Nodes[0].Total != 158 {
		t.Errorf("nodes %+v; want n with the 2 GPUs of generation 2", r.Nodes)
	}
	empty := fixture.Slice("cpu", gpushare.GiB)
	if !collect.IsDRANode("cpu", []resourceapi.ResourceSlice{empty}) || collect.IsDRANode("n", []resourceapi.ResourceSlice{other}) {
		t.Error("IsDRANode: an empty slice of ours makes a DRA node, another driver's does not")
	}
}

// What the driver would refuse is still shown, and named: a result on a
// device the slice does not publish (not counted), one without consumed
// memory (the whole GPU), one of a fraction of a unit (rounded up); a
// device without an index is left out; a node with allocatable gpu-mem
// and a slice is shown as DRA, with a note.
func TestDRAOddObjectsAreNamed(t *testing.T) {
	noIndex := fixture.H100(3)
	s := fixture.Slice("n", gpushare.GiB, fixture.H100(0), fixture.H100(1), noIndex)
	delete(s.Spec.Devices[2].Attributes, gpushare.DRAAttributeIndex)
	p := fixture.ClaimPod("ml", "p", "n", "whole", "half", "lost")
	whole := fixture.Claim("ml", "whole", "n", gpushare.GiB, []fixture.ClaimShare{{GPU: 0, Units: 1}}, p)
	delete(whole.Status.Allocation.Devices.Results[0].ConsumedCapacity, gpushare.DRACapacityMemory)
	half := fixture.Claim("ml", "half", "n", gpushare.GiB, []fixture.ClaimShare{{GPU: 1, Units: 1}}, p)
	half.Status.Allocation.Devices.Results[0].ConsumedCapacity[gpushare.DRACapacityMemory] = resource.MustParse("1536Mi")
	lost := fixture.Claim("ml", "lost", "n", gpushare.GiB, []fixture.ClaimShare{{GPU: 7, Units: 4}}, p)
	r := collect.BuildObjects(collect.Objects{Nodes: []corev1.Node{fixture.Node("n", "", 30, 2)}, Pods: []corev1.Pod{p},
		Slices: []resourceapi.ResourceSlice{s}, Claims: []resourceapi.ResourceClaim{whole, half, lost}})
	var got []string
	for _, sk := range r.Skipped {
		got = append(got, sk.String())
	}
	for _, want := range []string{
		"node n: has both allocatable aliyun.com/gpu-mem and a ResourceSlice of gpu-mem.gpushare.io",
		"node n: device " + fixture.DRADevice(3) + ` not shown: no "index" attribute`,
		"claim ml/half: device " + fixture.DRADevice(1) + ": consumed memory 1536Mi is not a whole number of GiB: counted as 2",
		"claim ml/lost: device " + fixture.DRADevice(7) + " is not in the node's ResourceSlice",
		"claim ml/whole: device " + fixture.DRADevice(0) + ": no consumed memory",
	} {
		if !strings.Contains(strings.Join(got, "\n"), want) {
			t.Errorf("skipped:\n%s\nwant a line with %q", strings.Join(got, "\n"), want)
		}
	}
	n := r.Nodes[0]
	if n.Mode != collect.ModeDRA || len(n.GPUs) != 2 || n.GPUs[0].Allocated != 79 || n.GPUs[1].Allocated != 2 || n.Allocated != 81 {
		t.Errorf("node %+v; want 79 on GPU 0, 2 on GPU 1", n)
	}
}

// A reservation names the pod by UID too: a pod recreated under the same
// name does not inherit the claim; a pod on another node is not listed.
func TestDRAReservationMatchesUID(t *testing.T) {
	p := fixture.ClaimPod("ml", "p", "n", "c")
	claim := fixture.Claim("ml", "c", "n", gpushare.GiB, []fixture.ClaimShare{{GPU: 0, Units: 4}}, p)
	p.UID = "recreated"
	r := collect.BuildObjects(collect.Objects{Nodes: []corev1.Node{fixture.Node("n", "", 0, 0)}, Pods: []corev1.Pod{p},
		Slices: []resourceapi.ResourceSlice{fixture.Slice("n", gpushare.GiB, fixture.H100(0))}, Claims: []resourceapi.ResourceClaim{claim}})
	if n := r.Nodes[0]; len(n.Pods) != 0 || n.Allocated != 4 || n.Claims[0].Pods != nil {
		t.Errorf("node %+v; want the claim charged, no pod", n)
	}
}
