package allocator

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

// gpus builds healthy GPUs from (size, used) pairs, indexed in order.
func gpus(sizeUsed ...uint64) []GPU {
	var out []GPU
	for i := 0; i+1 < len(sizeUsed); i += 2 {
		out = append(out, GPU{Index: i / 2, Units: sizeUsed[i], Used: sizeUsed[i+1], Healthy: true})
	}
	return out
}

func node(g []GPU, inflight ...InFlight) *Node {
	return &Node{Name: "n1", GPUShare: true, GPUs: g, InFlight: inflight}
}

// req builds a request of regular containers with the given units.
func req(units ...uint64) Request {
	r := Request{Pod: "default/q"}
	for i, u := range units {
		r.Containers = append(r.Containers, gpushare.ContainerRequest{Name: "c", Index: i, Units: u})
	}
	r.Units = gpushare.PodUnits(r.Containers)
	return r
}

func withInit(r Request, units uint64, sidecar bool) Request {
	r.Containers = append([]gpushare.ContainerRequest{{Name: "init", Index: 0, Init: true, Sidecar: sidecar, Units: units}}, r.Containers...)
	r.Units = gpushare.PodUnits(r.Containers)
	return r
}

func TestPlaceSingleGPU(t *testing.T) {
	unhealthy := gpus(16, 0, 16, 10, 16, 0)
	unhealthy[1].Healthy = false
	tests := []struct {
		name     string
		node     *Node
		req      Request
		policy   Policy
		wantGPU  int
		wantDev  uint64
		reason   string // substring; empty means it fits
		unresolv bool
	}{
		{name: "best fit takes the least free that fits", node: node(gpus(16, 2, 16, 10, 16, 8)), req: req(4), wantGPU: 1, wantDev: 16},
		{name: "best fit skips GPUs that do not fit", node: node(gpus(16, 14, 16, 10, 16, 2)), req: req(4), wantGPU: 1, wantDev: 16},
		{name: "best fit ties go to the lowest index", node: node(gpus(16, 4, 16, 4, 16, 4)), req: req(4), wantGPU: 0, wantDev: 16},
		{name: "exact fit is allowed", node: node(gpus(16, 12)), req: req(4), wantGPU: 0, wantDev: 16},
		{name: "spread takes the most free", node: node(gpus(16, 2, 16, 10, 16, 0)), req: req(4), policy: Spread, wantGPU: 2, wantDev: 16},
		{name: "spread ties go to the lowest index", node: node(gpus(16, 0, 16, 0)), req: req(4), policy: Spread, wantGPU: 0, wantDev: 16},
		{name: "mixed sizes: best fit uses the small card", node: node(gpus(80, 0, 24, 0)), req: req(20), wantGPU: 1, wantDev: 24},
		{name: "mixed sizes: only the big card holds it", node: node(gpus(24, 0, 80, 0)), req: req(40), wantGPU: 1, wantDev: 80},
		{name: "unhealthy GPU never chosen even when it fits best", node: node(unhealthy), req: req(4), wantGPU: 0, wantDev: 16},
		{name: "all GPUs unhealthy", node: node([]GPU{{Index: 0, Units: 16}}), req: req(1), reason: "no healthy GPU", unresolv: true},
		{name: "insufficient in one device", node: node(gpus(16, 14, 16, 13)), req: req(4), reason: ReasonInsufficient},
		{name: "too big for any GPU", node: node(gpus(16, 0, 24, 0)), req: req(30), reason: "more than the largest healthy GPU of node n1 has (24)", unresolv: true},
		{name: "too big counts only healthy GPUs", node: node(append(gpus(16, 0), GPU{Index: 1, Units: 80})), req: req(30), reason: "(16)", unresolv: true},
		{name: "not a sharing node", node: &Node{Name: "cpu1"}, req: req(1), reason: "The node cpu1 is not for GPU share, need skip", unresolv: true},
		{name: "over-charged GPU has no free units", node: node(gpus(16, 20, 16, 15)), req: req(1), wantGPU: 1, wantDev: 16},
		{name: "init larger than regular charges the init peak", node: node(gpus(16, 8, 16, 0)), req: withInit(req(2), 10, false), wantGPU: 1, wantDev: 16},
		{name: "sidecar adds to regular containers", node: node(gpus(16, 10, 16, 0)), req: withInit(req(4), 3, true), wantGPU: 1, wantDev: 16},
		{name: "two containers fit one GPU together", node: node(gpus(16, 0, 16, 6)), req: req(4, 6), wantGPU: 1, wantDev: 16},
		{name: "first fit takes the lowest index that fits", node: node(gpus(16, 14, 16, 2, 16, 10)), req: req(4), policy: FirstFit, wantGPU: 1, wantDev: 16},
		{name: "first fit ignores a fuller card further on", node: node(gpus(16, 0, 16, 12)), req: req(4), policy: FirstFit, wantGPU: 0, wantDev: 16},
		{name: "first fit skips unhealthy GPUs", node: node(unhealthy), req: req(4), policy: FirstFit, wantGPU: 0, wantDev: 16},
		{name: "first fit: insufficient in one device", node: node(gpus(16, 14, 16, 13)), req: req(4), policy: FirstFit, reason: ReasonInsufficient},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, unfit := Place(tt.node, tt.req, tt.policy)
			if tt.reason != "" {
				if unfit == nil {
					t.Fatalf("placed on GPU %d, want unfit %q", p.Home, tt.reason)
				}
				if !strings.Contains(unfit.Reason, tt.reason) || unfit.Unresolvable != tt.unresolv {
					t.Fatalf("unfit = %+v, want reason containing %q, unresolvable %v", unfit, tt.reason, tt.unresolv)
				}
				return
			}
			if unfit != nil {
				t.Fatalf("unfit: %s", unfit.Reason)
			}
			if p.Split || p.Home != tt.wantGPU || p.DevUnits != tt.wantDev {
				t.Fatalf("placement = %+v, want GPU %d dev %d unsplit", p, tt.wantGPU, tt.wantDev)
			}
			assertNoOvercommit(t, tt.node, tt.req, p)
		})
	}
}

// assertNoOvercommit checks the placement's charges against free units and health.
func assertNoOvercommit(t *testing.T, n *Node, r Request, p Placement) {
	t.Helper()
	var sum uint64
	for g, units := range Charges(r, p) {
		found := false
		for _, gpu := range n.GPUs {
			if gpu.Index == g {
				found = true
				if !gpu.Healthy {
					t.Fatalf("placement uses unhealthy GPU %d", g)
				}
				if units > gpu.Free() {
					t.Fatalf("GPU %d charged %d with %d free", g, units, gpu.Free())
				}
			}
		}
		if !found {
			t.Fatalf("placement uses unknown GPU %d", g)
		}
		sum += units
	}
	if sum < r.Units && !p.Split {
		t.Fatalf("charged %d < pod units %d", sum, r.Units)
	}
}

func TestPlaceSplit(t *testing.T) {
	tests := []struct {
		name       string
		node       *Node
		req        Request
		policy     Policy
		wantHome   int
		wantGPUs   map[int]int
		wantCharge map[int]uint64
		reason     string
	}{
		{
			name: "two containers that fit no single GPU get a GPU each",
			node: node(gpus(16, 8, 16, 6, 16, 0)), req: req(10, 8),
			wantHome: -1, wantGPUs: map[int]int{0: 1, 1: 0}, wantCharge: map[int]uint64{1: 10, 0: 8},
		},
		{
			name: "spread places the largest container on the emptiest GPU",
			node: node(gpus(16, 8, 16, 6, 16, 0)), req: req(10, 8), policy: Spread,
			wantHome: -1, wantGPUs: map[int]int{0: 2, 1: 1}, wantCharge: map[int]uint64{2: 10, 1: 8},
		},
		{
			name: "first fit places each container on the lowest GPU with room",
			node: node(gpus(16, 0, 16, 6, 16, 8)), req: req(10, 8), policy: FirstFit,
			wantHome: -1, wantGPUs: map[int]int{0: 0, 1: 1}, wantCharge: map[int]uint64{0: 10, 1: 8},
		},
		{
			name: "init containers stay on the home GPU with their peak",
			node: node(gpus(16, 4, 16, 4)), req: withInit(req(10, 10), 12, false),
			wantHome: 0, wantGPUs: map[int]int{0: 0, 1: 1}, wantCharge: map[int]uint64{0: 12, 1: 10},
		},
		{
			name: "a sidecar on the home GPU is charged beside the regular container there",
			node: node(gpus(16, 0, 16, 0)), req: withInit(req(10, 10), 4, true),
			wantHome: 0, wantGPUs: map[int]int{0: 0, 1: 1}, wantCharge: map[int]uint64{0: 14, 1: 10},
		},
		{
			name: "a container larger than any GPU cannot be split",
			node: node(gpus(16, 0, 16, 0)), req: req(20, 2), reason: "more than the largest healthy GPU",
		},
		{
			name: "more than the node holds in total",
			node: node(gpus(16, 0, 16, 0)), req: req(16, 16, 1), reason: "more than all healthy GPUs of node n1 have together",
		},
		{
			name: "fragments too small for any split",
			node: node(gpus(16, 10, 16, 10, 16, 10)), req: req(7, 7), reason: ReasonInsufficient,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, unfit := Place(tt.node, tt.req, tt.policy)
			if tt.reason != "" {
				if unfit == nil || !strings.Contains(unfit.Reason, tt.reason) {
					t.Fatalf("Place = %+v, %v; want reason %q", p, unfit, tt.reason)
				}
				return
			}
			if unfit != nil {
				t.Fatalf("unfit: %s", unfit.Reason)
			}
			if !p.Split || p.Home != tt.wantHome || !maps.Equal(p.Containers, tt.wantGPUs) {
				t.Fatalf("placement = %+v, want home %d containers %v", p, tt.wantHome, tt.wantGPUs)
			}
			if got := Charges(tt.req, p); !maps.Equal(got, tt.wantCharge) {
				t.Fatalf("charges = %v, want %v", got, tt.wantCharge)
			}
			assertNoOvercommit(t, tt.node, tt.req, p)
			// The annotation round trip must give back the same placement.
			a := p.Assignment(tt.req, 42)
			enc, err := a.Encode()
			if err != nil {
				t.Fatal(err)
			}
			dec, ok, err := gpushare.DecodePodAssignment(enc)
			if err != nil || !ok {
				t.Fatalf("decode: %v %v", ok, err)
			}
			back, err := PlacementFromAssignment(dec, tt.req)
			if err != nil {
				t.Fatal(err)
			}
			if back.Home != p.Home || !back.Split || !maps.Equal(back.Containers, p.Containers) {
				t.Fatalf("round trip = %+v, want %+v", back, p)
			}
		})
	}
}

func TestHoldBack(t *testing.T) {
	inflight := func(pod string, podUnits uint64, slots ...Slot) InFlight {
		return InFlight{Pod: pod, PodUnits: podUnits, Slots: slots}
	}
	tests := []struct {
		name    string
		node    *Node
		req     Request
		wantGPU int
		reason  string
	}{
		{
			name: "same size goes to the in-flight pod's GPU even against best fit",
			node: node(gpus(16, 4, 16, 12), inflight("default/p", 4, Slot{4, gpushare.NewGPUSet(0)})), req: req(4), wantGPU: 0,
		},
		{
			name: "same size held back when the in-flight pod's GPU is full",
			node: node(gpus(16, 14, 16, 0), inflight("default/p", 4, Slot{4, gpushare.NewGPUSet(0)})), req: req(4),
			reason: "on GPU 0",
		},
		{
			name: "same container size but different pod total is held back on every GPU",
			node: node(gpus(16, 4, 16, 0), inflight("default/p", 6, Slot{4, gpushare.NewGPUSet(0)}, Slot{2, gpushare.NewGPUSet(0)})), req: req(4),
			reason: "waiting for pod default/p",
		},
		{
			name: "other sizes are not held back",
			node: node(gpus(16, 4, 16, 10), inflight("default/p", 4, Slot{4, gpushare.NewGPUSet(0)})), req: req(3), wantGPU: 1,
		},
		{
			name: "in-flight init container counts too",
			node: node(gpus(16, 4, 16, 10), inflight("default/p", 5, Slot{5, gpushare.NewGPUSet(0)})), req: withInit(req(1), 5, false),
			wantGPU: 0,
		},
		{
			name: "two in-flight pods of one size on different GPUs block the size",
			node: node(gpus(16, 4, 16, 4, 16, 0), inflight("default/a", 4, Slot{4, gpushare.NewGPUSet(0)}), inflight("default/b", 4, Slot{4, gpushare.NewGPUSet(1)})), req: req(4),
			reason: "waiting for pod default/b",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, unfit := Place(tt.node, tt.req, BestFit)
			if tt.reason != "" {
				if unfit == nil || !strings.Contains(unfit.Reason, tt.reason) || unfit.Unresolvable || !unfit.Waiting {
					t.Fatalf("Place = %+v, %+v; want resolvable, waiting, reason containing %q", p, unfit, tt.reason)
				}
				return
			}
			if unfit != nil {
				t.Fatalf("unfit: %s", unfit.Reason)
			}
			if p.Home != tt.wantGPU {
				t.Fatalf("GPU = %d, want %d", p.Home, tt.wantGPU)
			}
			// Whatever was chosen, every same-size pair must now share a signature.
			assertSignatures(t, tt.node, tt.req, p)
		})
	}
}

// A node without room is not waiting: nothing in flight leaving it would make the pod fit.
func TestUnfitWithoutRoomIsNotWaiting(t *testing.T) {
	n := node(gpus(16, 14, 16, 14), InFlight{Pod: "default/p", PodUnits: 4, Slots: []Slot{{4, gpushare.NewGPUSet(0)}}})
	if _, unfit := Place(n, req(4), BestFit); unfit == nil || unfit.Waiting {
		t.Fatalf("Place on full GPUs = %+v; want an unfit that is not waiting", unfit)
	}
}

func TestHoldBackSplit(t *testing.T) {
	// In flight: an 8-unit container of a 16-unit pod on GPU 1. A new 8+8 pod
	// must not put an 8 anywhere but GPU 1, so the split cannot complete.
	n := node(gpus(16, 8, 16, 8, 16, 0), InFlight{Pod: "default/p", PodUnits: 16, Slots: []Slot{{8, gpushare.NewGPUSet(1)}, {8, gpushare.NewGPUSet(0)}}})
	if p, unfit := Place(n, req(8, 8, 8), BestFit); unfit == nil {
		t.Fatalf("placed %+v despite conflicting in-flight pod", p)
	}
}

func TestScore(t *testing.T) {
	fuller := node(gpus(16, 10))
	emptier := node(gpus(16, 0))
	r := req(4)
	if a, b := Score(fuller, r, BestFit), Score(emptier, r, BestFit); a <= b {
		t.Fatalf("bestfit: fuller %d <= emptier %d", a, b)
	}
	if a, b := Score(fuller, r, Spread), Score(emptier, r, Spread); a >= b {
		t.Fatalf("spread: fuller %d >= emptier %d", a, b)
	}
	if s := Score(node(gpus(16, 14)), r, BestFit); s != 0 {
		t.Fatalf("unfit node scored %d", s)
	}
	if s := Score(node(gpus(16, 12)), r, BestFit); s != 10 {
		t.Fatalf("exact fill scored %d, want 10", s)
	}
}

func TestPolicy(t *testing.T) {
	for in, want := range map[string]Policy{"bestfit": BestFit, "binpack": BestFit, "spread": Spread, "firstfit": FirstFit, "first-fit": FirstFit} {
		if got, err := ParsePolicy(in); err != nil || got != want {
			t.Errorf("ParsePolicy(%q) = %v, %v", in, got, err)
		}
	}
	if _, err := ParsePolicy("random"); err == nil {
		t.Error("ParsePolicy accepted an unknown name")
	}
	var p Policy
	if err := p.Set("spread"); err != nil || p.String() != "spread" {
		t.Errorf("Set: %v %v", p, err)
	}
	for _, p := range []Policy{BestFit, Spread, FirstFit} {
		if got, err := ParsePolicy(p.String()); err != nil || got != p {
			t.Errorf("ParsePolicy(%v.String()) = %v, %v", p, got, err)
		}
	}
}

func TestScoreFirstFit(t *testing.T) {
	r := req(4)
	// Every node that fits scores the same: the scheduler picks the node.
	for _, n := range []*Node{node(gpus(16, 0)), node(gpus(16, 12)), node(gpus(80, 70, 16, 0))} {
		if s := Score(n, r, FirstFit); s != 10 {
			t.Errorf("Score(%+v) = %d, want 10", n.GPUs, s)
		}
	}
	if s := Score(node(gpus(16, 14)), r, FirstFit); s != 0 {
		t.Errorf("unfit node scored %d", s)
	}
}

func TestNewRequest(t *testing.T) {
	q := func(s string) corev1.ResourceList {
		return corev1.ResourceList{gpushare.ResourceName: resource.MustParse(s)}
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"},
		Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{{Name: "i", Resources: corev1.ResourceRequirements{Limits: q("9")}}},
			Containers: []corev1.Container{
				{Name: "a", Resources: corev1.ResourceRequirements{Limits: q("3")}},
				{Name: "b", Resources: corev1.ResourceRequirements{Limits: q("4")}},
			},
		},
	}
	r, err := NewRequest(pod)
	if err != nil || r.Units != 9 || len(r.Containers) != 3 || r.Pod != "ns/p" {
		t.Fatalf("NewRequest = %+v, %v", r, err)
	}
	reqs, err := gpushare.ContainerRequests(pod)
	if err != nil {
		t.Fatal(err)
	}
	if got := RequestOf("ns/p", reqs); !reflect.DeepEqual(got, r) {
		t.Fatalf("RequestOf = %+v, NewRequest = %+v", got, r)
	}
	// A sidecar runs beside the regular containers: 2+3+7.
	sidecar := []gpushare.ContainerRequest{{Name: "s", Init: true, Sidecar: true, Units: 2}, {Name: "a", Units: 3}, {Name: "b", Index: 1, Units: 7}}
	if got := RequestOf("ns/p", sidecar); got.Units != 12 || got.Pod != "ns/p" || len(got.Containers) != 3 {
		t.Fatalf("RequestOf with a sidecar = %+v", got)
	}
	if got := RequestOf("ns/p", nil); got.Units != 0 || got.Containers != nil {
		t.Fatalf("RequestOf(nil) = %+v", got)
	}
	pod.Spec.Containers[0].Resources.Limits = q("-1")
	if _, err := NewRequest(pod); err == nil {
		t.Fatal("negative request accepted")
	}
}

func TestPlacementFromAssignment(t *testing.T) {
	r := req(4)
	p, err := PlacementFromAssignment(gpushare.PodAssignment{GPUIndex: 3, PodUnits: 4}, r)
	if err != nil || p.Split || p.Home != 3 {
		t.Fatalf("index only: %+v %v", p, err)
	}
	// An allocation naming one GPU without an index (gpushare 2.0) is a single-GPU pod.
	p, err = PlacementFromAssignment(gpushare.PodAssignment{GPUIndex: -1, Allocation: gpushare.Allocation{0: {2: 4}}}, r)
	if err != nil || p.Split || p.Home != 2 {
		t.Fatalf("allocation only: %+v %v", p, err)
	}
	// An allocation that disagrees with the request is refused, never guessed.
	if _, err := PlacementFromAssignment(gpushare.PodAssignment{GPUIndex: -1, Allocation: gpushare.Allocation{0: {2: 5}}}, r); err == nil {
		t.Fatal("mismatched allocation accepted")
	}
	// Init containers with no index to run on cannot be charged.
	if _, err := PlacementFromAssignment(gpushare.PodAssignment{GPUIndex: -1, Allocation: gpushare.Allocation{0: {0: 4}, 1: {1: 4}}}, withInit(req(4, 4), 2, false)); err == nil {
		t.Fatal("split without home accepted for init containers")
	}
}

// iso reads isolation annotations (tier, compute-percent; empty leaves one
// out) and fails the test on an error.
func iso(t *testing.T, tier, percent string) PodIsolation {
	t.Helper()
	ann := map[string]string{}
	if tier != "" {
		ann[gpushare.AnnotationIsolation] = tier
	}
	if percent != "" {
		ann[gpushare.AnnotationComputePercent] = percent
	}
	p, err := ReadPodIsolation(ann)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// tiered is a node of GPUs g whose effective tiers are, in order, tiers, as
// the cache reads them from their published names.
func tiered(g []GPU, tiers ...gpushare.Isolation) *Node {
	n := node(g)
	n.Tiers = make([]Tier, len(g))
	for i, t := range tiers {
		n.Tiers[i] = TierOf(t)
	}
	return n
}

func TestReadPodIsolation(t *testing.T) {
	tests := []struct {
		name          string
		ann           map[string]string
		tier          gpushare.Isolation
		percent       int
		wantErr       string // substring; empty means valid
		wantAny       bool
		wantErrTarget error
	}{
		{name: "absent: any tier, no share", ann: nil, tier: gpushare.IsolationAny, wantAny: true},
		{name: "explicit any", ann: map[string]string{gpushare.AnnotationIsolation: "any"}, tier: gpushare.IsolationAny, wantAny: true},
		{name: "mps", ann: map[string]string{gpushare.AnnotationIsolation: "mps"}, tier: gpushare.IsolationMPS},
		{name: "hami-core with a share", ann: map[string]string{gpushare.AnnotationIsolation: "hami-core", gpushare.AnnotationComputePercent: "100"}, tier: gpushare.IsolationHAMiCore, percent: 100},
		{name: "none", ann: map[string]string{gpushare.AnnotationIsolation: "none"}, tier: gpushare.IsolationNone},
		{name: "a share alone asks any tier that limits", ann: map[string]string{gpushare.AnnotationComputePercent: "1"}, tier: gpushare.IsolationAny, percent: 1},
		{name: "unknown tier", ann: map[string]string{gpushare.AnnotationIsolation: "cgpu"}, wantErr: `gpushare.io/isolation "cgpu" is not one of`},
		{name: "share of zero", ann: map[string]string{gpushare.AnnotationComputePercent: "0"}, wantErr: `gpushare.io/compute-percent "0" is not a whole number from 1 to 100`},
		{name: "share above 100", ann: map[string]string{gpushare.AnnotationComputePercent: "101"}, wantErr: "from 1 to 100"},
		{name: "share with a sign", ann: map[string]string{gpushare.AnnotationComputePercent: "+5"}, wantErr: "from 1 to 100"},
		{name: "share on none cannot be enforced", ann: map[string]string{gpushare.AnnotationIsolation: "none", gpushare.AnnotationComputePercent: "50"},
			wantErr: `gpushare.io/compute-percent "50" cannot be enforced with gpushare.io/isolation "none"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := ReadPodIsolation(tt.ann)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, gpushare.ErrInvalidIsolation) {
					t.Fatalf("ReadPodIsolation = %v, %v; want ErrInvalidIsolation saying %q", p, err, tt.wantErr)
				}
				if p.Readable() || p.Tier() != "" {
					t.Fatalf("an error left %v readable", p)
				}
				return
			}
			if err != nil || p.Tier() != tt.tier || p.ComputePercent() != tt.percent || p.Any() != tt.wantAny || !p.Readable() {
				t.Fatalf("ReadPodIsolation = %v (tier %q, %d%%, any %v), %v; want tier %q, %d%%", p, p.Tier(), p.ComputePercent(), p.Any(), err, tt.tier, tt.percent)
			}
		})
	}
	// The zero value is what a pod without annotations asks, so requests
	// built before tiers (and literals in other packages) ask nothing.
	if p, _ := ReadPodIsolation(nil); p != (PodIsolation{}) {
		t.Fatalf("no annotations read as %v, not the zero value", p)
	}
}

func TestNewRequestIsolation(t *testing.T) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", Annotations: map[string]string{
			gpushare.AnnotationIsolation: "mps", gpushare.AnnotationComputePercent: "30"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "a", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{gpushare.ResourceName: resource.MustParse("4")}}}}},
	}
	r, err := NewRequest(pod)
	if err != nil || r.Isolation.Tier() != gpushare.IsolationMPS || r.Isolation.ComputePercent() != 30 || r.Units != 4 {
		t.Fatalf("NewRequest = %+v, %v", r, err)
	}
	pod.Annotations[gpushare.AnnotationComputePercent] = "thirty"
	if _, err := NewRequest(pod); !errors.Is(err, gpushare.ErrInvalidIsolation) {
		t.Fatalf("NewRequest with an unreadable share: %v; want ErrInvalidIsolation", err)
	}
}

func TestPlaceIsolation(t *testing.T) {
	fellBack := tiered(gpus(16, 0, 16, 0), gpushare.IsolationNone, gpushare.IsolationNone)
	fellBack.IsolationReasons = map[int]string{0: "MPS control daemon not answering"}
	fenced := node(gpus(16, 0, 16, 8))
	fenced.Tiers = []Tier{TierFenced, TierNone}
	fenced.IsolationReasons = map[int]string{0: "MPS control daemon not answering"}
	allFenced := node(gpus(16, 0))
	allFenced.Tiers = []Tier{TierFenced}
	allFenced.IsolationReasons = map[int]string{0: "MPS control daemon not answering"}
	badMPS := tiered(gpus(16, 0, 16, 0), gpushare.IsolationNone, gpushare.IsolationMPS)
	badMPS.GPUs[1].Healthy = false
	tests := []struct {
		name         string
		node         *Node
		req          Request
		wantGPU      int
		reason       string // exact when set
		reasonSubstr string
		unresolvable bool
	}{
		{name: "no annotations: any tier, best fit as before", node: tiered(gpus(16, 0, 16, 8), gpushare.IsolationMPS, gpushare.IsolationNone), wantGPU: 1},
		{name: "mps goes to the mps GPU against best fit", node: tiered(gpus(16, 0, 16, 8), gpushare.IsolationMPS, gpushare.IsolationNone), req: withIso(req(4), "mps", ""), wantGPU: 0},
		{name: "none goes to the none GPU", node: tiered(gpus(16, 8, 16, 0), gpushare.IsolationMPS, gpushare.IsolationNone), req: withIso(req(4), "none", ""), wantGPU: 1},
		{name: "a plugin older than tiers offers none", node: node(gpus(16, 0)), req: withIso(req(4), "none", ""), wantGPU: 0},
		{name: "a tier newer than the extender offers only to any", node: tiered(gpus(16, 8, 16, 0), "driver", gpushare.IsolationNone), wantGPU: 0},
		{name: "a tier newer than the extender limits nothing", node: tiered(gpus(16, 0), "driver"), req: withIso(req(4), "", "10"), unresolvable: true,
			reason: "no GPU can enforce gpushare.io/compute-percent 10, which needs isolation mps or hami-core (GPU 0: unknown)"},
		{name: "a share goes to a GPU that can limit it", node: tiered(gpus(16, 8, 16, 0, 16, 0), gpushare.IsolationNone, gpushare.IsolationNone, gpushare.IsolationHAMiCore), req: withIso(req(4), "", "30"), wantGPU: 2},
		{name: "mps fell back: the reason names each GPU's tier and why",
			node: fellBack, req: withIso(req(4), "mps", ""), unresolvable: true,
			reason: `no GPU offers isolation "mps" (GPU 0: none, MPS control daemon not answering; GPU 1: none)`},
		{name: "a GPU whose tier is down is fenced, even for a pod asking any", node: fenced, wantGPU: 1},
		{name: "a node whose only GPU is fenced takes nothing", node: allFenced, req: withIso(req(4), "none", ""), unresolvable: true,
			reason: `no GPU offers isolation "none" (GPU 0: none, MPS control daemon not answering)`},
		{name: "GPUs that read alike are grouped", node: node(gpus(16, 0, 16, 0, 16, 0)), req: withIso(req(4), "hami-core", ""), unresolvable: true,
			reason: `no GPU offers isolation "hami-core" (GPUs 0, 1, 2: none)`},
		{name: "an unhealthy GPU offers nothing", node: badMPS, req: withIso(req(4), "mps", ""), unresolvable: true,
			reason: `no GPU offers isolation "mps" (GPU 0: none; GPU 1: mps, unhealthy)`},
		{name: "none is not offered by an mps GPU", node: tiered(gpus(16, 0), gpushare.IsolationMPS), req: withIso(req(4), "none", ""), unresolvable: true,
			reason: `no GPU offers isolation "none" (GPU 0: mps)`},
		{name: "a share no GPU can enforce", node: node(gpus(16, 0, 16, 0)), req: withIso(req(4), "", "30"), unresolvable: true,
			reason: `no GPU can enforce gpushare.io/compute-percent 30, which needs isolation mps or hami-core (GPUs 0, 1: none)`},
		{name: "the mps GPU is full: insufficient, not unoffered", node: tiered(gpus(16, 14, 16, 0), gpushare.IsolationMPS, gpushare.IsolationNone), req: withIso(req(4), "mps", ""),
			reason: ReasonInsufficient},
		{name: "too big for every GPU offering the tier", node: tiered(gpus(16, 0, 80, 0), gpushare.IsolationMPS, gpushare.IsolationNone), req: withIso(req(40), "mps", ""), unresolvable: true,
			reason: `pod requests 40 units of GPU memory on one GPU, more than the largest healthy GPU of node n1 offering isolation "mps" has (16)`},
		{name: "too big for every GPU able to limit", node: tiered(gpus(16, 0, 80, 0), gpushare.IsolationHAMiCore, gpushare.IsolationNone), req: withIso(req(40), "", "10"), unresolvable: true,
			reasonSubstr: "largest healthy GPU of node n1 able to limit compute has (16)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := tt.node
			r := tt.req
			if r.Containers == nil {
				r = req(4)
			}
			p, unfit := Place(n, r, BestFit)
			if tt.reason != "" || tt.reasonSubstr != "" {
				if unfit == nil {
					t.Fatalf("placed on GPU %d; want unfit", p.Home)
				}
				if (tt.reason != "" && unfit.Reason != tt.reason) || !strings.Contains(unfit.Reason, tt.reasonSubstr) || unfit.Unresolvable != tt.unresolvable {
					t.Fatalf("unfit = %+v\nwant reason %q%q, unresolvable %v", unfit, tt.reason, tt.reasonSubstr, tt.unresolvable)
				}
				if Score(n, r, BestFit) != 0 {
					t.Fatal("an unfit node scored above 0")
				}
				return
			}
			if unfit != nil {
				t.Fatalf("unfit: %s", unfit.Reason)
			}
			if p.Home != tt.wantGPU {
				t.Fatalf("GPU %d, want %d", p.Home, tt.wantGPU)
			}
			assertAllowed(t, n, r, p)
		})
	}
}

// withIso sets r's isolation annotations; see iso.
func withIso(r Request, tier, percent string) Request {
	ann := map[string]string{}
	if tier != "" {
		ann[gpushare.AnnotationIsolation] = tier
	}
	if percent != "" {
		ann[gpushare.AnnotationComputePercent] = percent
	}
	p, err := ReadPodIsolation(ann)
	if err != nil {
		panic(err)
	}
	r.Isolation = p
	return r
}

// assertAllowed checks, by the contract's own rules, that every GPU p uses
// offers r's tier and, for a share, can limit it.
func assertAllowed(t *testing.T, n *Node, r Request, p Placement) {
	t.Helper()
	assertNoOvercommit(t, n, r, p)
	for g := range Charges(r, p) {
		for i, gpu := range n.GPUs {
			// By the contract's own functions, on the tier's published name.
			tier := gpushare.Isolation(n.TierAt(i).String())
			if gpu.Index == g && (!tier.Offers(r.Isolation.Tier()) || (r.Isolation.ComputePercent() > 0 && !tier.Limits())) {
				t.Fatalf("GPU %d of tier %q given to a pod asking %v", g, tier, r.Isolation)
			}
		}
	}
}

func TestPlaceSplitIsolation(t *testing.T) {
	// Two 10-unit containers need two GPUs; only GPUs 1 and 3 offer mps, and
	// the emptier none GPUs must not be taken.
	n := tiered(gpus(16, 0, 16, 4, 16, 0, 16, 2),
		gpushare.IsolationNone, gpushare.IsolationMPS, gpushare.IsolationNone, gpushare.IsolationMPS)
	r := withIso(req(10, 10), "mps", "")
	p, unfit := Place(n, r, BestFit)
	if unfit != nil {
		t.Fatal(unfit.Reason)
	}
	if !p.Split || !maps.Equal(p.Containers, map[int]int{0: 1, 1: 3}) {
		t.Fatalf("placement %+v; want containers on GPUs 1 and 3", p)
	}
	assertAllowed(t, n, r, p)
	// Three 12-unit containers are more than the two mps GPUs hold together.
	if _, unfit := Place(n, withIso(req(12, 12, 12), "mps", ""), BestFit); unfit == nil ||
		unfit.Reason != `pod requests 36 units of GPU memory, more than all healthy GPUs of node n1 offering isolation "mps" have together` {
		t.Fatalf("three containers: %+v", unfit)
	}
}

// TestHoldBackIsolation: the device plugin's answer carries the pod's tier
// and compute share, so two in-flight containers of one size must agree on
// them as on the GPU, or the plugin could hand one pod's limits to another.
func TestHoldBackIsolation(t *testing.T) {
	inflight := func(t *testing.T, tier, percent string, slots ...Slot) InFlight {
		return InFlight{Pod: "default/p", PodUnits: 4, Isolation: iso(t, tier, percent), Slots: slots}
	}
	mps := func(in InFlight) *Node {
		n := tiered(gpus(16, 4, 16, 0), gpushare.IsolationMPS, gpushare.IsolationMPS)
		n.InFlight = []InFlight{in}
		return n
	}
	tests := []struct {
		name     string
		inflight func(t *testing.T) InFlight
		req      Request
		wantGPU  int
		reason   string
	}{
		{
			name:     "equal share: the in-flight pod's GPU, as for the GPU alone",
			inflight: func(t *testing.T) InFlight { return inflight(t, "", "30", Slot{4, gpushare.NewGPUSet(0)}) },
			req:      withIso(req(4), "", "30"), wantGPU: 0,
		},
		{
			name:     "another share waits, naming the pod and its share",
			inflight: func(t *testing.T) InFlight { return inflight(t, "", "30", Slot{4, gpushare.NewGPUSet(0)}) },
			req:      withIso(req(4), "", "50"),
			reason:   `waiting for pod default/p (a 4-unit container of a pod with isolation "any", compute-percent 30, not yet allocated by the device plugin)`,
		},
		{
			name:     "a share beside an in-flight pod without one waits",
			inflight: func(t *testing.T) InFlight { return inflight(t, "", "", Slot{4, gpushare.NewGPUSet(0)}) },
			req:      withIso(req(4), "", "30"),
			reason:   `waiting for pod default/p (a 4-unit container of a pod with isolation "any", no compute-percent, not yet allocated by the device plugin)`,
		},
		{
			name:     "another required tier waits, though the GPU offers both",
			inflight: func(t *testing.T) InFlight { return inflight(t, "", "", Slot{4, gpushare.NewGPUSet(0)}) },
			req:      withIso(req(4), "mps", ""),
			reason:   `waiting for pod default/p (a 4-unit container of a pod with isolation "any", no compute-percent`,
		},
		{
			name: "unreadable annotations on an in-flight pod hold back its size",
			inflight: func(t *testing.T) InFlight {
				return InFlight{Pod: "default/p", PodUnits: 4, Isolation: PodIsolation{need: needUnreadable}, Slots: []Slot{{4, gpushare.NewGPUSet(0)}}}
			},
			req:    req(4),
			reason: "waiting for pod default/p (a 4-unit container of a pod with unreadable isolation annotations",
		},
		{
			name:     "other sizes are not held back by a share, even on its GPU",
			inflight: func(t *testing.T) InFlight { return inflight(t, "", "30", Slot{4, gpushare.NewGPUSet(0)}) },
			req:      withIso(req(3), "", "50"), wantGPU: 0,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := mps(tt.inflight(t))
			p, unfit := Place(n, tt.req, BestFit)
			if tt.reason != "" {
				if unfit == nil || !strings.HasPrefix(unfit.Reason, tt.reason) || unfit.Unresolvable {
					t.Fatalf("Place = %+v, %+v; want resolvable reason starting %q", p, unfit, tt.reason)
				}
				return
			}
			if unfit != nil {
				t.Fatalf("unfit: %s", unfit.Reason)
			}
			if p.Home != tt.wantGPU {
				t.Fatalf("GPU %d, want %d", p.Home, tt.wantGPU)
			}
			assertSignatures(t, n, tt.req, p)
		})
	}
}

// assertSignatures checks rule 2 on a placement: every container of r of the
// size of an in-flight container has that container's signature.
func assertSignatures(t *testing.T, n *Node, r Request, p Placement) {
	t.Helper()
	for _, f := range n.InFlight {
		for _, s := range f.Slots {
			for _, q := range Slots(r, p) {
				if q.Units == s.Units && (q.GPUs != s.GPUs || f.PodUnits != r.Units || f.Isolation != r.Isolation) {
					t.Fatalf("signature conflict with %s: %+v %v vs %+v %v", f.Pod, s, f.Isolation, q, r.Isolation)
				}
			}
		}
	}
}

// TestBindsKeepSignatures binds random pods one after another, as the
// extender does, on nodes of random tiers, and checks after every bind what
// the device plugin relies on: all in-flight containers of one size share GPU,
// pod total and isolation annotations, and every GPU offers what its pods ask.
func TestBindsKeepSignatures(t *testing.T) {
	tiers := []gpushare.Isolation{"", gpushare.IsolationNone, gpushare.IsolationMPS, gpushare.IsolationHAMiCore, "driver"}
	asks := []PodIsolation{{}, iso(t, "mps", ""), iso(t, "", "30"), iso(t, "", "50"), iso(t, "hami-core", "30"), iso(t, "none", "")}
	rng := rand.New(rand.NewPCG(14, 2))
	placed := 0
	for round := range 300 {
		n := tiered(gpus(16, 0, 16, 0, 24, 0, 24, 0))
		for i := range n.Tiers {
			n.Tiers[i] = TierOf(tiers[rng.IntN(len(tiers))])
		}
		for i := range 12 {
			units := []uint64{2, 4, 4, 6, 10}[rng.IntN(5)]
			var r Request
			if rng.IntN(4) == 0 {
				r = req(units, units+2) // may split
			} else {
				r = req(units)
			}
			r.Pod = fmt.Sprintf("default/p%d-%d", round, i)
			r.Isolation = asks[rng.IntN(len(asks))]
			p, unfit := Place(n, r, Policy(rng.IntN(3)))
			if unfit != nil {
				continue
			}
			placed++
			assertAllowed(t, n, r, p)
			assertSignatures(t, n, r, p)
			// Bind: charge it and put it in flight, as the cache's next snapshot does.
			next := *n
			next.GPUs = slices.Clone(n.GPUs)
			for g, u := range Charges(r, p) {
				next.GPUs[slices.IndexFunc(next.GPUs, func(x GPU) bool { return x.Index == g })].Used += u
			}
			next.InFlight = append(slices.Clone(n.InFlight), InFlight{Pod: r.Pod, PodUnits: r.Units, Isolation: r.Isolation, Slots: Slots(r, p)})
			n = &next
		}
	}
	if placed < 1000 {
		t.Fatalf("only %d pods placed: the test exercises too little", placed)
	}
}

func TestTier(t *testing.T) {
	for _, tc := range []struct {
		published gpushare.Isolation
		tier      Tier
		limits    bool
	}{
		{"", TierNone, false}, {"none", TierNone, false}, {"mps", TierMPS, true}, {"hami-core", TierHAMiCore, true}, {"driver", TierUnknown, false},
	} {
		if got := TierOf(tc.published); got != tc.tier || got.Limits() != tc.limits {
			t.Errorf("TierOf(%q) = %v (limits %v), want %v (limits %v)", tc.published, got, got.Limits(), tc.tier, tc.limits)
		}
		// The name round-trips for the tiers the contract knows.
		if tc.tier != TierUnknown && tc.published != "" && tc.tier.String() != string(tc.published) {
			t.Errorf("%v.String() = %q, want %q", tc.tier, tc.tier.String(), tc.published)
		}
	}
	// A node without tiers reads as none everywhere.
	if got := node(gpus(16, 0)).TierAt(0); got != TierNone {
		t.Errorf("TierAt of a node without tiers = %v", got)
	}
}
