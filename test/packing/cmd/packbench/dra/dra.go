// Package dra replays the packing benchmark's pods (test/packing) through
// kube-scheduler's own DRA allocator, k8s.io/dynamic-resource-allocation's
// structured allocator, as DRA mode runs them (docs/dra.md): no placement
// rule is re-implemented here.
//
// Every node publishes the ResourceSlice the gpushare DRA driver would
// (plugin/dra/slice: one device per GPU, its memory consumable capacity in
// GiB, the NVLink domain read from the node's simulated topology), every pod
// becomes the ResourceClaim the webhook would make of it
// (webhook/translate, from a pod object with the container's gpu-mem limit,
// the gpu-count label and, for the nvlink variant, the topology annotation
// "required"), and the DeviceClass is manifests/dra's. For each node a pod
// is tried on, a fresh allocator is given that node's slice and the
// allocated state of the claims on it (what kube-scheduler's claim tracker
// gathers: every shared device ID and the consumed capacity per device),
// with kube-scheduler 1.37's default DRA features; its AllocationResult,
// device, consumed capacity and share ID, is what the pod holds until it
// departs.
//
// kube-scheduler chooses the node by its scores, and none of them sees a
// DRA device's capacity, so every node where the allocator succeeds scores
// the same and selectHost picks one of them at random: the run "dra" models
// that with a seeded random choice, uniform among the nodes where Allocate
// succeeds (the first success in a seeded random order of the nodes, which
// is the same distribution without asking every node). "dra/lowest" takes
// the lowest node index instead, as a deterministic reference. The GPU within
// the node is the allocator's: the first devices in slice order that fit.
// "dra/scored" (and "dra/nvlink/scored") adds gpushare-scheduler's DRA
// score (extender/drascore, bestfit): the node is the highest-scoring one
// where the allocator succeeds, ties at random, as selectHost picks when
// every other score is equal (the simulated pods request no CPU or memory).
//
// This is a module apart from test/packing because the structured allocator
// pulls CEL and the API server's libraries, which the project's go.mod does
// not require; test/packing takes it through packing.Options.Placer.
package dra

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/extender/drascore"
	"github.com/gpushare/gpushare/plugin/dra/slice"
	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/test/packing"
	"github.com/gpushare/gpushare/webhook/translate"
)

// Features are kube-scheduler 1.37's default DRA features
// (pkg/features: DRAAdminAccess, DRAPrioritizedList,
// DRAPartitionableDevices, DRADeviceTaints, DRADeviceBindingConditions with
// DRAResourceClaimDeviceStatus, DRAConsumableCapacity and
// DRAFractionalCapacityRange on; DRAListTypeAttributes,
// DRAOptionalNodeOperations, DRADerivedAttributes and
// DRADeviceCompatibilityGroups off), as the DynamicResources plugin hands
// them to structured.NewAllocator.
var Features = structured.Features{
	AdminAccess:             true,
	PrioritizedList:         true,
	PartitionableDevices:    true,
	DeviceTaints:            true,
	DeviceBindingAndStatus:  true,
	ConsumableCapacity:      true,
	FractionalCapacityRange: true,
}

// Namespace is where the simulated pods and their claims live.
const Namespace = "default"

// DeviceClass is manifests/dra/deviceclass.yaml: every device of the driver.
func DeviceClass() *resourceapi.DeviceClass {
	return &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: gpushare.DRADeviceClassName},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: `device.driver == "` + gpushare.DRADriverName + `"`}}}},
	}
}

// Runs are the DRA runs of scenario s: "dra" (random node among those the
// allocator fits, kube-scheduler's choice), "dra/lowest" (the lowest such
// node), "dra/scored" (the node gpushare-scheduler's DRA score ranks
// first), and for a workload of multi-GPU pods "dra/nvlink" and
// "dra/nvlink/scored": every multi-GPU pod translated as topology
// "required" (matchAttribute on the NVLink domain). The workloads' pods ask
// for the default, preferred, which the webhook translates as alternatives:
// the GPUs of one NVLink domain, else any.
func Runs(s packing.Scenario) []packing.Run {
	runs := []packing.Run{
		{Label: "dra", Ties: packing.TieRandom, Placer: New(false)},
		{Label: "dra/lowest", Ties: packing.TieLowest, Placer: New(false)},
	}
	// Appended after the earlier runs: a run's seed is its position.
	multi := s.Gen.Mix.MultiGPU()
	if multi {
		runs = append(runs, packing.Run{Label: "dra/nvlink", Ties: packing.TieRandom, Placer: New(true)})
	}
	runs = append(runs, packing.Run{Label: "dra/scored", Ties: packing.TieRandom, Placer: NewScored(false)})
	if multi {
		runs = append(runs, packing.Run{Label: "dra/nvlink/scored", Ties: packing.TieRandom, Placer: NewScored(true)})
	}
	return runs
}

// New returns the DRA placer's constructor; nvlink translates multi-GPU
// pods as topology "required".
func New(nvlink bool) packing.NewPlacer {
	return func(f packing.Fleet, opt packing.Options) (packing.Placer, error) {
		return newPlacer(f, opt, nvlink)
	}
}

// NewScored is New with gpushare-scheduler's DRA score choosing the node.
func NewScored(nvlink bool) packing.NewPlacer {
	return func(f packing.Fleet, opt packing.Options) (packing.Placer, error) {
		p, err := newPlacer(f, opt, nvlink)
		if err != nil {
			return nil, err
		}
		p.scored = true
		return p, nil
	}
}

// Placer is one run's DRA scheduler: every node's slice and claims.
type Placer struct {
	opt     packing.Options
	nvlink  bool
	scored  bool // order the nodes by drascore.Score
	pcg     *rand.PCG
	rng     *rand.Rand
	placed  uint64 // placements so far: with the pod's ID, the seed of its order
	ctx     context.Context
	classes classLister
	cel     *cel.Cache
	nodes   []*node
	claims  map[shapeKey]*resourceapi.ResourceClaim
	where   map[int]int // pod ID -> node index
	// Calls counts Allocate calls, Fits those that found room.
	Calls, Fits int
	// Predicted counts the scored run's allocations whose devices
	// drascore.Predict named beforehand, Mispredicted those it did not.
	Predicted, Mispredicted int
}

// node is one node's published slice and the claims allocated on it.
type node struct {
	obj    *corev1.Node
	slices []*resourceapi.ResourceSlice
	gpuOf  map[string]int   // device name -> GPU index
	size   map[string]int64 // device name -> memory capacity, bytes
	// claims are the allocation results of the pods on the node, by pod ID.
	claims map[int]resourceapi.AllocationResult
	// state is what kube-scheduler's claim tracker gathers from them.
	state structured.AllocatedState
}

type shapeKey struct {
	gib   uint64
	count int
}

func newPlacer(f packing.Fleet, opt packing.Options, nvlink bool) (*Placer, error) {
	p := &Placer{
		opt: opt, nvlink: nvlink, ctx: context.Background(),
		pcg:     rand.NewPCG(opt.Seed, 0),
		classes: classLister{DeviceClass()},
		cel:     cel.NewCache(10, cel.Features{EnableConsumableCapacity: Features.ConsumableCapacity, EnableListTypeAttributes: Features.ListTypeAttributes}),
		claims:  map[shapeKey]*resourceapi.ResourceClaim{},
		where:   map[int]int{},
	}
	p.rng = rand.New(p.pcg)
	for i, t := range f.Layout() {
		n, err := newNode(fmt.Sprintf("n%04d", i), i, t)
		if err != nil {
			return nil, err
		}
		p.nodes = append(p.nodes, n)
	}
	return p, nil
}

// UUID is the simulated NVML UUID of GPU g of node i.
func UUID(i, g int) string { return fmt.Sprintf("GPU-%08x-0000-4000-8000-%012x", i, g) }

// model names a data-center GPU of gib GiB, for the productName attribute.
func model(gib uint64) string {
	switch gib {
	case 80:
		return "NVIDIA H100 80GB HBM3"
	case 48:
		return "NVIDIA L40S"
	case 24:
		return "NVIDIA A10"
	}
	return "NVIDIA GPU"
}

// GPUs describes node i's GPUs as the DRA driver does (plugin/dra's
// BaseGPUs): the topology reading of its profile gives each its NUMA node
// and NVLink domain (slice.NVLinkDomains), the product name its
// architecture; a node without a profile has neither.
func GPUs(i int, t packing.NodeType) []slice.GPU {
	uuids := make(map[int]string, t.GPUs)
	for g := range t.GPUs {
		uuids[g] = UUID(i, g)
	}
	reading, ok := packing.ProfileReading(t.Topology, t.GPUs)
	numa := map[int]int{}
	var domains map[int]string
	if ok {
		for _, g := range reading.GPUs {
			numa[g.Index] = g.NUMANode
		}
		domains = slice.NVLinkDomains(reading, uuids)
	}
	out := make([]slice.GPU, t.GPUs)
	for g := range out {
		m := model(t.GiB)
		arch, cc := slice.Architecture(m)
		n, known := numa[g]
		if !known {
			n = -1
		}
		out[g] = slice.GPU{Index: g, UUID: uuids[g], Model: m, MemoryMiB: t.GiB * 1024, NUMANode: n,
			NVLinkDomain: domains[g], Architecture: arch, ComputeCapability: cc, Simulated: true}
	}
	return out
}

// Slices are the ResourceSlices the driver publishes for node name with
// gpus, as the kubelet plugin helper writes slice.Resources: one pool named
// after the node, its generation 1.
func Slices(name string, gpus []slice.GPU) ([]*resourceapi.ResourceSlice, error) {
	devices, err := slice.Devices(gpus, gpushare.GiB)
	if err != nil {
		return nil, err
	}
	pool := slice.Resources(name, devices).Pools[name]
	out := make([]*resourceapi.ResourceSlice, len(pool.Slices))
	for i, s := range pool.Slices {
		out[i] = &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%s-%d", name, gpushare.DRADriverName, i)},
			Spec: resourceapi.ResourceSliceSpec{
				Driver:   gpushare.DRADriverName,
				Pool:     resourceapi.ResourcePool{Name: name, Generation: 1, ResourceSliceCount: int64(len(pool.Slices))},
				NodeName: ptr.To(name),
				Devices:  s.Devices,
			},
		}
	}
	return out, nil
}

func newNode(name string, i int, t packing.NodeType) (*node, error) {
	slices, err := Slices(name, GPUs(i, t))
	if err != nil {
		return nil, err
	}
	n := &node{
		obj:    &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}}},
		slices: slices, gpuOf: map[string]int{}, size: map[string]int64{},
		claims: map[int]resourceapi.AllocationResult{},
		state: structured.AllocatedState{
			AllocatedDevices:         sets.New[structured.DeviceID](),
			AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
			AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
		},
	}
	for _, s := range slices {
		for _, d := range s.Spec.Devices {
			idx := d.Attributes[gpushare.DRAAttributeIndex].IntValue
			mem, ok := d.Capacity[gpushare.DRACapacityMemory]
			if idx == nil || !ok {
				return nil, fmt.Errorf("node %s: device %s has no index or memory", name, d.Name)
			}
			n.gpuOf[d.Name], n.size[d.Name] = int(*idx), mem.Value.Value()
		}
	}
	return n, nil
}

// Pod is the pod object the webhook would see for p: one container
// limiting gpu-mem to p's GiB (the unit GiB), the gpu-count label for a
// multi-GPU pod, and with required the topology annotation "required".
func Pod(p packing.Pod, required bool) *corev1.Pod {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "pod-" + strconv.Itoa(p.ID), Namespace: Namespace},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{gpushare.ResourceName: *resource.NewQuantity(int64(p.GiB), resource.DecimalSI)}}}}},
	}
	if p.Count() > 1 {
		pod.Labels = map[string]string{gpushare.LabelPodGPUCount: strconv.Itoa(p.Count())}
		if required {
			pod.Annotations = map[string]string{gpushare.AnnotationTopology: gpushare.TopologyRequired}
		}
	}
	return pod
}

// Claim is the ResourceClaim the webhook's template makes for p.
func Claim(p packing.Pod, required bool) (*resourceapi.ResourceClaim, error) {
	t, ok, err := translate.Translate(Pod(p, required), gpushare.GiB)
	if err != nil || !ok {
		return nil, fmt.Errorf("translate pod %d (%d GiB on %d GPUs): ok %v: %w", p.ID, p.GiB, p.Count(), ok, err)
	}
	tmpl := t.Shape.Template(Namespace)
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: tmpl.Name + "-claim", Namespace: Namespace, UID: types.UID("claim-" + tmpl.Name)},
		Spec:       *tmpl.Spec.Spec.DeepCopy(),
	}, nil
}

// claim returns p's claim; pods of one shape share it (the allocator only
// reads it).
func (pl *Placer) claim(p packing.Pod) (*resourceapi.ResourceClaim, error) {
	k := shapeKey{p.GiB, p.Count()}
	if c, ok := pl.claims[k]; ok {
		return c, nil
	}
	c, err := Claim(p, pl.nvlink)
	if err != nil {
		return nil, err
	}
	pl.claims[k] = c
	return c, nil
}

// ErrPrefilter is a node the cheap pre-filter skipped where the allocator
// found room: the pre-filter is wrong.
var ErrPrefilter = errors.New("dra: pre-filter skipped a node that fits")

// Place tries p's claim on the nodes in the run's order (seeded random, or
// lowest index first) and takes the first where the allocator succeeds.
// The random order is drawn from the run's seed, the number of placements
// so far and p's ID, so an attempt that fits nowhere (and changes nothing)
// does not change later choices: how often the simulation retries a pod
// that cannot fit is no part of the result.
// Unless opt.Exhaustive, a node with fewer than p's GPUs with p's share
// free is skipped without asking: the allocator cannot fit it there. With
// Exhaustive every node visited is asked, and a skip it contradicts is
// ErrPrefilter.
func (pl *Placer) Place(p packing.Pod, snapshots []allocator.Node) (packing.Placement, bool, error) {
	claim, err := pl.claim(p)
	if err != nil {
		return packing.Placement{}, false, err
	}
	order := make([]int, len(pl.nodes))
	for i := range order {
		order[i] = i
	}
	pl.pcg.Seed(pl.opt.Seed^0x2545f4914f6cdd1d, pl.placed<<32|uint64(uint32(p.ID)))
	var predicted [][][]int // per node, drascore's prediction
	if pl.scored {
		for k := range order {
			pl.shuffleAt(order, k)
		}
		if predicted, err = pl.rank(order, claim); err != nil {
			return packing.Placement{}, false, err
		}
	}
	for k, i := range order {
		if !pl.scored {
			pl.shuffleAt(order, k) // drawn as the nodes are tried
			i = order[k]
		}
		room := mayFit(&snapshots[i], p.Count(), p.PerGPU())
		if !room && !pl.opt.Exhaustive {
			continue
		}
		res, ok, err := pl.allocate(i, claim)
		if err != nil {
			return packing.Placement{}, false, fmt.Errorf("pod %d on node %s: %w", p.ID, pl.nodes[i].obj.Name, err)
		}
		if ok && !room {
			return packing.Placement{}, false, fmt.Errorf("%w: pod %d on node %s", ErrPrefilter, p.ID, pl.nodes[i].obj.Name)
		}
		if pl.scored {
			pl.checkPrediction(i, predicted[i], ok, res)
		}
		if !ok {
			continue
		}
		charges, err := pl.nodes[i].charges(res)
		if err != nil {
			return packing.Placement{}, false, fmt.Errorf("pod %d on node %s: %w", p.ID, pl.nodes[i].obj.Name, err)
		}
		if _, dup := pl.where[p.ID]; dup {
			return packing.Placement{}, false, fmt.Errorf("pod %d placed twice", p.ID)
		}
		pl.nodes[i].add(p.ID, res)
		pl.where[p.ID] = i
		pl.placed++
		return packing.Placement{Node: i, Charges: charges}, true, nil
	}
	return packing.Placement{}, false, nil
}

// shuffleAt is step k of a Fisher-Yates shuffle of order, for random ties.
func (pl *Placer) shuffleAt(order []int, k int) {
	if pl.opt.Ties == packing.TieRandom {
		j := k + pl.rng.IntN(len(order)-k)
		order[k], order[j] = order[j], order[k]
	}
}

// rank orders the nodes (already in random order) by drascore.Score under
// bestfit, highest first, the nodes where it predicts no fit last; ties
// keep their random order. It returns each node's predicted devices.
func (pl *Placer) rank(order []int, claim *resourceapi.ResourceClaim) ([][][]int, error) {
	c, ok := drascore.ClaimOf([]*resourceapi.ResourceClaim{claim})
	if !ok {
		return nil, fmt.Errorf("drascore does not read the webhook's claim %s", claim.Name)
	}
	score := make([]int64, len(pl.nodes))
	predicted := make([][][]int, len(pl.nodes))
	for i, n := range pl.nodes {
		devs := n.devices()
		set, fits := drascore.Predict(devs, c)
		score[i] = -1
		if fits {
			score[i] = drascore.ScorePredicted(devs, c, set, allocator.BestFit)
		}
		predicted[i] = set
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(score[b], score[a]) })
	return predicted, nil
}

// devices reads the node as drascore sees it.
func (n *node) devices() []drascore.Device {
	return drascore.Devices(n.slices, func(pool, device string) int64 {
		id := structured.MakeDeviceID(gpushare.DRADriverName, pool, device)
		if n.state.AllocatedDevices.Has(id) {
			return n.size[device]
		}
		q := n.state.AggregatedCapacity[id][gpushare.DRACapacityMemory]
		if q == nil {
			return 0
		}
		return q.Value()
	})
}

// checkPrediction counts whether drascore.Predict named the devices the
// allocator took on node i (positions in the node's device order).
func (pl *Placer) checkPrediction(i int, want [][]int, fits bool, res resourceapi.AllocationResult) {
	var got [][]int
	if fits {
		pos := map[string]int{}
		k := 0
		for _, s := range pl.nodes[i].slices {
			for _, d := range s.Spec.Devices {
				pos[d.Name] = k
				k++
			}
		}
		byRequest := map[string][]int{}
		var names []string
		for _, r := range res.Devices.Results {
			if _, seen := byRequest[r.Request]; !seen {
				names = append(names, r.Request)
			}
			byRequest[r.Request] = append(byRequest[r.Request], pos[r.Device])
		}
		for _, name := range names {
			got = append(got, byRequest[name])
		}
	}
	if slices.EqualFunc(got, want, slices.Equal) {
		pl.Predicted++
	} else {
		pl.Mispredicted++
	}
}

// mayFit reports whether n has count GPUs with per GiB free each: what any
// allocation of count distinct devices of per each needs.
func mayFit(n *allocator.Node, count int, per uint64) bool {
	k := 0
	for _, g := range n.GPUs {
		if g.Healthy && g.Free() >= per {
			k++
		}
	}
	return k >= count
}

// allocate runs kube-scheduler's allocator for claim on node i, as its
// DynamicResources plugin's Filter does: an allocator over the node's
// slices and the allocated state, Allocate for the node. ok is false when
// the claim does not fit there.
func (pl *Placer) allocate(i int, claim *resourceapi.ResourceClaim) (resourceapi.AllocationResult, bool, error) {
	n := pl.nodes[i]
	a, err := structured.NewAllocator(pl.ctx, Features, n.state, pl.classes, n.slices, pl.cel)
	if err != nil {
		return resourceapi.AllocationResult{}, false, err
	}
	pl.Calls++
	res, err := a.Allocate(pl.ctx, n.obj, []*resourceapi.ResourceClaim{claim})
	switch {
	case errors.Is(err, structured.ErrFailedAllocationOnNode):
		return resourceapi.AllocationResult{}, false, nil
	case err != nil:
		return resourceapi.AllocationResult{}, false, err
	case len(res) == 0:
		return resourceapi.AllocationResult{}, false, nil
	case len(res) != 1:
		return resourceapi.AllocationResult{}, false, fmt.Errorf("one claim, %d results", len(res))
	}
	pl.Fits++
	return res[0], true, nil
}

// charges reads an allocation result as the GiB consumed on each GPU index.
func (n *node) charges(res resourceapi.AllocationResult) (map[int]uint64, error) {
	out := map[int]uint64{}
	for _, r := range res.Devices.Results {
		idx, ok := n.gpuOf[r.Device]
		if r.Driver != gpushare.DRADriverName || r.Pool != n.obj.Name || !ok {
			return nil, fmt.Errorf("allocated %s/%s/%s, not a GPU of the node", r.Driver, r.Pool, r.Device)
		}
		q, ok := r.ConsumedCapacity[gpushare.DRACapacityMemory]
		if !ok || r.ShareID == nil {
			return nil, fmt.Errorf("device %s allocated without consumed memory or share ID: %+v", r.Device, r)
		}
		b := q.Value()
		if b <= 0 || b%(1<<30) != 0 {
			return nil, fmt.Errorf("device %s: consumed %s, not whole GiB", r.Device, q.String())
		}
		out[idx] += uint64(b >> 30)
	}
	return out, nil
}

// deviceID is r's device, as the claim tracker keys it.
func deviceID(r resourceapi.DeviceRequestAllocationResult) structured.DeviceID {
	return structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
}

// add records pod's allocation on n, as kube-scheduler's claim tracker
// does for an allocated claim (allocatedDevices.addDevices with consumable
// capacity on): a shared device's share ID and consumed capacity, or the
// device itself when it was allocated whole.
func (n *node) add(pod int, res resourceapi.AllocationResult) {
	n.claims[pod] = res
	for _, r := range res.Devices.Results {
		id := deviceID(r)
		if r.ShareID == nil {
			n.state.AllocatedDevices.Insert(id)
			continue
		}
		n.state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
		n.state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
	}
}

// remove undoes add: the claim was deallocated.
func (n *node) remove(pod int) error {
	res, ok := n.claims[pod]
	if !ok {
		return fmt.Errorf("dra: node %s holds no claim of pod %d", n.obj.Name, pod)
	}
	delete(n.claims, pod)
	for _, r := range res.Devices.Results {
		id := deviceID(r)
		if r.ShareID == nil {
			n.state.AllocatedDevices.Delete(id)
			continue
		}
		n.state.AllocatedSharedDeviceIDs.Delete(structured.MakeSharedDeviceID(id, r.ShareID))
		n.state.AggregatedCapacity.Remove(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
	}
	return nil
}

// Release deallocates p's claim.
func (pl *Placer) Release(p packing.Pod) error {
	i, ok := pl.where[p.ID]
	if !ok {
		return fmt.Errorf("dra: pod %d is not placed", p.ID)
	}
	delete(pl.where, p.ID)
	return pl.nodes[i].remove(p.ID)
}

// Consumed adds up, per node and device, the memory the allocation results
// held now consume, in bytes, from the results themselves (not the
// allocated state the allocator is given).
func (pl *Placer) Consumed() []map[string]int64 {
	out := make([]map[string]int64, len(pl.nodes))
	for i, n := range pl.nodes {
		out[i] = map[string]int64{}
		for _, res := range n.claims {
			for _, r := range res.Devices.Results {
				q := r.ConsumedCapacity[gpushare.DRACapacityMemory]
				out[i][r.Device] += q.Value()
			}
		}
	}
	return out
}

// classLister holds the one DeviceClass.
type classLister struct{ class *resourceapi.DeviceClass }

func (c classLister) List() ([]*resourceapi.DeviceClass, error) {
	return []*resourceapi.DeviceClass{c.class}, nil
}

func (c classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	if name != c.class.Name {
		return nil, fmt.Errorf("deviceclass %q not found", name)
	}
	return c.class, nil
}
