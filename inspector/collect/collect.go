package collect

import (
	"cmp"
	"errors"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

// unknownAddress is what the old CLI printed for a node without an InternalIP.
const unknownAddress = "unknown"

// IsSharingNode reports whether the inspector considers node: allocatable
// aliyun.com/gpu-mem > 0, the old CLI's rule (labels are not required, so a
// node whose label was forgotten still shows up).
func IsSharingNode(node *corev1.Node) bool {
	q, ok := node.Status.Allocatable[gpushare.ResourceName]
	return ok && q.Sign() > 0
}

// IsActivePod reports whether pod may still hold GPU memory: not Succeeded or Failed.
func IsActivePod(pod *corev1.Pod) bool {
	return pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed
}

// nodeAcc accumulates one node while pods are charged to it.
type nodeAcc struct {
	node          Node
	gpus          map[int]*GPU
	published     bool          // GPUs come from gpushare.io/gpus or our ResourceSlice
	publishedUnit gpushare.Unit // the unit that annotation (or the slice) counts in
	count         uint64        // aliyun.com/gpu-count, for the old unit guess
	dra           *draAcc       // non-nil on a DRA node
	usage         *gpushare.NodeUsage
}

// Objects are what one read of the API server returned. Slices and Claims
// (resource.k8s.io/v1) may be empty: the API server may not serve them or
// RBAC may forbid reading them, and DRA-mode nodes are then not shown.
type Objects struct {
	Nodes  []corev1.Node
	Pods   []corev1.Pod
	Slices []resourceapi.ResourceSlice
	Claims []resourceapi.ResourceClaim
}

// Build recomputes the report from nodes and pods alone: the device-plugin
// view, BuildObjects without ResourceSlices and ResourceClaims.
func Build(nodes []corev1.Node, pods []corev1.Pod) *Report {
	return BuildObjects(Objects{Nodes: nodes, Pods: pods})
}

// BuildObjects recomputes the report from the objects as listed by the API
// server. A node with a ResourceSlice of our DRA driver is a DRA node (its
// GPUs and charges come from the slice and the allocated claims); other
// nodes count when they have allocatable gpu-mem. Pods that are finished,
// not bound to a shown node or ask for no gpu-mem are ignored; the rest that
// cannot be read are reported in Report.Skipped. No input is modified.
func BuildObjects(o Objects) *Report {
	r := &Report{Nodes: []Node{}}
	sv := readSlices(o.Slices)
	byName, order := readNodes(o.Nodes, sv, r)
	for i := range o.Pods {
		p := &o.Pods[i]
		acc := byName[p.Spec.NodeName]
		// On a DRA node, pods are charged through their claims (chargeClaims).
		if acc == nil || acc.dra != nil || !IsActivePod(p) {
			continue
		}
		addPod(acc, p, r)
	}
	chargeClaims(byName, sv, o.Claims, o.Pods, r)
	r.sum(order)
	return r
}

// readNodes keeps the nodes the report shows, each once, in input order.
func readNodes(nodes []corev1.Node, sv sliceView, r *Report) (map[string]*nodeAcc, []*nodeAcc) {
	byName := make(map[string]*nodeAcc, len(nodes))
	var order []*nodeAcc
	for i := range nodes {
		n := &nodes[i]
		if _, dup := byName[n.Name]; dup {
			continue
		}
		var acc *nodeAcc
		if devices, ok := sv.devices[n.Name]; ok {
			acc = newDRANode(n, devices, r)
		} else if IsSharingNode(n) {
			acc = newNode(n, r)
		} else {
			continue
		}
		byName[n.Name] = acc
		order = append(order, acc)
	}
	return byName, order
}

// sum sorts the nodes, converts them to one unit and adds up the cluster.
func (r *Report) sum(order []*nodeAcc) {
	slices.SortFunc(order, func(a, b *nodeAcc) int { return cmp.Compare(a.node.Name, b.node.Name) })
	unit, mixed := reportUnit(order)
	r.Unit = unit.String()
	for _, acc := range order {
		n := acc.finish()
		if n.Usage != nil {
			// Before scale: Allocated is still in the node's own unit.
			if r.Usage == nil {
				r.Usage = &ClusterUsage{}
			}
			r.Usage.addUsage(&n, acc.unit().MiB())
		}
		if mixed {
			n.scale(acc.unit().MiB())
		}
		r.Total += n.Total
		r.Allocated += n.Allocated
		r.Nodes = append(r.Nodes, n)
	}
	r.AllocatedPercent = percent(r.Allocated, r.Total)
	// Stable: an object's several notes keep the order they were found in.
	slices.SortStableFunc(r.Skipped, func(a, b Skipped) int {
		return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
}

// newNode reads a node's totals and GPUs: per GPU from gpushare.io/gpus when
// the device plugin published it, else node total / aliyun.com/gpu-count.
func newNode(n *corev1.Node, r *Report) *nodeAcc {
	acc := &nodeAcc{
		node: Node{Name: n.Name, Address: address(n), Total: quantityUnits(n.Status.Allocatable, gpushare.ResourceName)},
		gpus: map[int]*GPU{},
	}
	acc.usage = readUsage(n, r)
	if raw, ok := n.Annotations[gpushare.AnnotationNodeGPUs]; ok {
		desc, err := gpushare.DecodeNodeGPUs(raw)
		if err == nil {
			acc.published, acc.publishedUnit = true, desc.Unit
			for _, g := range desc.GPUs {
				acc.gpus[g.Index] = &GPU{Index: g.Index, Total: g.Units, Healthy: g.Healthy, Reason: g.Reason, Model: g.Model, UUID: g.UUID, Known: true,
					Isolation: string(g.Isolation), IsolationReason: g.IsolationReason}
			}
			return acc
		}
		r.Skipped = append(r.Skipped, Skipped{Kind: KindNode, Name: n.Name,
			Reason: "annotation " + gpushare.AnnotationNodeGPUs + " ignored, GPU sizes derived from the node total: " + err.Error()})
	}
	count := quantityUnits(n.Status.Allocatable, gpushare.ResourceCount)
	count = min(count, gpushare.MaxGPUsPerNode)
	acc.count = count
	for i := range int(count) {
		acc.gpus[i] = &GPU{Index: i, Total: acc.node.Total / count, Healthy: true, Known: true}
	}
	return acc
}

// quantityUnits reads a non-negative whole resource value; anything else counts as 0.
func quantityUnits(list corev1.ResourceList, name corev1.ResourceName) uint64 {
	q, ok := list[name]
	if !ok || q.Sign() <= 0 {
		return 0
	}
	v, ok := q.AsInt64()
	if !ok {
		return 0
	}
	return uint64(v)
}

// address returns the node's InternalIP, as the old CLI's summary did.
func address(n *corev1.Node) string {
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return a.Address
		}
	}
	return unknownAddress
}

// addPod charges pod to its node, or records why it cannot.
func addPod(acc *nodeAcc, pod *corev1.Pod, r *Report) {
	skip := func(err error) {
		r.Skipped = append(r.Skipped, Skipped{Kind: KindPod, Namespace: pod.Namespace, Name: pod.Name, Reason: err.Error()})
	}
	reqs, err := gpushare.ContainerRequests(pod)
	if err != nil {
		skip(err)
		return
	}
	units := gpushare.PodUnits(reqs)
	if units == 0 {
		return
	}
	asg, placed, err := gpushare.DecodePodAssignment(pod.Annotations)
	if err != nil {
		skip(err)
		return
	}
	var envs gpushare.ContainerEnvs
	if raw, ok := pod.Annotations[gpushare.AnnotationContainerEnv]; ok {
		if envs, err = gpushare.DecodeContainerEnvs(raw); err != nil {
			// The charge still reads from the assignment; only the limits are unknown.
			skip(errors.New("annotation " + gpushare.AnnotationContainerEnv + " ignored: " + err.Error()))
			envs = nil
		}
	}
	p := Pod{Namespace: pod.Namespace, Name: pod.Name, Units: units, Pending: !placed, Assigned: asg.Assigned, GPUs: []GPUCharge{}}
	if err := readIsolation(&p, pod.Annotations); err != nil {
		// The charge does not depend on them; only what the pod asks is unknown.
		skip(errors.New("isolation annotations ignored: " + err.Error()))
	}
	if !placed {
		acc.node.Pending += units
		p.Containers = containers(reqs, nil, asg, false, envs)
		acc.node.Pods = append(acc.node.Pods, p)
		return
	}
	setOf, err := containerSets(asg, reqs)
	if err != nil {
		skip(err)
		return
	}
	// Charges splits a multi-GPU container's units evenly over its GPUs
	// (units/k on each of k), so the GPUs' totals add up to the pod's share.
	charges, err := asg.Charges(reqs)
	if err != nil {
		skip(err)
		return
	}
	for g, u := range charges {
		p.GPUs = append(p.GPUs, GPUCharge{Index: g, Units: u})
		acc.gpu(g).Allocated += u
	}
	slices.SortFunc(p.GPUs, func(a, b GPUCharge) int { return a.Index - b.Index })
	if set, _ := asg.MultiSet(); set.Len() > 1 {
		// containerSets already read MultiSet without an error.
		p.GPUSet = set.Indices()
	}
	p.Containers = containers(reqs, setOf, asg, true, envs)
	acc.node.Pods = append(acc.node.Pods, p)
}

// readIsolation sets what the pod's isolation annotations ask, each only
// when the pod sets it; on an unreadable value it sets neither.
func readIsolation(p *Pod, annotations map[string]string) error {
	tier, err := gpushare.PodIsolation(annotations)
	if err != nil {
		return err
	}
	percent, err := gpushare.PodComputePercent(annotations)
	if err != nil {
		return err
	}
	if _, set := annotations[gpushare.AnnotationIsolation]; set {
		p.Isolation = string(tier)
	}
	p.ComputePercent = percent
	return nil
}

// reqKey names a container across both container lists.
type reqKey struct {
	init  bool
	index int
}

// containerSets places every gpu-mem container, init ones included, by the
// contract's rule (PodAssignment.SetFor): one GPU for single-GPU and split
// pods, the pod's whole set for multi-GPU pods, so the charge is the one the
// extender and the device plugin act on.
func containerSets(asg gpushare.PodAssignment, reqs []gpushare.ContainerRequest) (map[reqKey]gpushare.GPUSet, error) {
	// ContainerSets also rejects an allocation charging a container that asks for nothing.
	regular, err := asg.ContainerSets(reqs)
	if err != nil {
		return nil, err
	}
	out := make(map[reqKey]gpushare.GPUSet, len(reqs))
	for _, c := range reqs {
		if !c.Init {
			out[reqKey{false, c.Index}] = regular[c.Index]
			continue
		}
		s, err := asg.SetFor(c)
		if err != nil {
			return nil, err
		}
		out[reqKey{c.Init, c.Index}] = s
	}
	return out, nil
}

// containers describes each gpu-mem container with what the device plugin
// recorded for it. A container on several GPUs lists them all, with its
// units per GPU; its record matches when it names the same set and the same
// units on each GPU.
func containers(reqs []gpushare.ContainerRequest, setOf map[reqKey]gpushare.GPUSet, asg gpushare.PodAssignment, placed bool, envs gpushare.ContainerEnvs) []Container {
	out := make([]Container, 0, len(reqs))
	for _, c := range reqs {
		ct := Container{Name: c.Name, Init: c.Init, Units: c.Units, State: StateNotAllocated}
		var set gpushare.GPUSet
		if placed {
			set = setOf[reqKey{c.Init, c.Index}]
			first := set.First()
			ct.GPU = &first
			if set.Len() > 1 {
				ct.GPUs = set.Indices()
				ct.UnitsPerGPU = c.Units / uint64(set.Len())
			}
		}
		env, recorded := envs[c.Name]
		switch {
		case recorded:
			ct.Env = env.Map()
			ct.State = StateAllocated
			if !placed || set == 0 || env.Set() != set || env.ContainerUnits != c.Units ||
				env.UnitsPerGPU() != c.Units/uint64(set.Len()) {
				ct.State = StateMismatch
			}
		case asg.Assigned:
			ct.State = StateUnrecorded
		}
		out = append(out, ct)
	}
	return out
}

// gpu returns GPU index g, adding an unknown one when the node does not list
// it: its usage still counts, so node totals match what pods hold.
func (acc *nodeAcc) gpu(g int) *GPU {
	if x, ok := acc.gpus[g]; ok {
		return x
	}
	x := &GPU{Index: g, Healthy: true}
	acc.gpus[g] = x
	return x
}

// finish sorts and sums the node.
func (acc *nodeAcc) finish() Node {
	n := acc.node
	n.GPUSizes = SizesDerived
	if acc.published {
		n.GPUSizes = SizesPublished
	}
	n.GPUs = make([]GPU, 0, len(acc.gpus))
	for _, i := range slices.Sorted(maps.Keys(acc.gpus)) {
		g := *acc.gpus[i]
		n.GPUs = append(n.GPUs, g)
		n.Allocated += g.Allocated
	}
	n.Allocated += n.Pending
	n.AllocatedPercent = percent(n.Allocated, n.Total)
	if n.Pods == nil {
		n.Pods = []Pod{}
	}
	slices.SortFunc(n.Pods, func(a, b Pod) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	if acc.dra != nil {
		n.Mode = ModeDRA
		slices.SortFunc(n.Claims, compareClaims)
	}
	applyUsage(&n, acc.usage)
	return n
}

// unit is the unit a node's figures count in: what its device plugin
// published, else the old CLI's guess (per-GPU total > 100 means MiB), else
// GiB, the plugin's default.
func (acc *nodeAcc) unit() gpushare.Unit {
	switch {
	case acc.published:
		return acc.publishedUnit
	case acc.count > 0 && acc.node.Total/acc.count > 100:
		return gpushare.MiB
	}
	return gpushare.GiB
}

// reportUnit is the unit of the whole report: the nodes' own when they all
// count in one, else MiB (mixed true), which every unit is a whole number
// of, so each node's figures can be converted without rounding.
func reportUnit(nodes []*nodeAcc) (gpushare.Unit, bool) {
	if len(nodes) == 0 {
		return gpushare.GiB, false
	}
	first := nodes[0].unit()
	for _, acc := range nodes[1:] {
		if acc.unit() != first {
			return gpushare.MiB, true
		}
	}
	return first, false
}

// scale converts every memory figure of n, pods and containers included,
// by factor (a node's unit in MiB), for a report of mixed units. The
// recorded environment stays as the device plugin wrote it.
func (n *Node) scale(factor uint64) {
	n.Total, n.Allocated, n.Pending = n.Total*factor, n.Allocated*factor, n.Pending*factor
	for i := range n.GPUs {
		n.GPUs[i].Total *= factor
		n.GPUs[i].Allocated *= factor
	}
	for i := range n.Pods {
		p := &n.Pods[i]
		p.Units *= factor
		for j := range p.GPUs {
			p.GPUs[j].Units *= factor
		}
		for j := range p.Containers {
			p.Containers[j].Units *= factor
			p.Containers[j].UnitsPerGPU *= factor
		}
		scaleClaims(p.Claims, factor)
	}
	scaleClaims(n.Claims, factor)
}

// scaleClaims converts claims' memory by factor, as Node.scale does.
func scaleClaims(claims []Claim, factor uint64) {
	for i := range claims {
		claims[i].Units *= factor
		for j := range claims[i].Shares {
			claims[i].Shares[j].Units *= factor
		}
	}
}
