package drascore

import (
	"cmp"
	"slices"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

// ByNode groups the driver's ResourceSlices by node, each node's in the
// allocator's order, leaving out slices of a pool's older generations (the
// allocator ignores them while the driver replaces a pool).
func ByNode(all []*resourceapi.ResourceSlice) map[string][]*resourceapi.ResourceSlice {
	latest := map[string]int64{}
	for _, s := range all {
		if ours(s) {
			latest[s.Spec.Pool.Name] = max(latest[s.Spec.Pool.Name], s.Spec.Pool.Generation)
		}
	}
	out := map[string][]*resourceapi.ResourceSlice{}
	for _, s := range all {
		if ours(s) && s.Spec.Pool.Generation == latest[s.Spec.Pool.Name] {
			out[*s.Spec.NodeName] = append(out[*s.Spec.NodeName], s)
		}
	}
	for _, ss := range out {
		slices.SortFunc(ss, func(a, b *resourceapi.ResourceSlice) int {
			return cmp.Or(cmp.Compare(a.Spec.Pool.Name, b.Spec.Pool.Name), cmp.Compare(a.Name, b.Name))
		})
	}
	return out
}

// ours reports a slice of the driver's for one node.
func ours(s *resourceapi.ResourceSlice) bool {
	return s.Spec.Driver == gpushare.DRADriverName && s.Spec.NodeName != nil && *s.Spec.NodeName != ""
}

// Consumed tells the memory, in bytes, that allocated claims hold of a
// device of the driver's pool (kube-scheduler's allocated state).
type Consumed func(pool, device string) int64

// Devices reads a node's slices (ByNode's) as the allocator sees them.
func Devices(nodeSlices []*resourceapi.ResourceSlice, consumed Consumed) []Device {
	var out []Device
	for _, s := range nodeSlices {
		for _, d := range SliceDevices(s) {
			d.Consumed = consumed(d.Pool, d.Name)
			out = append(out, d)
		}
	}
	return out
}

// SliceDevices reads one slice's devices, nothing consumed: what a
// caller may keep while the slice is unchanged.
func SliceDevices(s *resourceapi.ResourceSlice) []Device {
	out := make([]Device, 0, len(s.Spec.Devices))
	for _, d := range s.Spec.Devices {
		mem, ok := d.Capacity[gpushare.DRACapacityMemory]
		if !ok {
			continue
		}
		out = append(out, Device{
			Pool:     s.Spec.Pool.Name,
			Name:     d.Name,
			Capacity: mem.Value.Value(),
			Domain:   stringAttribute(d, gpushare.DRAAttributeNVLinkDomain),
			Tier:     gpushare.Isolation(stringAttribute(d, gpushare.DRAAttributeIsolation)),
			Usable:   !repels(d.Taints),
		})
	}
	return out
}

func stringAttribute(d resourceapi.Device, name resourceapi.QualifiedName) string {
	if a, ok := d.Attributes[name]; ok && a.StringValue != nil {
		return *a.StringValue
	}
	return ""
}

// repels reports a taint that keeps a claim without tolerations off.
func repels(taints []resourceapi.DeviceTaint) bool {
	for _, t := range taints {
		if t.Effect == resourceapi.DeviceTaintEffectNoSchedule || t.Effect == resourceapi.DeviceTaintEffectNoExecute {
			return true
		}
	}
	return false
}

// ClaimOf reads what a pod's unallocated claims ask of the driver. It is
// false when they ask nothing of it, or ask in a form Predict does not model
// (another device class beside ours, alternatives other than the webhook's
// preferred NVLink, all devices, a selector other than a tier's, a
// constraint other than the webhook's, constraints across several claims):
// such a pod is not scored.
func ClaimOf(claims []*resourceapi.ResourceClaim) (Claim, bool) {
	var out Claim
	n := 0
	for _, rc := range claims {
		if rc.Status.Allocation != nil {
			continue // allocated already (a shared claim): it adds nothing here
		}
		c, ok := claimOf(rc.Spec.Devices)
		if !ok {
			return Claim{}, false
		}
		if len(c.Requests) > 0 {
			n++
		}
		out.Requests = append(out.Requests, c.Requests...)
		out.OneGPU, out.OneDomain, out.PreferDomain = out.OneGPU || c.OneGPU, out.OneDomain || c.OneDomain, out.PreferDomain || c.PreferDomain
	}
	if len(out.Requests) == 0 || (n > 1 && (out.OneGPU || out.OneDomain || out.PreferDomain)) {
		return Claim{}, false
	}
	return out, true
}

// claimOf reads one claim's requests and constraints.
func claimOf(spec resourceapi.DeviceClaim) (Claim, bool) {
	var out Claim
	distinct := map[string]bool{}
	linked := "" // the linked alternative of the one request that has alternatives
	for _, r := range spec.Requests {
		req, alternatives, ok := requestOf(r)
		if !ok || (alternatives && len(spec.Requests) > 1) {
			return Claim{}, false
		}
		if alternatives {
			linked = r.Name + "/" + gpushare.DRASubrequestLinked
		}
		out.Requests = append(out.Requests, req)
	}
	uuid := resourceapi.FullyQualifiedName(gpushare.DRAQualifiedAttribute(gpushare.DRAAttributeUUID))
	domain := resourceapi.FullyQualifiedName(gpushare.DRAQualifiedAttribute(gpushare.DRAAttributeNVLinkDomain))
	for _, c := range spec.Constraints {
		scope := c.Requests
		if len(scope) == 0 {
			for _, r := range spec.Requests {
				scope = append(scope, r.Name)
			}
		}
		switch {
		case c.DistinctAttribute != nil && *c.DistinctAttribute == uuid && c.MatchAttribute == nil && len(scope) == 1:
			distinct[scope[0]] = true // distinct GPUs within the request, as Predict takes them
		case c.MatchAttribute != nil && *c.MatchAttribute == uuid && len(c.Requests) == 0:
			out.OneGPU = true
		case c.MatchAttribute != nil && *c.MatchAttribute == domain && len(c.Requests) == 0:
			out.OneDomain = true
		case c.MatchAttribute != nil && *c.MatchAttribute == domain && linked != "" && slices.Equal(c.Requests, []string{linked}):
			out.PreferDomain = true
		default:
			return Claim{}, false
		}
	}
	for i, r := range out.Requests {
		// Without distinctAttribute the allocator may put two of a
		// request's shares on one GPU: not modelled.
		if r.Count > 1 && !distinct[spec.Requests[i].Name] {
			return Claim{}, false
		}
	}
	return out, true
}

// requestOf reads one request: exactly Count of our devices, with memory,
// or two such alternatives alike but for their names, DRASubrequestLinked
// then DRASubrequestAny (alternatives true: the webhook's preferred NVLink,
// whose constraint names the first).
func requestOf(r resourceapi.DeviceRequest) (req Request, alternatives, ok bool) {
	if r.Exactly != nil {
		req, ok = exactOf(r.Exactly)
		return req, false, ok
	}
	subs := r.FirstAvailable
	if len(subs) != 2 || subs[0].Name != gpushare.DRASubrequestLinked || subs[1].Name != gpushare.DRASubrequestAny {
		return Request{}, false, false
	}
	first, ok := exactOf(exactFields(subs[0]))
	second, ok2 := exactOf(exactFields(subs[1]))
	return first, true, ok && ok2 && first == second
}

// exactFields is an alternative as the request it would be alone.
func exactFields(s resourceapi.DeviceSubRequest) *resourceapi.ExactDeviceRequest {
	return &resourceapi.ExactDeviceRequest{DeviceClassName: s.DeviceClassName, Selectors: s.Selectors,
		AllocationMode: s.AllocationMode, Count: s.Count, Tolerations: s.Tolerations, Capacity: s.Capacity}
}

// exactOf reads exactly Count of our devices, with memory.
func exactOf(e *resourceapi.ExactDeviceRequest) (Request, bool) {
	if e.DeviceClassName != gpushare.DRADeviceClassName || e.Capacity == nil || len(e.Tolerations) > 0 ||
		(e.AdminAccess != nil && *e.AdminAccess) ||
		(e.AllocationMode != "" && e.AllocationMode != resourceapi.DeviceAllocationModeExactCount) {
		return Request{}, false
	}
	mem, ok := e.Capacity.Requests[gpushare.DRACapacityMemory]
	if !ok || mem.Value() <= 0 {
		return Request{}, false
	}
	tier, ok := tierOf(e.Selectors)
	if !ok {
		return Request{}, false
	}
	return Request{Bytes: mem.Value(), Count: int(max(e.Count, 1)), Tier: tier}, true
}

// tierOf reads the one selector the webhook may write.
func tierOf(sel []resourceapi.DeviceSelector) (gpushare.Isolation, bool) {
	switch {
	case len(sel) == 0:
		return gpushare.IsolationAny, true
	case len(sel) > 1 || sel[0].CEL == nil:
		return "", false
	}
	for _, t := range []gpushare.Isolation{gpushare.IsolationNone, gpushare.IsolationMPS, gpushare.IsolationHAMiCore} {
		if sel[0].CEL.Expression == gpushare.DRAIsolationSelector(t) {
			return t, true
		}
	}
	return "", false
}
