package dra

import (
	"os"
	"reflect"
	"slices"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/test/packing"
)

// pods makes a workload of the given sizes, one second apart, each living
// an hour; a size of the form {GiB, GPUs} is a multi-GPU pod.
func pods(sizes ...[2]int) []packing.Pod {
	out := make([]packing.Pod, len(sizes))
	for i, s := range sizes {
		out[i] = packing.Pod{ID: i, At: float64(i), GiB: uint64(s[0]), Life: 3600}
		if s[1] > 1 {
			out[i].GPUs = s[1]
		}
	}
	return out
}

func one(gib ...int) [][2]int {
	out := make([][2]int, len(gib))
	for i, g := range gib {
		out[i] = [2]int{g, 1}
	}
	return out
}

// twoByEight is one node of two 8 GiB GPUs.
var twoByEight = packing.Fleet{Name: "1x2x8GiB", Types: []packing.NodeType{{Count: 1, GPUs: 2, GiB: 8}}}

// place drives a placer by hand, charging the snapshots as the simulation
// does, and returns the GPU each pod got (-1: it fit nowhere).
func place(t *testing.T, f packing.Fleet, opt packing.Options, nvlink bool, ps []packing.Pod) ([]int, *Placer) {
	t.Helper()
	pl, err := newPlacer(f, opt, nvlink)
	if err != nil {
		t.Fatal(err)
	}
	nodes := f.Nodes()
	var got []int
	for _, p := range ps {
		at, ok, err := pl.Place(p, nodes)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			got = append(got, -1)
			continue
		}
		for idx, gib := range at.Charges {
			g := &nodes[at.Node].GPUs[idx]
			if g.Used+gib > g.Units {
				t.Fatalf("pod %d: GPU %d over-committed", p.ID, idx)
			}
			g.Used += gib
			got = append(got, idx)
		}
	}
	return got, pl
}

// TestFirstFitByHand: on one node of 2 x 8 GiB, pods of 4, 4, 4, 2, 2 GiB
// go first fit in slice order: GPU 0 takes the first two 4s and is full,
// GPU 1 the rest (16 GiB: the node is full); one more pod of 1 GiB fits
// nowhere. Then 3, 6, 2, 5: 3 on GPU 0, 6 on GPU 1, 2 on GPU 0 (the first
// that fits; best fit would close GPU 1), and 5 fits nowhere, where the
// extender's bestfit places all four.
func TestFirstFitByHand(t *testing.T) {
	for _, ties := range []packing.Tie{packing.TieLowest, packing.TieRandom} {
		opt := packing.Options{Ties: ties, Seed: 3}
		got, pl := place(t, twoByEight, opt, false, pods(one(4, 4, 4, 2, 2, 1)...))
		if want := []int{0, 0, 1, 1, 1, -1}; !reflect.DeepEqual(got, want) {
			t.Errorf("%v: GPUs %v, want %v", ties, got, want)
		}
		if pl.Fits != 5 || pl.Calls != 5 {
			t.Errorf("%v: %d Allocate calls, %d fits; want 5 and 5 (the last pod skipped by the pre-filter)", ties, pl.Calls, pl.Fits)
		}
		got, _ = place(t, twoByEight, opt, false, pods(one(3, 6, 2, 5)...))
		if want := []int{0, 1, 0, -1}; !reflect.DeepEqual(got, want) {
			t.Errorf("%v: GPUs %v, want %v", ties, got, want)
		}
	}
	// The same through the simulation: Fill stops at the first pod that
	// fits nowhere.
	ws := pods(one(4, 4, 4, 2, 2, 1)...)
	r, err := packing.Fill(twoByEight, ws, packing.Options{Placer: New(false)})
	if err != nil {
		t.Fatal(err)
	}
	if r.Pods != 5 || r.PlacedGiB != 16 || r.Complete || r.FailedGiB != 1 || r.CardsOpened != 2 || r.FreeGiB != 0 {
		t.Errorf("fill %+v: want 5 pods, 16 GiB, stopped at the 1 GiB pod, 2 cards", r)
	}
	ws = pods(one(3, 6, 2, 5)...)
	r, err = packing.Fill(twoByEight, ws, packing.Options{Placer: New(false)})
	if err != nil || r.Pods != 3 || r.FailedGiB != 5 || r.LargestFree != 3 {
		t.Errorf("fill 3,6,2,5: %+v %v: want 3 pods, stopped at 5 GiB, 3 GiB the largest free", r, err)
	}
	if b, err := packing.Fill(twoByEight, ws, packing.Options{Policy: allocator.BestFit}); err != nil || !b.Complete || b.Pods != 4 {
		t.Errorf("bestfit on 3,6,2,5: %+v %v: want all four", b, err)
	}
}

// checked wraps a placer and checks it after every step: no device's
// consumed memory (added up from the allocation results held) over its
// capacity, the allocated state given to the allocator equal to that sum,
// the simulation's snapshots equal to it too, and every multi-GPU pod on
// distinct devices (of one NVLink domain when nvlink).
type checked struct {
	t        *testing.T
	pl       *Placer
	nvlink   bool
	steps    int
	multi    int
	lastNode []allocator.Node
}

func (c *checked) Place(p packing.Pod, nodes []allocator.Node) (packing.Placement, bool, error) {
	c.check(nodes)
	at, ok, err := c.pl.Place(p, nodes)
	if err != nil || !ok {
		return at, ok, err
	}
	res := c.pl.nodes[at.Node].claims[p.ID]
	n := c.pl.nodes[at.Node]
	seen := map[string]bool{}
	domains := map[string]bool{}
	for _, r := range res.Devices.Results {
		if seen[r.Device] {
			c.t.Errorf("pod %d: device %s allocated twice: %+v", p.ID, r.Device, res.Devices.Results)
		}
		seen[r.Device] = true
		for _, s := range n.slices {
			for _, d := range s.Spec.Devices {
				if a, ok := d.Attributes[gpushare.DRAAttributeNVLinkDomain]; ok && d.Name == r.Device {
					domains[*a.StringValue] = true
				}
			}
		}
	}
	if len(seen) != p.Count() || len(at.Charges) != p.Count() {
		c.t.Errorf("pod %d asks for %d GPUs, got devices %v, charges %v", p.ID, p.Count(), seen, at.Charges)
	}
	if p.Count() > 1 {
		c.multi++
		if c.nvlink && len(domains) != 1 {
			c.t.Errorf("pod %d (required topology) spans NVLink domains %v", p.ID, domains)
		}
	}
	return at, ok, err
}

func (c *checked) Release(p packing.Pod) error {
	err := c.pl.Release(p)
	c.check(nil)
	return err
}

func (c *checked) check(nodes []allocator.Node) {
	c.steps++
	consumed := c.pl.Consumed()
	for i, n := range c.pl.nodes {
		for dev, b := range consumed[i] {
			if b > n.size[dev] {
				c.t.Fatalf("step %d: node %s device %s: %d bytes consumed of %d", c.steps, n.obj.Name, dev, b, n.size[dev])
			}
			if nodes != nil {
				if used := nodes[i].GPUs[n.gpuOf[dev]].Used; uint64(b) != used<<30 {
					c.t.Fatalf("step %d: node %s device %s: results consume %d bytes, the snapshot %d GiB", c.steps, n.obj.Name, dev, b, used)
				}
			}
		}
		for id, cc := range n.state.AggregatedCapacity {
			q := cc[gpushare.DRACapacityMemory]
			if q == nil || q.Value() != consumed[i][id.Device.String()] {
				c.t.Fatalf("step %d: node %s device %s: allocated state %v, results %d", c.steps, n.obj.Name, id.Device, q, consumed[i][id.Device.String()])
			}
		}
		if len(n.state.AggregatedCapacity) != len(consumed[i]) || len(n.state.AllocatedDevices) != 0 {
			c.t.Fatalf("step %d: node %s: allocated state on %d devices (%d whole), results on %d", c.steps, n.obj.Name,
				len(n.state.AggregatedCapacity), len(n.state.AllocatedDevices), len(consumed[i]))
		}
	}
}

// churn replays a short generated workload through a checked DRA placer.
func churn(t *testing.T, f packing.Fleet, m packing.Mix, lives float64, ties packing.Tie, nvlink, exhaustive bool) (packing.ChurnResult, *checked) {
	return churnWith(t, f, m, lives, ties, nvlink, exhaustive, false)
}

// churnWith is churn, with scored ordering the nodes by gpushare-scheduler's DRA score.
func churnWith(t *testing.T, f packing.Fleet, m packing.Mix, lives float64, ties packing.Tie, nvlink, exhaustive, scored bool) (packing.ChurnResult, *checked) {
	t.Helper()
	spec := packing.GenSpec{Mix: m, Seed: 11, CapacityGiB: f.CapacityGiB(), Load: 1.2, Horizon: lives * m.Life.Mean}
	ws, err := packing.Generate(spec)
	if err != nil {
		t.Fatal(err)
	}
	var c *checked
	mk := func(f packing.Fleet, opt packing.Options) (packing.Placer, error) {
		pl, err := newPlacer(f, opt, nvlink)
		pl.scored = scored
		c = &checked{t: t, pl: pl, nvlink: nvlink}
		return c, err
	}
	opt := packing.ChurnOptions{Options: packing.Options{Ties: ties, Seed: 4, Placer: mk, Exhaustive: exhaustive}, SampleEvery: 600}
	res, err := packing.Churn(f, ws, opt)
	if err != nil {
		t.Fatal(err)
	}
	if res.Placements == 0 || res.Departures == 0 || res.EndPending+res.EndRunning+res.Departures+res.Rejected != res.Arrived {
		t.Fatalf("churn: %+v", res)
	}
	if res.EndRunning != len(c.pl.where) {
		t.Fatalf("%d pods running, the placer holds %d claims", res.EndRunning, len(c.pl.where))
	}
	return res, c
}

// islands is four 8 x 80 GiB nodes, two NVLink islands of four GPUs each.
var islands = packing.Fleet{Name: "4x8x80GiB-islands", Types: []packing.NodeType{{Count: 4, GPUs: 8, GiB: 80, Topology: packing.TopologyIslands}}}

// TestNeverOvercommits replays churn on a small fleet of mixed GPUs and
// checks, before and after every placement and departure, that no device
// holds more than its memory and that the allocator's state, the results
// and the simulation's snapshots agree.
func TestNeverOvercommits(t *testing.T) {
	f := packing.Fleet{Name: "mixed-small", Types: []packing.NodeType{{Count: 2, GPUs: 4, GiB: 24}, {Count: 1, GPUs: 8, GiB: 48}}}
	for _, ties := range []packing.Tie{packing.TieRandom, packing.TieLowest} {
		res, c := churn(t, f, packing.UniformMix(), 6, ties, false, false)
		if c.steps < 2*res.Placements {
			t.Errorf("%v: %d checks for %d placements", ties, c.steps, res.Placements)
		}
	}
}

// TestMultiGPU: every multi-GPU pod gets distinct GPUs; with the topology
// required (matchAttribute on the NVLink domain) all of one domain, so the
// run honours the topology every time; preferred (the alternatives, one
// domain then any) crosses islands where a node has no island free.
func TestMultiGPU(t *testing.T) {
	for _, nvlink := range []bool{false, true} {
		res, c := churn(t, islands, packing.MultiGPUMix(), 6, packing.TieRandom, nvlink, false)
		top := res.Topology
		if top == nil || top.Placed == 0 || top.Placed != c.multi {
			t.Fatalf("nvlink %v: topology %+v, %d multi-GPU placements seen", nvlink, top, c.multi)
		}
		if nvlink && top.Honoured != top.Placed {
			t.Errorf("required topology honoured %d of %d", top.Honoured, top.Placed)
		}
		if !nvlink && top.Honoured == top.Placed {
			t.Errorf("the preferred topology honoured every set (%d): the requirement leaked in", top.Placed)
		}
		t.Logf("nvlink %v: %d multi-GPU placements, %d honoured", nvlink, top.Placed, top.Honoured)
	}
}

// TestPrefilterChangesNothing: skipping the nodes without room changes no
// result, and the allocator never fits a node the pre-filter skips.
func TestPrefilterChangesNothing(t *testing.T) {
	for _, ties := range []packing.Tie{packing.TieRandom, packing.TieLowest} {
		for _, nvlink := range []bool{false, true} {
			fast, cf := churn(t, islands, packing.MultiGPUMix(), 2, ties, nvlink, false)
			slow, cs := churn(t, islands, packing.MultiGPUMix(), 2, ties, nvlink, true)
			t.Logf("%v nvlink %v: %d Allocate calls, %d exhaustive", ties, nvlink, cf.pl.Calls, cs.pl.Calls)
			if !reflect.DeepEqual(fast, slow) {
				t.Errorf("%v nvlink %v: pre-filtered %+v, exhaustive %+v", ties, nvlink, fast.Topology, slow.Topology)
			}
			if cf.pl.Calls >= cs.pl.Calls {
				t.Errorf("%v nvlink %v: the pre-filter saved nothing (%d calls, %d without)", ties, nvlink, cf.pl.Calls, cs.pl.Calls)
			}
		}
	}
}

// TestClaims: the claims are the webhook's: one request of the class with
// the pod's memory; a multi-GPU pod's request spans count distinct GPUs
// (distinctAttribute uuid) of GiB/count each; the required topology adds
// matchAttribute on the NVLink domain, the preferred one asks for the same
// GPUs as two alternatives, the first alone under that constraint.
func TestClaims(t *testing.T) {
	single, err := Claim(packing.Pod{GiB: 4, Life: 1}, false)
	if err != nil {
		t.Fatal(err)
	}
	r := single.Spec.Devices.Requests
	if len(r) != 1 || r[0].Exactly == nil || r[0].Exactly.Count != 1 || r[0].Exactly.DeviceClassName != gpushare.DRADeviceClassName ||
		gib(r[0].Exactly.Capacity.Requests[gpushare.DRACapacityMemory]) != "4Gi" || len(single.Spec.Devices.Constraints) != 0 {
		t.Errorf("single-GPU claim %+v", single.Spec.Devices)
	}
	attr := func(name string) resourceapi.FullyQualifiedName {
		return resourceapi.FullyQualifiedName(gpushare.DRADriverName + "/" + name)
	}
	for _, required := range []bool{false, true} {
		c, err := Claim(packing.Pod{GiB: 64, GPUs: 4, Life: 1}, required)
		if err != nil {
			t.Fatal(err)
		}
		r := c.Spec.Devices.Requests
		var asks []resourceapi.ExactDeviceRequest
		switch {
		case len(r) != 1:
		case required && r[0].Exactly != nil:
			asks = append(asks, *r[0].Exactly)
		case !required && len(r[0].FirstAvailable) == 2:
			for _, sub := range r[0].FirstAvailable {
				asks = append(asks, resourceapi.ExactDeviceRequest{Count: sub.Count, Capacity: sub.Capacity})
			}
		}
		if len(asks) == 0 {
			t.Errorf("required %v: requests %+v", required, r)
		}
		for _, a := range asks {
			if a.Count != 4 || gib(a.Capacity.Requests[gpushare.DRACapacityMemory]) != "16Gi" {
				t.Errorf("required %v: requests %+v", required, r)
			}
		}
		var distinct, match []resourceapi.FullyQualifiedName
		for _, k := range c.Spec.Devices.Constraints {
			if k.DistinctAttribute != nil {
				distinct = append(distinct, *k.DistinctAttribute)
			}
			if k.MatchAttribute != nil {
				match = append(match, *k.MatchAttribute)
				if !required && !reflect.DeepEqual(k.Requests, []string{"gpu-0/linked"}) {
					t.Errorf("preferred: the NVLink constraint applies to %v, want the linked alternative only", k.Requests)
				}
			}
		}
		if !reflect.DeepEqual(distinct, []resourceapi.FullyQualifiedName{attr(gpushare.DRAAttributeUUID)}) {
			t.Errorf("required %v: distinct %v", required, distinct)
		}
		if want := []resourceapi.FullyQualifiedName{attr(gpushare.DRAAttributeNVLinkDomain)}; !reflect.DeepEqual(match, want) {
			t.Errorf("required %v: match %v, want %v", required, match, want)
		}
	}
}

func gib(q resource.Quantity) string { return q.String() }

// TestSlices: an islands node publishes its eight GPUs in index order, 80
// GiB each, consumable in GiB steps, in two NVLink domains of four; a node
// without topology publishes no domain.
func TestSlices(t *testing.T) {
	n, err := newNode("n0001", 1, packing.NodeType{Count: 1, GPUs: 8, GiB: 80, Topology: packing.TopologyIslands})
	if err != nil {
		t.Fatal(err)
	}
	if len(n.slices) != 1 || len(n.slices[0].Spec.Devices) != 8 || *n.slices[0].Spec.NodeName != "n0001" || n.slices[0].Spec.Pool.Name != "n0001" {
		t.Fatalf("slices %+v", n.slices)
	}
	domain := map[int]string{}
	for i, d := range n.slices[0].Spec.Devices {
		mem := d.Capacity[gpushare.DRACapacityMemory]
		if n.gpuOf[d.Name] != i || mem.Value.String() != "80Gi" || mem.RequestPolicy.ValidRange.Step.String() != "1Gi" || d.AllowMultipleAllocations == nil || !*d.AllowMultipleAllocations {
			t.Errorf("device %d: %+v", i, d)
		}
		domain[i] = *d.Attributes[gpushare.DRAAttributeNVLinkDomain].StringValue
	}
	if domain[0] != domain[3] || domain[4] != domain[7] || domain[3] == domain[4] {
		t.Errorf("NVLink domains %v: want 0-3 and 4-7", domain)
	}
	plain, err := newNode("n0002", 2, packing.NodeType{Count: 1, GPUs: 4, GiB: 24})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := plain.slices[0].Spec.Devices[0].Attributes[gpushare.DRAAttributeNVLinkDomain]; ok {
		t.Error("a node without topology published an NVLink domain")
	}
}

// TestDeviceClassIsTheManifest: the class the allocator is given is the one
// manifests/dra installs.
func TestDeviceClassIsTheManifest(t *testing.T) {
	b, err := os.ReadFile("../../../../../manifests/dra/deviceclass.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var c resourceapi.DeviceClass
	if err := yaml.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	if want := DeviceClass(); c.Name != want.Name || !reflect.DeepEqual(c.Spec, want.Spec) {
		t.Errorf("manifest %+v, simulation %+v", c.Spec, want.Spec)
	}
}

// TestRuns: dra, dra/lowest and dra/scored everywhere, dra/nvlink and its scored run for multi-GPU
// workloads, and a release of a pod never placed is an error.
func TestRuns(t *testing.T) {
	for _, s := range packing.Scenarios() {
		var names []string
		for _, r := range Runs(s) {
			names = append(names, r.Name())
		}
		want := []string{"dra", "dra/lowest", "dra/scored"}
		if s.Gen.Mix.MultiGPU() {
			want = []string{"dra", "dra/lowest", "dra/nvlink", "dra/scored", "dra/nvlink/scored"}
		}
		if !reflect.DeepEqual(names, want) {
			t.Errorf("%s: runs %v, want %v", s.Name, names, want)
		}
	}
	pl, err := newPlacer(twoByEight, packing.Options{}, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := pl.Release(packing.Pod{ID: 3}); err == nil {
		t.Error("released a pod never placed")
	}
	if _, _, err := pl.Place(packing.Pod{ID: 1, GiB: 9, Life: 1}, twoByEight.Nodes()); err != nil {
		t.Errorf("a pod larger than every GPU: %v (want no fit, no error)", err)
	}
}

// TestScoredPredictsTheAllocator: under churn on mixed and islands fleets,
// single and multi-GPU, with and without the required topology, every node
// the scored run tries gets exactly the devices drascore.Predict named for
// it (or no fit where it named none): the score rates the allocation the
// real allocator makes. And it packs: the scored runs open no more GPUs
// than kube-scheduler's random choice of node.
func TestScoredPredictsTheAllocator(t *testing.T) {
	mixed := packing.Fleet{Name: "mixed-small", Types: []packing.NodeType{{Count: 2, GPUs: 4, GiB: 24}, {Count: 1, GPUs: 8, GiB: 48}}}
	for _, tc := range []struct {
		f      packing.Fleet
		m      packing.Mix
		nvlink bool
	}{{mixed, packing.UniformMix(), false}, {islands, packing.MultiGPUMix(), false}, {islands, packing.MultiGPUMix(), true}} {
		res, c := churnWith(t, tc.f, tc.m, 4, packing.TieRandom, tc.nvlink, false, true)
		if c.pl.Mispredicted != 0 || c.pl.Predicted < res.Placements {
			t.Errorf("%s nvlink %v: %d allocations predicted, %d not, %d placements", tc.f.Name, tc.nvlink, c.pl.Predicted, c.pl.Mispredicted, res.Placements)
		}
		t.Logf("%s nvlink %v: %d of %d tried allocations predicted", tc.f.Name, tc.nvlink, c.pl.Predicted, c.pl.Predicted+c.pl.Mispredicted)
	}
}

// TestScoredPacksByHand: on two nodes of one 80 GiB GPU, 8 GiB pods in
// the scored run all go to the node the first one opened (bestfit), where
// the unscored run's random node choice spreads them; the tenth pod
// fills the first node and the eleventh opens the second.
func TestScoredPacksByHand(t *testing.T) {
	f := packing.Fleet{Name: "2x1x80GiB", Types: []packing.NodeType{{Count: 2, GPUs: 1, GiB: 80}}}
	sizes := make([]int, 11)
	for i := range sizes {
		sizes[i] = 8
	}
	nodesOf := func(scored bool) []int {
		pl, err := newPlacer(f, packing.Options{Ties: packing.TieRandom, Seed: 5}, false)
		if err != nil {
			t.Fatal(err)
		}
		pl.scored = scored
		snap := f.Nodes()
		var out []int
		for _, p := range pods(one(sizes...)...) {
			at, ok, err := pl.Place(p, snap)
			if err != nil || !ok {
				t.Fatalf("pod %d: %v %v", p.ID, ok, err)
			}
			snap[at.Node].GPUs[0].Used += p.GiB
			out = append(out, at.Node)
		}
		return out
	}
	got := nodesOf(true)
	for i, n := range got[:10] {
		if n != got[0] {
			t.Fatalf("scored: pod %d on node %d, pod 0 on %d: %v", i, n, got[0], got)
		}
	}
	if got[10] == got[0] {
		t.Errorf("scored: the eleventh pod on the full node: %v", got)
	}
	random := nodesOf(false)
	if slices.Equal(random[:10], got[:10]) {
		t.Errorf("the unscored run packed the same (%v): the test cannot tell the score's effect", random)
	}
}

// BenchmarkAllocate is one Allocate call that fits: a 4 GiB pod on an
// 8 x 80 GiB islands node already holding 16 claims, and, for a four-GPU
// pod, one that fits nowhere.
func BenchmarkAllocate(b *testing.B) {
	f := packing.Fleet{Name: "1x8x80GiB-islands", Types: []packing.NodeType{{Count: 1, GPUs: 8, GiB: 80, Topology: packing.TopologyIslands}}}
	pl, err := newPlacer(f, packing.Options{}, false)
	if err != nil {
		b.Fatal(err)
	}
	nodes := f.Nodes()
	for i := range 16 {
		if _, ok, err := pl.Place(packing.Pod{ID: i, GiB: 30, Life: 1}, nodes); err != nil || !ok {
			b.Fatal(ok, err)
		}
	}
	for _, c := range []struct {
		name string
		pod  packing.Pod
		fits bool
	}{
		{"fits", packing.Pod{ID: 100, GiB: 4, Life: 1}, true},
		{"four-GPUs-fits-nowhere", packing.Pod{ID: 101, GiB: 96, GPUs: 4, Life: 1}, false},
	} {
		claim, err := pl.claim(c.pod)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if _, ok, err := pl.allocate(0, claim); err != nil || ok != c.fits {
					b.Fatal(ok, err)
				}
			}
		})
	}
}
