package drascore

import (
	"slices"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/webhook/translate"
)

const gib = int64(1) << 30

// gpus is a node of 80 GiB GPUs with the GiB used given, domain "a" for the
// first half and "b" for the rest.
func gpus(used ...int64) []Device {
	out := make([]Device, len(used))
	for i, u := range used {
		d := "a"
		if i >= len(used)/2 {
			d = "b"
		}
		out[i] = Device{Capacity: 80 * gib, Consumed: u * gib, Domain: d, Tier: gpushare.IsolationNone, Usable: true}
	}
	return out
}

func one(g int64) Claim { return Claim{Requests: []Request{{Bytes: g * gib, Count: 1}}} }

func TestPredict(t *testing.T) {
	tainted := gpus(0, 0)
	tainted[0].Usable = false
	mps := gpus(0, 0)
	mps[1].Tier = gpushare.IsolationMPS
	cases := []struct {
		name string
		devs []Device
		c    Claim
		want [][]int
	}{
		{"first fit, not best fit", gpus(10, 70, 0), one(8), [][]int{{0}}},
		{"skips a full GPU", gpus(75, 70, 0), one(8), [][]int{{1}}},
		{"skips a tainted GPU", tainted, one(8), [][]int{{1}}},
		{"tier selector", mps, Claim{Requests: []Request{{Bytes: gib, Count: 1, Tier: gpushare.IsolationMPS}}}, [][]int{{1}}},
		{"distinct GPUs within a request", gpus(0, 0, 0, 0), Claim{Requests: []Request{{Bytes: 8 * gib, Count: 2}}}, [][]int{{0, 1}}},
		{"requests share a GPU while it lasts", gpus(60, 0), Claim{Requests: []Request{{Bytes: 10 * gib, Count: 1}, {Bytes: 10 * gib, Count: 1}, {Bytes: 10 * gib, Count: 1}}},
			[][]int{{0}, {0}, {1}}},
		{"one GPU for every request", gpus(60, 0), Claim{Requests: []Request{{Bytes: 10 * gib, Count: 1}, {Bytes: 20 * gib, Count: 1}}, OneGPU: true}, [][]int{{1}, {1}}},
		{"one domain: the first where all fit", gpus(0, 79, 0, 0), Claim{Requests: []Request{{Bytes: 8 * gib, Count: 2}}, OneDomain: true}, [][]int{{2, 3}}},
		{"without the domain rule, across domains", gpus(0, 79, 0, 0), Claim{Requests: []Request{{Bytes: 8 * gib, Count: 2}}}, [][]int{{0, 2}}},
		{"preferred domain: the first where all fit", gpus(0, 79, 0, 0), Claim{Requests: []Request{{Bytes: 8 * gib, Count: 2}}, PreferDomain: true}, [][]int{{2, 3}}},
		{"preferred domain where none fits: any GPUs", gpus(0, 79, 79, 0), Claim{Requests: []Request{{Bytes: 8 * gib, Count: 2}}, PreferDomain: true}, [][]int{{0, 3}}},
		{"does not fit", gpus(75, 75), one(8), nil},
		{"not enough GPUs", gpus(0, 0), Claim{Requests: []Request{{Bytes: gib, Count: 3}}}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := Predict(tc.devs, tc.c)
			if ok != (tc.want != nil) || !slices.EqualFunc(got, tc.want, slices.Equal) {
				t.Fatalf("Predict = %v, %v; want %v", got, ok, tc.want)
			}
		})
	}
}

func TestScoreOrdersNodes(t *testing.T) {
	score := func(devs []Device, c Claim, p allocator.Policy) int64 {
		t.Helper()
		s, ok := Score(devs, c, p)
		if !ok {
			t.Fatalf("Score(%v) does not fit", c)
		}
		if s < 0 || s > MaxScore {
			t.Fatalf("score %d out of range", s)
		}
		return s
	}
	fuller, emptier := gpus(60, 0), gpus(20, 0)
	if a, b := score(fuller, one(8), allocator.BestFit), score(emptier, one(8), allocator.BestFit); a <= b {
		t.Errorf("bestfit: the fuller node scored %d, the emptier %d", a, b)
	}
	if a, b := score(fuller, one(8), allocator.Spread), score(emptier, one(8), allocator.Spread); a >= b {
		t.Errorf("spread: the fuller node scored %d, the emptier %d", a, b)
	}
	if a, b := score(fuller, one(8), allocator.FirstFit), score(emptier, one(8), allocator.FirstFit); a != b {
		t.Errorf("firstfit: %d and %d differ", a, b)
	}
	// The allocator takes GPU 0 on both nodes: the score is of that GPU,
	// not of a better one the allocator will not take.
	if a, b := score(gpus(10, 70), one(8), allocator.BestFit), score(gpus(40, 0), one(8), allocator.BestFit); a >= b {
		t.Errorf("bestfit scored the node by a GPU the allocator does not take: %d >= %d", a, b)
	}
	// Two GPUs: a node where the allocator's pair is on one NVLink domain
	// beats a fuller one where it is split.
	pair := Claim{Requests: []Request{{Bytes: 8 * gib, Count: 2}}}
	linked, split := gpus(0, 0, 0, 0), gpus(70, 79, 70, 0)
	if a, b := score(linked, pair, allocator.BestFit), score(split, pair, allocator.BestFit); a <= b {
		t.Errorf("a linked pair scored %d, a split fuller pair %d", a, b)
	}
	if _, ok := Score(gpus(79), one(8), allocator.BestFit); ok {
		t.Error("a claim that does not fit scored")
	}
}

// TestClaimOfReadsTheWebhooksTemplates: every shape the webhook makes is
// read back as the claim it asks for.
func TestClaimOfReadsTheWebhooksTemplates(t *testing.T) {
	cases := []struct {
		shape translate.Shape
		want  Claim
	}{
		{translate.Shape{MiB: []uint64{4096}, Count: 1}, Claim{Requests: []Request{{Bytes: 4 * gib, Count: 1, Tier: gpushare.IsolationAny}}}},
		{translate.Shape{MiB: []uint64{2048, 1024}, Count: 1, Isolation: gpushare.IsolationMPS},
			Claim{Requests: []Request{{Bytes: 2 * gib, Count: 1, Tier: gpushare.IsolationMPS}, {Bytes: gib, Count: 1, Tier: gpushare.IsolationMPS}}, OneGPU: true}},
		{translate.Shape{MiB: []uint64{8192}, Count: 4}, Claim{Requests: []Request{{Bytes: 8 * gib, Count: 4, Tier: gpushare.IsolationAny}}}},
		{translate.Shape{MiB: []uint64{8192, 512}, Count: 2, NVLink: true, Isolation: gpushare.IsolationHAMiCore},
			Claim{Requests: []Request{{Bytes: 8 * gib, Count: 2, Tier: gpushare.IsolationHAMiCore}, {Bytes: 512 << 20, Count: 2, Tier: gpushare.IsolationHAMiCore}}, OneDomain: true}},
		{translate.Shape{MiB: []uint64{8192}, Count: 4, PreferNVLink: true, Isolation: gpushare.IsolationNone},
			Claim{Requests: []Request{{Bytes: 8 * gib, Count: 4, Tier: gpushare.IsolationNone}}, PreferDomain: true}},
	}
	for _, tc := range cases {
		tmpl := tc.shape.Template("ns")
		got, ok := ClaimOf([]*resourceapi.ResourceClaim{{Spec: tmpl.Spec.Spec}})
		if !ok || !equalClaims(got, tc.want) {
			t.Errorf("%s: ClaimOf = %+v, %v; want %+v", tmpl.Name, got, ok, tc.want)
		}
	}
}

func equalClaims(a, b Claim) bool {
	return a.OneGPU == b.OneGPU && a.OneDomain == b.OneDomain && a.PreferDomain == b.PreferDomain && slices.Equal(a.Requests, b.Requests)
}

// TestClaimOfLeavesOthersUnscored: forms Predict does not model are not
// scored rather than mispredicted.
func TestClaimOfLeavesOthersUnscored(t *testing.T) {
	base := func() *resourceapi.ResourceClaim {
		return &resourceapi.ResourceClaim{Spec: translate.Shape{MiB: []uint64{4096}, Count: 2}.Template("ns").Spec.Spec}
	}
	cases := map[string]func(*resourceapi.ResourceClaim){
		"another class": func(c *resourceapi.ResourceClaim) {
			c.Spec.Devices.Requests[0].Exactly.DeviceClassName = "gpu.nvidia.com"
		},
		"all devices": func(c *resourceapi.ResourceClaim) {
			c.Spec.Devices.Requests[0].Exactly.AllocationMode = resourceapi.DeviceAllocationModeAll
		},
		"no memory": func(c *resourceapi.ResourceClaim) { c.Spec.Devices.Requests[0].Exactly.Capacity = nil },
		"own selector": func(c *resourceapi.ResourceClaim) {
			c.Spec.Devices.Requests[0].Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: "true"}}}
		},
		"no distinct GPUs": func(c *resourceapi.ResourceClaim) { c.Spec.Devices.Constraints = nil },
		"alternatives": func(c *resourceapi.ResourceClaim) {
			c.Spec.Devices.Requests[0] = resourceapi.DeviceRequest{Name: "gpu-0", FirstAvailable: []resourceapi.DeviceSubRequest{{Name: "a", DeviceClassName: gpushare.DRADeviceClassName}}}
		},
		"tolerations": func(c *resourceapi.ResourceClaim) {
			c.Spec.Devices.Requests[0].Exactly.Tolerations = []resourceapi.DeviceToleration{{Operator: resourceapi.DeviceTolerationOpExists}}
		},
		"allocated already": func(c *resourceapi.ResourceClaim) { c.Status.Allocation = &resourceapi.AllocationResult{} },
	}
	preferred := func(c *resourceapi.ResourceClaim) {
		c.Spec = translate.Shape{MiB: []uint64{4096}, Count: 2, PreferNVLink: true}.Template("ns").Spec.Spec
	}
	for name, mutate := range map[string]func(*resourceapi.ResourceClaim){
		"alternatives in the other order": func(c *resourceapi.ResourceClaim) {
			subs := c.Spec.Devices.Requests[0].FirstAvailable
			subs[0], subs[1] = subs[1], subs[0]
		},
		"alternatives that differ": func(c *resourceapi.ResourceClaim) { c.Spec.Devices.Requests[0].FirstAvailable[1].Count = 1 },
		"the domain constraint on both": func(c *resourceapi.ResourceClaim) {
			c.Spec.Devices.Constraints[1].Requests = []string{"gpu-0"}
		},
		"alternatives beside another request": func(c *resourceapi.ResourceClaim) {
			c.Spec.Devices.Requests = append(c.Spec.Devices.Requests, base().Spec.Devices.Requests[0])
			c.Spec.Devices.Requests[1].Name = "gpu-1"
		},
	} {
		cases["preferred, "+name] = func(c *resourceapi.ResourceClaim) { preferred(c); mutate(c) }
	}
	if _, ok := ClaimOf([]*resourceapi.ResourceClaim{base()}); !ok {
		t.Fatal("the base claim is not read")
	}
	for name, mutate := range cases {
		c := base()
		mutate(c)
		if got, ok := ClaimOf([]*resourceapi.ResourceClaim{c}); ok {
			t.Errorf("%s: read as %+v", name, got)
		}
	}
}

func TestDevicesFromSlices(t *testing.T) {
	dev := func(name string, g int64, domain string, taint bool) resourceapi.Device {
		d := resourceapi.Device{Name: name,
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{gpushare.DRAAttributeNVLinkDomain: {StringValue: ptr.To(domain)}},
			Capacity:   map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{gpushare.DRACapacityMemory: {Value: *resource.NewQuantity(g*gib, resource.BinarySI)}}}
		if taint {
			d.Taints = []resourceapi.DeviceTaint{{Key: gpushare.DRATaintUnhealthy, Effect: resourceapi.DeviceTaintEffectNoSchedule}}
		}
		return d
	}
	slice := func(name, node string, gen int64, devs ...resourceapi.Device) *resourceapi.ResourceSlice {
		return &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: resourceapi.ResourceSliceSpec{
			Driver: gpushare.DRADriverName, NodeName: ptr.To(node), Pool: resourceapi.ResourcePool{Name: node, Generation: gen}, Devices: devs}}
	}
	other := slice("x", "n1", 9, dev("nic", 1, "", false))
	other.Spec.Driver = "nic.example.com"
	by := ByNode([]*resourceapi.ResourceSlice{
		slice("n1-b", "n1", 2, dev("gpu-1", 80, "d1", true)),
		slice("n1-a", "n1", 2, dev("gpu-0", 80, "d0", false)),
		slice("n1-old", "n1", 1, dev("gpu-9", 80, "", false)),
		slice("n2-a", "n2", 1, dev("gpu-0", 40, "", false)),
		other,
	})
	consumed := func(pool, device string) int64 {
		if pool == "n1" && device == "gpu-0" {
			return 8 * gib
		}
		return 0
	}
	got := Devices(by["n1"], consumed)
	want := []Device{{Pool: "n1", Name: "gpu-0", Capacity: 80 * gib, Consumed: 8 * gib, Domain: "d0", Usable: true},
		{Pool: "n1", Name: "gpu-1", Capacity: 80 * gib, Domain: "d1"}}
	if !slices.Equal(got, want) {
		t.Errorf("n1: %+v; want %+v", got, want)
	}
	if n := len(Devices(by["n2"], consumed)); n != 1 || len(by) != 2 {
		t.Errorf("nodes %d, n2 devices %d; want 2 and 1", len(by), n)
	}
}
