package collect

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apiresource "k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

// DRA-mode nodes (docs/dra.md): our driver publishes one ResourceSlice
// pool per node, one device per GPU whose memory is consumable capacity in
// whole units of the node's unit; pods hold memory through allocated
// ResourceClaims, whose results name the device and the memory consumed.

// sliceView is our driver's devices, by node, and the node of each pool.
type sliceView struct {
	// devices holds each node's devices; a node whose slice is empty (all
	// its GPUs skipped) is present with none: the driver runs there.
	devices map[string][]resourceapi.Device
	// poolNode maps a pool to its node, to place allocation results.
	poolNode map[string]string
}

// ownSlice reports whether s is one of our driver's node-local slices.
func ownSlice(s *resourceapi.ResourceSlice) bool {
	return s.Spec.Driver == gpushare.DRADriverName && s.Spec.NodeName != nil && *s.Spec.NodeName != ""
}

// IsDRANode reports whether slices hold one of our driver's for node, even
// an empty one: its GPUs are served by the DRA driver.
func IsDRANode(node string, slices []resourceapi.ResourceSlice) bool {
	_, ok := readSlices(slices).devices[node]
	return ok
}

// readSlices keeps our driver's slices and, of each pool, only its newest
// generation: the scheduler ignores older ones, which the driver is
// replacing, so counting them would show GPUs twice.
func readSlices(list []resourceapi.ResourceSlice) sliceView {
	newest := map[string]int64{}
	for i := range list {
		if s := &list[i]; ownSlice(s) {
			newest[s.Spec.Pool.Name] = max(newest[s.Spec.Pool.Name], s.Spec.Pool.Generation)
		}
	}
	sv := sliceView{devices: map[string][]resourceapi.Device{}, poolNode: map[string]string{}}
	for i := range list {
		s := &list[i]
		if !ownSlice(s) || s.Spec.Pool.Generation != newest[s.Spec.Pool.Name] {
			continue
		}
		node := *s.Spec.NodeName
		sv.poolNode[s.Spec.Pool.Name] = node
		sv.devices[node] = append(sv.devices[node], s.Spec.Devices...)
	}
	return sv
}

// draAcc is what a DRA node accumulates besides its GPUs.
type draAcc struct {
	devices map[string]int     // device name → GPU index
	pods    map[string]*draPod // by "namespace/name"
}

// draPod is a pod on a DRA node and the claims it uses there.
type draPod struct {
	obj    *corev1.Pod
	claims []Claim
}

// newDRANode reads a DRA node's GPUs from its slice's devices; a device
// that cannot be read is left out and named.
func newDRANode(n *corev1.Node, devices []resourceapi.Device, r *Report) *nodeAcc {
	unit := sliceUnit(devices)
	acc := &nodeAcc{
		node:      Node{Name: n.Name, Address: address(n)},
		gpus:      map[int]*GPU{},
		published: true, publishedUnit: unit,
		dra: &draAcc{devices: map[string]int{}, pods: map[string]*draPod{}},
	}
	note := func(reason string) {
		r.Skipped = append(r.Skipped, Skipped{Kind: KindNode, Name: n.Name, Reason: reason})
	}
	if IsSharingNode(n) {
		// KEP-5004: one mode per node; the slice is what the scheduler allocates from now.
		note("has both allocatable " + string(gpushare.ResourceName) + " and a ResourceSlice of " + gpushare.DRADriverName +
			": shown as a DRA node, its " + string(gpushare.ResourceName) + " pods not counted")
	}
	for _, d := range devices {
		g, err := draGPU(d, unit)
		if err == nil && acc.gpus[g.Index] != nil {
			err = fmt.Errorf("index %d is another device's", g.Index)
		}
		if err != nil {
			note("device " + d.Name + " not shown: " + err.Error())
			continue
		}
		acc.gpus[g.Index] = &g
		acc.dra.devices[d.Name] = g.Index
		acc.node.Total += g.Total
	}
	return acc
}

// draGPU reads one device: index, memory in units (rounded down, as the
// device plugin counts a GPU), identity, tier, and health from its taint.
func draGPU(d resourceapi.Device, unit gpushare.Unit) (GPU, error) {
	idx, ok := intAttribute(d, gpushare.DRAAttributeIndex)
	if !ok || idx < 0 || idx >= gpushare.MaxGPUsPerNode {
		return GPU{}, fmt.Errorf("no %q attribute in [0, %d)", gpushare.DRAAttributeIndex, gpushare.MaxGPUsPerNode)
	}
	c, ok := d.Capacity[gpushare.DRACapacityMemory]
	if !ok {
		return GPU{}, fmt.Errorf("no %q capacity", gpushare.DRACapacityMemory)
	}
	total, _ := toUnits(c.Value, unit)
	g := GPU{Index: int(idx), Total: total, Healthy: true, Known: true,
		UUID:      stringAttribute(d, gpushare.DRAAttributeUUID),
		Model:     stringAttribute(d, gpushare.DRAAttributeProductName),
		Isolation: stringAttribute(d, gpushare.DRAAttributeIsolation)}
	for _, t := range d.Taints {
		if t.Key == gpushare.DRATaintUnhealthy {
			g.Healthy, g.Reason = false, t.Value+", "+string(t.Effect)
			break
		}
	}
	return g, nil
}

// attribute finds name unqualified or qualified with our driver's domain,
// which the API treats as the same attribute.
func attribute(d resourceapi.Device, name string) (resourceapi.DeviceAttribute, bool) {
	if a, ok := d.Attributes[resourceapi.QualifiedName(name)]; ok {
		return a, true
	}
	a, ok := d.Attributes[resourceapi.QualifiedName(gpushare.DRADriverName+"/"+name)]
	return a, ok
}

func intAttribute(d resourceapi.Device, name string) (int64, bool) {
	a, ok := attribute(d, name)
	if !ok || a.IntValue == nil {
		return 0, false
	}
	return *a.IntValue, true
}

func stringAttribute(d resourceapi.Device, name string) string {
	if a, ok := attribute(d, name); ok && a.StringValue != nil {
		return *a.StringValue
	}
	return ""
}

// sliceUnit is the unit a DRA node counts in. The driver publishes each
// GPU's memory as whole units of its -memory-unit, consumable in steps of
// one unit, so the capacity's validRange.min is one unit (a GPU of one unit
// keeps its min). Without it, GiB, the driver's default, when every GPU's
// memory is whole GiB, else MiB; devices that disagree count in MiB, of
// which every unit is a whole number.
func sliceUnit(devices []resourceapi.Device) gpushare.Unit {
	var found gpushare.Unit
	wholeGiB := true
	for _, d := range devices {
		c, ok := d.Capacity[gpushare.DRACapacityMemory]
		if !ok {
			continue
		}
		if u, ok := policyUnit(c); ok {
			if found != 0 && found != u {
				return gpushare.MiB
			}
			found = u
		}
		_, exact := toUnits(c.Value, gpushare.GiB)
		wholeGiB = wholeGiB && exact
	}
	switch {
	case found != 0:
		return found
	case wholeGiB:
		return gpushare.GiB
	}
	return gpushare.MiB
}

// policyUnit reads one unit from a capacity's validRange.min.
func policyUnit(c resourceapi.DeviceCapacity) (gpushare.Unit, bool) {
	p := c.RequestPolicy
	if p == nil || p.ValidRange == nil || p.ValidRange.Min == nil {
		return 0, false
	}
	b := p.ValidRange.Min.Value()
	if b <= 0 || b%(1<<20) != 0 {
		return 0, false
	}
	u := gpushare.Unit(b >> 20)
	return u, u.Valid()
}

// toUnits is q bytes in whole units of unit, rounded down, and whether it
// was exact. Negative quantities are 0.
func toUnits(q apiresource.Quantity, unit gpushare.Unit) (uint64, bool) {
	v := q.Value()
	per := int64(unit.MiB()) << 20
	if v <= 0 || per <= 0 {
		return 0, v == 0
	}
	return uint64(v / per), v%per == 0
}

// chargeClaims charges every allocated claim with results on a DRA node's
// devices, once however many pods reserve it, and lists it with its pods.
func chargeClaims(byName map[string]*nodeAcc, sv sliceView, claims []resourceapi.ResourceClaim, pods []corev1.Pod, r *Report) {
	podsOn := draPods(byName, pods)
	for i := range claims {
		c := &claims[i]
		if c.Status.Allocation == nil {
			continue
		}
		results := resultsByNode(c, sv)
		for _, node := range slices.Sorted(maps.Keys(results)) {
			if acc := byName[node]; acc != nil && acc.dra != nil {
				acc.addClaim(c, results[node], podsOn, r)
			}
		}
	}
	for _, acc := range byName {
		if acc.dra != nil {
			acc.addDRAPods()
		}
	}
}

// draPods indexes the active pods bound to DRA nodes by "namespace/name".
func draPods(byName map[string]*nodeAcc, pods []corev1.Pod) map[string]*corev1.Pod {
	out := map[string]*corev1.Pod{}
	for i := range pods {
		p := &pods[i]
		if acc := byName[p.Spec.NodeName]; acc != nil && acc.dra != nil && IsActivePod(p) {
			out[p.Namespace+"/"+p.Name] = p
		}
	}
	return out
}

// resultsByNode groups c's results on our driver by the node of their pool.
func resultsByNode(c *resourceapi.ResourceClaim, sv sliceView) map[string][]resourceapi.DeviceRequestAllocationResult {
	out := map[string][]resourceapi.DeviceRequestAllocationResult{}
	for _, res := range c.Status.Allocation.Devices.Results {
		if node, ok := sv.poolNode[res.Pool]; ok && res.Driver == gpushare.DRADriverName {
			out[node] = append(out[node], res)
		}
	}
	return out
}

// addClaim charges c's results on this node to their GPUs and hands a copy
// of the claim to each pod reserving it.
func (acc *nodeAcc) addClaim(c *resourceapi.ResourceClaim, results []resourceapi.DeviceRequestAllocationResult, podsOn map[string]*corev1.Pod, r *Report) {
	claim := Claim{Namespace: c.Namespace, Name: c.Name, UID: string(c.UID), Shares: []Share{}}
	for _, res := range results {
		s, ok, note := acc.share(res)
		if note != "" {
			r.Skipped = append(r.Skipped, Skipped{Kind: KindClaim, Namespace: c.Namespace, Name: c.Name, Reason: note})
		}
		if !ok {
			continue
		}
		claim.Shares = append(claim.Shares, s)
		claim.Units += s.Units
		acc.gpus[s.Index].Allocated += s.Units
	}
	if len(claim.Shares) == 0 {
		return
	}
	slices.SortFunc(claim.Shares, func(a, b Share) int {
		return cmp.Or(cmp.Compare(a.Index, b.Index), cmp.Compare(a.Request, b.Request), cmp.Compare(a.ShareID, b.ShareID))
	})
	for _, ref := range c.Status.ReservedFor {
		pod := reservingPod(ref, c.Namespace, podsOn, acc.node.Name)
		if pod == nil {
			continue
		}
		key := pod.Namespace + "/" + pod.Name
		claim.Pods = append(claim.Pods, key)
		dp := acc.dra.pods[key]
		if dp == nil {
			dp = &draPod{obj: pod}
			acc.dra.pods[key] = dp
		}
		// A copy of its own, so converting units (Node.scale) touches each once.
		own := claim
		own.Pods, own.Shares = nil, slices.Clone(claim.Shares)
		dp.claims = append(dp.claims, own)
	}
	slices.Sort(claim.Pods)
	acc.node.Claims = append(acc.node.Claims, claim)
}

// share reads one result: its GPU and consumed memory in units. ok is false
// when it cannot be charged; note says what was not as the driver writes
// it. The scheduler rounds a request up to whole units (the step), so a
// fraction means the slice and the claim disagree on the unit; it is
// counted rounded up, as the memory it holds.
func (acc *nodeAcc) share(res resourceapi.DeviceRequestAllocationResult) (s Share, ok bool, note string) {
	idx, known := acc.dra.devices[res.Device]
	if !known {
		return Share{}, false, "device " + res.Device + " is not in the node's ResourceSlice: its memory is not counted"
	}
	s = Share{Index: idx, Device: res.Device, Request: res.Request}
	if res.ShareID != nil {
		s.ShareID = string(*res.ShareID)
	}
	q, has := res.ConsumedCapacity[gpushare.DRACapacityMemory]
	if !has {
		// Without consumable capacity the scheduler allocates the device whole.
		s.Units = acc.gpus[idx].Total
		return s, true, "device " + res.Device + ": no consumed " + gpushare.DRACapacityMemory + " (scheduler without DRAConsumableCapacity): counted as the whole GPU"
	}
	units, exact := toUnits(q, acc.publishedUnit)
	if !exact {
		units++
		note = fmt.Sprintf("device %s: consumed memory %s is not a whole number of %s: counted as %d (the driver refuses to prepare it)",
			res.Device, q.String(), acc.publishedUnit, units)
	}
	s.Units = units
	return s, true, note
}

// reservingPod is the pod ref names, when it is a pod on this node (the
// UID guards against a pod recreated under the same name).
func reservingPod(ref resourceapi.ResourceClaimConsumerReference, namespace string, podsOn map[string]*corev1.Pod, node string) *corev1.Pod {
	if ref.APIGroup != "" || ref.Resource != "pods" {
		return nil
	}
	p := podsOn[namespace+"/"+ref.Name]
	if p == nil || p.Spec.NodeName != node || (ref.UID != "" && p.UID != ref.UID) {
		return nil
	}
	return p
}

// addDRAPods adds the node's pods that use its claims.
func (acc *nodeAcc) addDRAPods() {
	for _, dp := range acc.dra.pods {
		acc.node.Pods = append(acc.node.Pods, dp.pod())
	}
}

// pod is a DRA pod's entry: its claims' memory per GPU, each claim counted
// once, and the containers that name them.
func (dp *draPod) pod() Pod {
	slices.SortFunc(dp.claims, compareClaims)
	p := Pod{Namespace: dp.obj.Namespace, Name: dp.obj.Name, GPUs: []GPUCharge{}, Claims: dp.claims}
	perGPU := map[int]uint64{}
	for _, c := range dp.claims {
		p.Units += c.Units
		for _, s := range c.Shares {
			perGPU[s.Index] += s.Units
		}
	}
	for _, g := range slices.Sorted(maps.Keys(perGPU)) {
		p.GPUs = append(p.GPUs, GPUCharge{Index: g, Units: perGPU[g]})
	}
	p.Containers = claimContainers(dp.obj, dp.claims)
	return p
}

// compareClaims orders claims by namespace, then name.
func compareClaims(a, b Claim) int {
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
}

// claimContainers lists the containers naming one of claims in
// resources.claims, init containers first, each in spec order, as for
// device-plugin pods.
func claimContainers(pod *corev1.Pod, claims []Claim) []Container {
	out := []Container{}
	add := func(c *corev1.Container, init bool) {
		if ct, ok := claimContainer(pod, c, claims); ok {
			ct.Init = init
			out = append(out, ct)
		}
	}
	for i := range pod.Spec.InitContainers {
		add(&pod.Spec.InitContainers[i], true)
	}
	for i := range pod.Spec.Containers {
		add(&pod.Spec.Containers[i], false)
	}
	return out
}

// claimContainer is c with the shares of the claims it names: all of a
// claim's, or those of the one request it names ("<request>" matches its
// subrequests too). A share named twice counts once.
func claimContainer(pod *corev1.Pod, c *corev1.Container, claims []Claim) (Container, bool) {
	ct := Container{Name: c.Name, State: StateAllocated}
	perGPU := map[int]uint64{}
	seen := map[[2]int]bool{}
	for _, rc := range c.Resources.Claims {
		name := claimName(pod, rc.Name)
		i := slices.IndexFunc(claims, func(x Claim) bool { return x.Name == name })
		if name == "" || i < 0 {
			continue
		}
		if !slices.Contains(ct.Claims, name) {
			ct.Claims = append(ct.Claims, name)
		}
		for j, s := range claims[i].Shares {
			if seen[[2]int{i, j}] || (rc.Request != "" && s.Request != rc.Request && !strings.HasPrefix(s.Request, rc.Request+"/")) {
				continue
			}
			seen[[2]int{i, j}] = true
			perGPU[s.Index] += s.Units
			ct.Units += s.Units
		}
	}
	place(&ct, perGPU)
	return ct, len(ct.Claims) > 0
}

// place sets a container's GPUs from its memory per GPU: the first in GPU,
// all of them in GPUs when several, and UnitsPerGPU when each holds alike.
func place(ct *Container, perGPU map[int]uint64) {
	gpus := slices.Sorted(maps.Keys(perGPU))
	if len(gpus) == 0 {
		return
	}
	ct.GPU = &gpus[0]
	if len(gpus) == 1 {
		return
	}
	ct.GPUs = gpus
	even := !slices.ContainsFunc(gpus, func(g int) bool { return perGPU[g] != perGPU[gpus[0]] })
	if even {
		ct.UnitsPerGPU = perGPU[gpus[0]]
	}
}

// claimName resolves a pod's claim entry to its ResourceClaim: named in the
// spec, or generated from a template and named in the pod's status.
func claimName(pod *corev1.Pod, entry string) string {
	for _, pc := range pod.Spec.ResourceClaims {
		if pc.Name != entry {
			continue
		}
		if pc.ResourceClaimName != nil {
			return *pc.ResourceClaimName
		}
		for _, st := range pod.Status.ResourceClaimStatuses {
			if st.Name == entry && st.ResourceClaimName != nil {
				return *st.ResourceClaimName
			}
		}
	}
	return ""
}
