package allocator

import (
	"fmt"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

// Policy chooses among GPUs (and nodes) that all fit a pod.
type Policy int

const (
	// BestFit fills cards before opening new ones: the GPU with the least free
	// units that fits, lowest index on ties; nodes whose cards end fuller score higher.
	BestFit Policy = iota
	// Spread balances load: the GPU with the most free units, lowest index on
	// ties; nodes whose cards end emptier score higher.
	Spread
	// FirstFit takes the lowest-index GPU that fits; every node that fits
	// scores the same, so the extender expresses no node preference. It is
	// the classic reference the packing benchmark (test/packing) compares with.
	FirstFit
)

// ParsePolicy reads a policy name: "bestfit" (also "binpack"), "spread" or "firstfit".
func ParsePolicy(s string) (Policy, error) {
	switch s {
	case "bestfit", "best-fit", "binpack":
		return BestFit, nil
	case "spread":
		return Spread, nil
	case "firstfit", "first-fit":
		return FirstFit, nil
	}
	return 0, fmt.Errorf("unknown placement policy %q: want bestfit, spread or firstfit", s)
}

// String returns the policy's canonical name.
func (p Policy) String() string {
	switch p {
	case Spread:
		return "spread"
	case FirstFit:
		return "firstfit"
	}
	return "bestfit"
}

// Set implements flag.Value.
func (p *Policy) Set(s string) error {
	v, err := ParsePolicy(s)
	if err != nil {
		return err
	}
	*p = v
	return nil
}

// GPU is one physical GPU as the extender accounts it.
type GPU struct {
	Index   int
	Units   uint64 // the GPU's memory in units
	Used    uint64 // units charged to pods on it (confirmed and assumed)
	Healthy bool
}

// Free returns the units left, zero when the GPU is over-charged (a node that
// shrank under running pods must not wrap around into huge free space).
func (g GPU) Free() uint64 {
	if g.Used >= g.Units {
		return 0
	}
	return g.Units - g.Used
}

// Slot is one container of an in-flight pod as the device plugin can tell it
// apart: its units and the GPUs it was given (one, or a multi-GPU pod's
// set). Init containers are included.
type Slot struct {
	Units uint64
	GPUs  gpushare.GPUSet
}

// InFlight is a pod bound (or being bound) to a node whose device-plugin
// Allocate has not happened yet (ASSIGNED is not "true").
type InFlight struct {
	Pod      string // namespace/name, for reasons
	PodUnits uint64 // the ALIYUN_COM_GPU_MEM_POD value the plugin hands out
	// Isolation is what the pod's annotations ask; the plugin's answer
	// (tier, compute limit) depends on it, so it is part of the signature.
	Isolation PodIsolation
	Slots     []Slot
}

// Node is an immutable snapshot of one node's GPU state. The cache builds a
// new value on every change, so a Node may be read without locks.
type Node struct {
	Name     string
	GPUShare bool  // the node advertises gpu-mem and a GPU layout
	GPUs     []GPU // sorted by Index
	InFlight []InFlight
	// Links are the node's GPU topology as its device plugin published it,
	// by position in GPUs; the zero value when it published none.
	Links LinkScores
	// Tiers are the GPUs' effective isolation tiers as the device plugin
	// publishes them, by position in GPUs; nil when every GPU offers none
	// (plugins older than tiers, or run without isolation). They sit beside
	// GPU, not in it: with a fifth field the compiler no longer keeps a GPU
	// in registers, and the filter's loops over every GPU of thousands of
	// nodes ran half again slower (BenchmarkFilterCore).
	Tiers []Tier
	// IsolationReasons says, by GPU index, why a GPU offers less than its
	// node is configured for (the MPS daemon does not answer); nil when none
	// fell back. Only reasons read it.
	IsolationReasons map[int]string
}

// TierAt returns the effective tier of n.GPUs[i].
func (n *Node) TierAt(i int) Tier {
	if n.Tiers == nil {
		return TierNone
	}
	return n.Tiers[i]
}

// Request is a pod's gpu-mem request, per container and in total, and what
// its isolation annotations ask of the GPUs.
type Request struct {
	Pod        string // namespace/name, for reasons
	Containers []gpushare.ContainerRequest
	Units      uint64 // gpushare.PodUnits(Containers)
	Isolation  PodIsolation
	// GPUs is the multi-GPU form (aliyun.com/gpu-count, gpushare.io/topology);
	// the zero value, like Count 1, is one GPU per container.
	GPUs gpushare.MultiGPU
}

// NewRequest reads pod's request, isolation annotations and multi-GPU form. A pod asking for
// nothing has Units zero; unreadable annotations are an error like an
// invalid request, since the pod cannot be placed on a guess.
func NewRequest(pod *corev1.Pod) (Request, error) {
	reqs, err := gpushare.ContainerRequests(pod)
	if err != nil {
		return Request{}, err
	}
	iso, err := ReadPodIsolation(pod.Annotations)
	if err != nil {
		return Request{}, err
	}
	name := pod.Namespace + "/" + pod.Name
	multi, err := gpushare.PodMultiGPU(name, pod.Labels, pod.Annotations, reqs)
	if err != nil {
		return Request{}, err
	}
	r := RequestOf(name, reqs)
	r.Isolation, r.GPUs = iso, multi
	return r, nil
}

// RequestOf builds the Request of pod (namespace/name) from its container
// requests as gpushare.ContainerRequests returns them, for callers that
// keep those instead of the pod; it asks nothing of isolation (set
// Isolation for that). Containers is used as is, not copied.
func RequestOf(pod string, containers []gpushare.ContainerRequest) Request {
	return Request{Pod: pod, Containers: containers, Units: gpushare.PodUnits(containers)}
}

// regular counts the regular containers that ask for gpu-mem.
func (r Request) regular() int {
	n := 0
	for _, c := range r.Containers {
		if !c.Init {
			n++
		}
	}
	return n
}

// hasInit reports whether an init (or sidecar) container asks for gpu-mem.
func (r Request) hasInit() bool {
	return slices.ContainsFunc(r.Containers, func(c gpushare.ContainerRequest) bool { return c.Init })
}

// Placement is where a pod's containers go on one node.
type Placement struct {
	// Set is a multi-GPU pod's GPUs, on every one of which each of its
	// containers gets its units divided evenly; 0 for every other pod. Home
	// is then Set's first GPU.
	Set gpushare.GPUSet
	// Home is the GPU of the whole pod when not Split, and of its init and
	// sidecar containers when Split; -1 when Split and no init container asks for gpu-mem.
	Home int
	// Split is true when regular containers sit on different GPUs.
	Split bool
	// Containers maps each regular container index to its GPU; set only when Split.
	Containers map[int]int
	// DevUnits is the size of Home (or of the lowest GPU used when Home is -1).
	DevUnits uint64
}

// SetOf returns the GPUs container c runs on under p.
func (p Placement) SetOf(c gpushare.ContainerRequest) gpushare.GPUSet {
	if p.Set != 0 {
		return p.Set
	}
	return gpushare.NewGPUSet(p.GPUOf(c))
}

// GPUOf returns the GPU container c runs on under p (the first of a
// multi-GPU pod's).
func (p Placement) GPUOf(c gpushare.ContainerRequest) int {
	if p.Split && !c.Init {
		return p.Containers[c.Index]
	}
	return p.Home
}

// Assignment is what the binder writes on the pod for p. The allocation
// annotation is written for split and multi-GPU pods only: a single-GPU pod
// keeps the seed's shape exactly, and ALIYUN_COM_GPU_MEM_IDX keeps its seed
// meaning (for a multi-GPU pod, its first GPU).
func (p Placement) Assignment(r Request, assumeTime int64) gpushare.PodAssignment {
	a := gpushare.PodAssignment{
		GPUIndex:   p.Home,
		PodUnits:   r.Units,
		DevUnits:   p.DevUnits,
		AssumeTime: assumeTime,
	}
	if p.Set != 0 {
		a.Allocation = gpushare.AllocationForSet(r.Containers, p.Set)
	}
	if p.Split {
		a.Allocation = gpushare.Allocation{}
		for c, g := range p.Containers {
			for _, cr := range r.Containers {
				if !cr.Init && cr.Index == c {
					a.Allocation[c] = gpushare.GPUUnits{g: cr.Units}
				}
			}
		}
	}
	return a
}

// PlacementFromAssignment reads back the placement an assignment describes for
// the pod's containers, the inverse of Placement.Assignment used when the
// cache rebuilds its view from annotations.
func PlacementFromAssignment(a gpushare.PodAssignment, r Request) (Placement, error) {
	set, err := a.MultiSet()
	if err != nil {
		return Placement{}, err
	}
	if set != 0 {
		// Checks every container's entry against its request (ContainerSets
		// the regular ones, SetFor the init ones the allocation cannot name).
		if _, err := a.ContainerSets(r.Containers); err != nil {
			return Placement{}, err
		}
		for _, c := range r.Containers {
			if !c.Init {
				continue
			}
			if _, err := a.SetFor(c); err != nil {
				return Placement{}, err
			}
		}
		return Placement{Home: set.First(), Set: set, DevUnits: a.DevUnits}, nil
	}
	gpus, err := a.ContainerGPUs(r.Containers)
	if err != nil {
		return Placement{}, err
	}
	p := Placement{Home: a.GPUIndex, DevUnits: a.DevUnits}
	if p.Home < 0 {
		if all := a.Allocation.GPUs(); len(all) == 1 {
			p.Home = all[0]
		}
	}
	distinct := map[int]bool{}
	for _, g := range gpus {
		distinct[g] = true
	}
	if p.Home >= 0 && (len(distinct) == 0 || (len(distinct) == 1 && distinct[p.Home])) {
		return p, nil
	}
	if p.Home < 0 && r.hasInit() {
		return Placement{}, fmt.Errorf("%w: init containers ask for gpu-mem but no GPU index names their GPU", gpushare.ErrAssignmentMismatch)
	}
	p.Split, p.Containers = true, gpus
	return p, nil
}

// Charges returns the units p charges on each GPU, by the contract's per-GPU
// rule (gpushare.ChargesByGPU), which the inspector and the device plugin share.
func Charges(r Request, p Placement) map[int]uint64 {
	if p.Set != 0 {
		return gpushare.ChargesBySet(r.Containers, p.SetOf)
	}
	if !p.Split {
		return map[int]uint64{p.Home: r.Units}
	}
	return gpushare.ChargesByGPU(r.Containers, p.GPUOf)
}

// Slots returns the pod's containers as the device plugin tells them apart.
func Slots(r Request, p Placement) []Slot {
	out := make([]Slot, 0, len(r.Containers))
	for _, c := range r.Containers {
		out = append(out, Slot{Units: c.Units, GPUs: p.SetOf(c)})
	}
	return out
}

// Key is equal for two requests exactly when Place treats them alike: every
// field but the pod's name, which only reasons quote. A caller keeps a fit it
// computed under this key, with the node snapshot it placed on, for the next
// pod that asks alike (the scheduler plugin's Filter, for a burst of replicas).
func (r Request) Key() string {
	b := make([]byte, 0, 16+12*len(r.Containers))
	b = append(b, r.Isolation.need, r.Isolation.percent)
	b = strconv.AppendInt(b, int64(r.GPUs.Count), 10)
	b = strconv.AppendBool(b, r.GPUs.LinksRequired)
	for _, c := range r.Containers {
		b = append(b, '|')
		b = strconv.AppendInt(b, int64(c.Index), 10)
		b = append(b, ',')
		b = strconv.AppendBool(b, c.Init)
		b = append(b, ',')
		b = strconv.AppendBool(b, c.Sidecar)
		b = append(b, ',')
		b = strconv.AppendUint(b, c.Units, 10)
		b = append(b, ',')
		b = strconv.AppendInt(b, int64(len(c.Name)), 10)
		b = append(b, ':')
		b = append(b, c.Name...)
	}
	return string(b)
}
