package gpushare_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

func regularReq(name string, i int, units uint64) gpushare.ContainerRequest {
	return gpushare.ContainerRequest{Name: name, Index: i, Units: units}
}

func initReq(name string, i int, units uint64) gpushare.ContainerRequest {
	return gpushare.ContainerRequest{Name: name, Index: i, Init: true, Units: units}
}

func TestContainerSet(t *testing.T) {
	a := gpushare.Allocation{
		0: {0: 2, 1: 2},
		1: {3: 5},
		2: {1: 2, 0: 3},
		3: {},
		4: {10: 1, 2: 1, 63: 1},
	}
	for _, tt := range []struct {
		c       int
		set     gpushare.GPUSet
		per     uint64
		ok      bool
		wantErr error
	}{
		{c: 0, set: gpushare.NewGPUSet(0, 1), per: 2, ok: true},
		{c: 1, set: gpushare.NewGPUSet(3), per: 5, ok: true},
		{c: 2, ok: true, wantErr: gpushare.ErrMultiGPUContainer},
		{c: 3, ok: false},
		{c: 4, set: gpushare.NewGPUSet(2, 10, 63), per: 1, ok: true},
		{c: 9, ok: false},
	} {
		set, per, ok, err := a.ContainerSet(tt.c)
		if tt.wantErr != nil {
			var ae *gpushare.AssignmentError
			if !errors.Is(err, tt.wantErr) || !errors.As(err, &ae) || ae.Index != tt.c || set != 0 || per != 0 || ok != tt.ok {
				t.Errorf("ContainerSet(%d) = %v, %d, %v, %v; want %v for index %d", tt.c, set, per, ok, err, tt.wantErr, tt.c)
			}
			continue
		}
		if err != nil || set != tt.set || per != tt.per || ok != tt.ok {
			t.Errorf("ContainerSet(%d) = %v, %d, %v, %v; want %v, %d, %v", tt.c, set, per, ok, err, tt.set, tt.per, tt.ok)
		}
	}
}

// A two-GPU pod with two regular containers and an init container: every
// container, the init one included, runs on both GPUs.
func TestMultiGPUPodSets(t *testing.T) {
	both := gpushare.NewGPUSet(0, 1)
	reqs := []gpushare.ContainerRequest{
		initReq("setup", 0, 8),
		regularReq("a", 0, 4),
		regularReq("b", 1, 6),
	}
	for _, idx := range []int{0, -1} {
		p := gpushare.PodAssignment{GPUIndex: idx, PodUnits: 10, Allocation: gpushare.Allocation{
			0: {0: 2, 1: 2},
			1: {0: 3, 1: 3},
		}}
		set, err := p.MultiSet()
		if err != nil || set != both {
			t.Fatalf("IDX %d: MultiSet() = %v, %v; want %v", idx, set, err, both)
		}
		for _, r := range reqs {
			if got, err := p.SetFor(r); err != nil || got != both {
				t.Errorf("IDX %d: SetFor(%s) = %v, %v; want %v", idx, r.Name, got, err, both)
			}
		}
		sets, err := p.ContainerSets(reqs)
		if want := map[int]gpushare.GPUSet{0: both, 1: both}; err != nil || !reflect.DeepEqual(sets, want) {
			t.Errorf("IDX %d: ContainerSets = %v, %v; want %v", idx, sets, err, want)
		}
		// Per GPU: init 4, regular 2+3 = 5 → the larger, 5.
		charges, err := p.Charges(reqs)
		if want := map[int]uint64{0: 5, 1: 5}; err != nil || !reflect.DeepEqual(charges, want) {
			t.Errorf("IDX %d: Charges = %v, %v; want %v", idx, charges, err, want)
		}
	}
}

// Multi-GPU sets need not start at 0 nor be contiguous.
func TestMultiGPUPodOnSparseSet(t *testing.T) {
	set := gpushare.NewGPUSet(5, 2, 63)
	reqs := []gpushare.ContainerRequest{regularReq("a", 0, 9), initReq("i", 0, 3)}
	p := gpushare.PodAssignment{GPUIndex: 2, Allocation: gpushare.Allocation{0: {2: 3, 5: 3, 63: 3}}}
	if got, err := p.MultiSet(); err != nil || got != set {
		t.Fatalf("MultiSet() = %v, %v; want %v", got, err, set)
	}
	for _, r := range reqs {
		if got, err := p.SetFor(r); err != nil || got != set {
			t.Errorf("SetFor(%s) = %v, %v; want %v", r.Name, got, err, set)
		}
	}
	charges, err := p.Charges(reqs)
	if want := map[int]uint64{2: 3, 5: 3, 63: 3}; err != nil || !reflect.DeepEqual(charges, want) {
		t.Errorf("Charges = %v, %v; want %v", charges, err, want)
	}
}

func TestMultiSetRejects(t *testing.T) {
	const anyIndex = -2
	for _, tt := range []struct {
		name    string
		p       gpushare.PodAssignment
		wantErr error
		index   int
		msg     string
	}{{
		name:    "containers on different sets",
		p:       gpushare.PodAssignment{GPUIndex: 0, Allocation: gpushare.Allocation{0: {0: 2, 1: 2}, 1: {2: 3, 3: 3}}},
		wantErr: gpushare.ErrAssignmentMismatch,
		index:   anyIndex, // MultiSet takes whichever multi-GPU container map order gives first
		msg:     "2,3",
	}, {
		name:    "containers on overlapping sets",
		p:       gpushare.PodAssignment{GPUIndex: -1, Allocation: gpushare.Allocation{0: {0: 2, 1: 2}, 1: {1: 3, 2: 3}}},
		wantErr: gpushare.ErrAssignmentMismatch,
		index:   anyIndex,
		msg:     "1,2",
	}, {
		name:    "one container on a single GPU of the set",
		p:       gpushare.PodAssignment{GPUIndex: -1, Allocation: gpushare.Allocation{0: {0: 2, 1: 2}, 1: {0: 6}}},
		wantErr: gpushare.ErrAssignmentMismatch,
		index:   1,
	}, {
		name:    "single-GPU container listed first",
		p:       gpushare.PodAssignment{GPUIndex: -1, Allocation: gpushare.Allocation{0: {4: 6}, 1: {4: 2, 5: 2}}},
		wantErr: gpushare.ErrAssignmentMismatch,
		index:   0,
	}, {
		name:    "IDX is the set's second GPU",
		p:       gpushare.PodAssignment{GPUIndex: 1, Allocation: gpushare.Allocation{0: {0: 2, 1: 2}}},
		wantErr: gpushare.ErrAssignmentMismatch,
		index:   -1,
		msg:     "GPU 1",
	}, {
		name:    "IDX outside the set",
		p:       gpushare.PodAssignment{GPUIndex: 7, Allocation: gpushare.Allocation{0: {2: 2, 3: 2}}},
		wantErr: gpushare.ErrAssignmentMismatch,
		index:   -1,
		msg:     "2,3",
	}} {
		set, err := tt.p.MultiSet()
		var ae *gpushare.AssignmentError
		if !errors.Is(err, tt.wantErr) || !errors.As(err, &ae) || set != 0 {
			t.Errorf("%s: MultiSet() = %v, %v; want %v", tt.name, set, err, tt.wantErr)
			continue
		}
		if tt.index != anyIndex && ae.Index != tt.index {
			t.Errorf("%s: error index %d; want %d (%v)", tt.name, ae.Index, tt.index, err)
		}
		if tt.msg != "" && !strings.Contains(err.Error(), tt.msg) {
			t.Errorf("%s: error %q does not mention %q", tt.name, err, tt.msg)
		}
		// SetFor, ContainerSets and Charges all refuse too.
		r := regularReq("a", 0, 4)
		if _, err := tt.p.SetFor(r); !errors.Is(err, tt.wantErr) {
			t.Errorf("%s: SetFor = %v; want %v", tt.name, err, tt.wantErr)
		}
		if _, err := tt.p.ContainerSets([]gpushare.ContainerRequest{r}); !errors.Is(err, tt.wantErr) {
			t.Errorf("%s: ContainerSets = %v; want %v", tt.name, err, tt.wantErr)
		}
		if _, err := tt.p.Charges([]gpushare.ContainerRequest{r}); !errors.Is(err, tt.wantErr) {
			t.Errorf("%s: Charges = %v; want %v", tt.name, err, tt.wantErr)
		}
	}
}

// Single-GPU and split pods have no multi-GPU set, and SetFor gives each
// container the one GPU GPUFor gives it (regression for issue 15).
func TestSetForSingleAndSplitPods(t *testing.T) {
	for _, tt := range []struct {
		name string
		p    gpushare.PodAssignment
		reqs []gpushare.ContainerRequest
	}{{
		name: "index only",
		p:    gpushare.PodAssignment{GPUIndex: 3},
		reqs: []gpushare.ContainerRequest{initReq("i", 0, 5), regularReq("a", 0, 2), regularReq("b", 1, 1)},
	}, {
		name: "one GPU by allocation",
		p:    gpushare.PodAssignment{GPUIndex: 2, Allocation: gpushare.Allocation{0: {2: 2}, 1: {2: 1}}},
		reqs: []gpushare.ContainerRequest{initReq("i", 0, 5), regularReq("a", 0, 2), regularReq("b", 1, 1)},
	}, {
		name: "split with index",
		p:    gpushare.PodAssignment{GPUIndex: 0, Allocation: gpushare.Allocation{0: {0: 3}, 1: {1: 8}}},
		reqs: []gpushare.ContainerRequest{initReq("i", 0, 5), regularReq("a", 0, 3), regularReq("b", 1, 8)},
	}, {
		name: "split without index, no init",
		p:    gpushare.PodAssignment{GPUIndex: -1, Allocation: gpushare.Allocation{0: {0: 3}, 1: {1: 8}}},
		reqs: []gpushare.ContainerRequest{regularReq("a", 0, 3), regularReq("b", 1, 8)},
	}} {
		if set, err := tt.p.MultiSet(); err != nil || set != 0 {
			t.Errorf("%s: MultiSet() = %v, %v; want 0, nil", tt.name, set, err)
		}
		for _, r := range tt.reqs {
			g, gerr := tt.p.GPUFor(r)
			s, serr := tt.p.SetFor(r)
			if gerr != nil || serr != nil || s != gpushare.NewGPUSet(g) || s.Len() != 1 {
				t.Errorf("%s: SetFor(%s) = %v, %v; GPUFor = %d, %v", tt.name, r.Name, s, serr, g, gerr)
			}
		}
		gpus, gerr := tt.p.ContainerGPUs(tt.reqs)
		sets, serr := tt.p.ContainerSets(tt.reqs)
		if gerr != nil || serr != nil || len(gpus) != len(sets) {
			t.Errorf("%s: ContainerSets = %v, %v; ContainerGPUs = %v, %v", tt.name, sets, serr, gpus, gerr)
		}
		for c, g := range gpus {
			if sets[c] != gpushare.NewGPUSet(g) {
				t.Errorf("%s: container %d: set %v, GPU %d", tt.name, c, sets[c], g)
			}
		}
		charges, err := tt.p.Charges(tt.reqs)
		byGPU := gpushare.ChargesByGPU(tt.reqs, func(c gpushare.ContainerRequest) int {
			g, _ := tt.p.GPUFor(c)
			return g
		})
		if err != nil || !reflect.DeepEqual(charges, byGPU) {
			t.Errorf("%s: Charges = %v, %v; ChargesByGPU %v", tt.name, charges, err, byGPU)
		}
	}
	// A split pod's init container still needs the index, as before.
	p := gpushare.PodAssignment{GPUIndex: -1, Allocation: gpushare.Allocation{0: {0: 3}, 1: {1: 8}}}
	if _, err := p.SetFor(initReq("i", 0, 5)); !errors.Is(err, gpushare.ErrAssignmentMismatch) {
		t.Errorf("split pod without index: SetFor(init) = %v; want ErrAssignmentMismatch", err)
	}
}

func TestSetForRejects(t *testing.T) {
	two := gpushare.Allocation{0: {0: 2, 1: 2}}
	for _, tt := range []struct {
		name    string
		p       gpushare.PodAssignment
		c       gpushare.ContainerRequest
		wantErr error
		msg     string
	}{{
		name:    "uneven split",
		p:       gpushare.PodAssignment{GPUIndex: 0, Allocation: gpushare.Allocation{0: {0: 2, 1: 3}}},
		c:       regularReq("a", 0, 4),
		wantErr: gpushare.ErrMultiGPUContainer,
		msg:     "unevenly",
	}, {
		name:    "uneven split of another container",
		p:       gpushare.PodAssignment{GPUIndex: 0, Allocation: gpushare.Allocation{0: {0: 2, 1: 2}, 1: {0: 1, 1: 3}}},
		c:       regularReq("b", 1, 4),
		wantErr: gpushare.ErrMultiGPUContainer,
	}, {
		name:    "units above the request",
		p:       gpushare.PodAssignment{GPUIndex: 0, Allocation: two},
		c:       regularReq("a", 0, 2),
		wantErr: gpushare.ErrAssignmentMismatch,
		msg:     `"a"`,
	}, {
		name:    "units below the request",
		p:       gpushare.PodAssignment{GPUIndex: 0, Allocation: two},
		c:       regularReq("a", 0, 6),
		wantErr: gpushare.ErrAssignmentMismatch,
		msg:     "requests 6",
	}, {
		name:    "request not divisible by the set",
		p:       gpushare.PodAssignment{GPUIndex: 0, Allocation: two},
		c:       regularReq("a", 0, 5),
		wantErr: gpushare.ErrAssignmentMismatch,
		msg:     "divide",
	}, {
		name:    "init request not divisible by the set",
		p:       gpushare.PodAssignment{GPUIndex: 0, Allocation: two},
		c:       initReq("setup", 0, 3),
		wantErr: gpushare.ErrAssignmentMismatch,
		msg:     `initContainers[0] "setup"`,
	}, {
		name:    "regular container without an entry",
		p:       gpushare.PodAssignment{GPUIndex: 0, Allocation: two},
		c:       regularReq("b", 1, 4),
		wantErr: gpushare.ErrAssignmentMismatch,
		msg:     "no entry",
	}} {
		s, err := tt.p.SetFor(tt.c)
		if !errors.Is(err, tt.wantErr) || s != 0 {
			t.Errorf("%s: SetFor = %v, %v; want %v", tt.name, s, err, tt.wantErr)
			continue
		}
		if tt.msg != "" && !strings.Contains(err.Error(), tt.msg) {
			t.Errorf("%s: error %q does not mention %q", tt.name, err, tt.msg)
		}
		if _, err := tt.p.Charges([]gpushare.ContainerRequest{tt.c}); !errors.Is(err, tt.wantErr) {
			t.Errorf("%s: Charges = %v; want %v", tt.name, err, tt.wantErr)
		}
	}
}

// The allocation charging a container that asks for nothing fails
// ContainerSets and Charges even when every requested container fits.
func TestContainerSetsRejectsUnrequestedContainer(t *testing.T) {
	p := gpushare.PodAssignment{GPUIndex: 0, Allocation: gpushare.Allocation{0: {0: 2, 1: 2}, 2: {0: 1, 1: 1}}}
	reqs := []gpushare.ContainerRequest{regularReq("a", 0, 4)}
	var ae *gpushare.AssignmentError
	if _, err := p.ContainerSets(reqs); !errors.Is(err, gpushare.ErrAssignmentMismatch) || !errors.As(err, &ae) || ae.Index != 2 {
		t.Errorf("ContainerSets = %v; want ErrAssignmentMismatch for index 2", err)
	}
	if _, err := p.Charges(reqs); !errors.Is(err, gpushare.ErrAssignmentMismatch) {
		t.Errorf("Charges = %v; want ErrAssignmentMismatch", err)
	}
}

func TestMultiGPUCharges(t *testing.T) {
	side := gpushare.ContainerRequest{Name: "side", Index: 0, Init: true, Sidecar: true, Units: 2}
	for _, tt := range []struct {
		name string
		p    gpushare.PodAssignment
		reqs []gpushare.ContainerRequest
		want map[int]uint64
	}{{
		name: "init peak above the regular container: 8 init, 4 regular over 2 GPUs",
		p:    gpushare.PodAssignment{GPUIndex: 0, Allocation: gpushare.Allocation{0: {0: 2, 1: 2}}},
		reqs: []gpushare.ContainerRequest{initReq("i", 0, 8), regularReq("a", 0, 4)},
		want: map[int]uint64{0: 4, 1: 4},
	}, {
		name: "regular above the init peak",
		p:    gpushare.PodAssignment{GPUIndex: 4, Allocation: gpushare.Allocation{0: {4: 6, 5: 6}}},
		reqs: []gpushare.ContainerRequest{initReq("i", 0, 2), regularReq("a", 0, 12)},
		want: map[int]uint64{4: 6, 5: 6},
	}, {
		name: "sidecar runs beside the regular containers on every GPU",
		p:    gpushare.PodAssignment{GPUIndex: 0, Allocation: gpushare.Allocation{0: {0: 1, 1: 1}}},
		reqs: []gpushare.ContainerRequest{side, initReq("i", 1, 4), regularReq("a", 0, 2)},
		// per GPU: sidecar 1, init 2 (+1 sidecar) = 3, regular 1 + sidecar 1 = 2 → 3
		want: map[int]uint64{0: 3, 1: 3},
	}, {
		name: "four GPUs",
		p: gpushare.PodAssignment{GPUIndex: 0, Allocation: gpushare.Allocation{
			0: {0: 1, 1: 1, 2: 1, 3: 1}, 1: {0: 3, 1: 3, 2: 3, 3: 3},
		}},
		reqs: []gpushare.ContainerRequest{regularReq("a", 0, 4), regularReq("b", 1, 12)},
		want: map[int]uint64{0: 4, 1: 4, 2: 4, 3: 4},
	}} {
		got, err := tt.p.Charges(tt.reqs)
		if err != nil || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s: Charges = %v, %v; want %v", tt.name, got, err, tt.want)
		}
	}
}

func TestChargesBySet(t *testing.T) {
	reqs := []gpushare.ContainerRequest{initReq("i", 0, 9), regularReq("a", 0, 9), regularReq("b", 1, 5)}
	sets := map[string]gpushare.GPUSet{
		"i": gpushare.NewGPUSet(0, 1, 2),
		"a": gpushare.NewGPUSet(0, 1, 2),
		"b": gpushare.NewGPUSet(7),
	}
	got := gpushare.ChargesBySet(reqs, func(c gpushare.ContainerRequest) gpushare.GPUSet { return sets[c.Name] })
	// a: 3 on each of 0-2 (the init's 3 there peaks equal); b: 5 on 7 alone.
	if want := map[int]uint64{0: 3, 1: 3, 2: 3, 7: 5}; !reflect.DeepEqual(got, want) {
		t.Errorf("ChargesBySet = %v; want %v", got, want)
	}
	// With one-GPU sets it is ChargesByGPU.
	gpuOf := func(c gpushare.ContainerRequest) int { return c.Index * 2 }
	bySet := gpushare.ChargesBySet(reqs, func(c gpushare.ContainerRequest) gpushare.GPUSet { return gpushare.NewGPUSet(gpuOf(c)) })
	if byGPU := gpushare.ChargesByGPU(reqs, gpuOf); !reflect.DeepEqual(bySet, byGPU) || !reflect.DeepEqual(byGPU, map[int]uint64{0: 9, 2: 5}) {
		t.Errorf("ChargesBySet with one-GPU sets = %v; ChargesByGPU = %v", bySet, byGPU)
	}
}

func TestAllocationForSet(t *testing.T) {
	reqs := []gpushare.ContainerRequest{
		initReq("setup", 0, 8),
		regularReq("a", 0, 4),
		regularReq("b", 1, 6),
		regularReq("none", 2, 0),
	}
	for _, tt := range []struct {
		name string
		reqs []gpushare.ContainerRequest
		set  gpushare.GPUSet
		want gpushare.Allocation
		enc  string
	}{{
		name: "two GPUs",
		reqs: reqs,
		set:  gpushare.NewGPUSet(1, 3),
		want: gpushare.Allocation{0: {1: 2, 3: 2}, 1: {1: 3, 3: 3}},
		enc:  `{"0":{"1":2,"3":2},"1":{"1":3,"3":3}}`,
	}, {
		name: "numeric key order",
		reqs: []gpushare.ContainerRequest{regularReq("a", 10, 6), regularReq("b", 2, 3)},
		set:  gpushare.NewGPUSet(10, 2, 11),
		want: gpushare.Allocation{10: {2: 2, 10: 2, 11: 2}, 2: {2: 1, 10: 1, 11: 1}},
		enc:  `{"2":{"2":1,"10":1,"11":1},"10":{"2":2,"10":2,"11":2}}`,
	}, {
		name: "one GPU is AllocationForGPU",
		reqs: reqs,
		set:  gpushare.NewGPUSet(5),
		want: gpushare.AllocationForGPU(reqs, 5),
		enc:  `{"0":{"5":4},"1":{"5":6}}`,
	}, {
		name: "only init containers",
		reqs: []gpushare.ContainerRequest{initReq("setup", 0, 8)},
		set:  gpushare.NewGPUSet(0, 1),
	}, {
		name: "empty set",
		reqs: reqs,
		set:  0,
	}} {
		got := gpushare.AllocationForSet(tt.reqs, tt.set)
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s: AllocationForSet = %v; want %v", tt.name, got, tt.want)
			continue
		}
		if tt.want == nil {
			continue
		}
		enc, err := gpushare.EncodeAllocation(got)
		if err != nil || enc != tt.enc {
			t.Errorf("%s: EncodeAllocation = %s, %v; want %s", tt.name, enc, err, tt.enc)
		}
		back, err := gpushare.DecodeAllocation(enc)
		if err != nil || !reflect.DeepEqual(back, got) {
			t.Errorf("%s: DecodeAllocation(%s) = %v, %v; want %v", tt.name, enc, back, err, got)
		}
	}
}

// What the extender writes for a multi-GPU pod passes the annotations and
// gives every container the set back.
func TestAllocationForSetRoundTripsThroughAnnotations(t *testing.T) {
	set := gpushare.NewGPUSet(2, 3)
	reqs := []gpushare.ContainerRequest{initReq("setup", 0, 8), regularReq("a", 0, 4), regularReq("b", 1, 6)}
	p := gpushare.PodAssignment{
		GPUIndex: set.First(), PodUnits: gpushare.PodUnits(reqs), DevUnits: 80, Assigned: true, AssumeTime: 1,
		Allocation: gpushare.AllocationForSet(reqs, set),
	}
	ann, err := p.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if got := ann[gpushare.AnnotationGPUIndex]; got != "2" {
		t.Errorf("IDX annotation = %q; want \"2\"", got)
	}
	back, ok, err := gpushare.DecodePodAssignment(ann)
	if err != nil || !ok || !reflect.DeepEqual(back, p) {
		t.Fatalf("DecodePodAssignment(%v) = %+v, %v, %v; want %+v", ann, back, ok, err, p)
	}
	sets, err := back.ContainerSets(reqs)
	if want := map[int]gpushare.GPUSet{0: set, 1: set}; err != nil || !reflect.DeepEqual(sets, want) {
		t.Errorf("ContainerSets = %v, %v; want %v", sets, err, want)
	}
	if s, err := back.SetFor(reqs[0]); err != nil || s != set {
		t.Errorf("SetFor(init) = %v, %v; want %v", s, err, set)
	}
	charges, err := back.Charges(reqs)
	if want := map[int]uint64{2: 5, 3: 5}; err != nil || !reflect.DeepEqual(charges, want) {
		t.Errorf("Charges = %v, %v; want %v", charges, err, want)
	}
}
