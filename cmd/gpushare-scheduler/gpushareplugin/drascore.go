package gpushareplugin

import (
	"sync"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"k8s.io/dynamic-resource-allocation/structured"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/gpushare/gpushare/extender/drascore"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

// draStateKey holds a DRA pod's node scores from PreScore to Score.
const draStateKey fwk.StateKey = Name + "/dra"

// draScores are a pod's node scores for its gpu-mem claims, by node name.
type draScores map[string]int64

// Clone: the scores are read only after PreScore.
func (s draScores) Clone() fwk.StateData { return s }

// scoreDRA scores the feasible nodes for a pod whose claims ask the
// gpushare DRA driver for memory (drascore: where kube-scheduler's
// allocator will put them, scored by the plugin's policy). It is false for
// a pod with no such claim, or when the DRA objects cannot be read: the
// pod is then not scored by this plugin, as before it had a DRA score.
func (p *Plugin) scoreDRA(pod *corev1.Pod, nodes []fwk.NodeInfo) (draScores, bool) {
	if p.dra == nil || len(pod.Spec.ResourceClaims) == 0 {
		return nil, false
	}
	claims, ok := p.podClaims(pod)
	if !ok {
		return nil, false
	}
	c, ok := drascore.ClaimOf(claims)
	if !ok {
		return nil, false
	}
	all, err := p.dra.ResourceSlices().ListWithDeviceTaintRules()
	if err != nil {
		return nil, false
	}
	state, err := p.dra.ResourceClaims().GatherAllocatedState()
	if err != nil {
		return nil, false
	}
	byNode, read := p.slices.reader(all)
	out := make(draScores, len(nodes))
	for _, n := range nodes {
		name := n.Node().Name
		if s, fits := drascore.Score(read(byNode[name], state), c, p.policy); fits {
			out[name] = s
		}
	}
	return out, true
}

// sliceCache keeps each of the driver's ResourceSlices read as devices,
// with their IDs in kube-scheduler's allocated state, and the slices
// grouped by node: reading and grouping every node's slices again for each
// pod was most of the DRA score's cost (BenchmarkScoreDRA). A changed slice
// is a new object, so the cache is keyed by the objects listed and never
// stale; a list that differs rebuilds the grouping, reading only the slices
// it does not hold yet.
type sliceCache struct {
	mu     sync.Mutex
	listed map[*resourceapi.ResourceSlice]bool     // every slice of the last list, any driver's
	byNode map[string][]*resourceapi.ResourceSlice // ours, drascore.ByNode of that list
	m      map[*resourceapi.ResourceSlice]cachedSlice
}

type cachedSlice struct {
	devs []drascore.Device // nothing consumed
	ids  []structured.DeviceID
}

// reader refreshes the cache to the slices listed now and returns ours by
// node and how to read a node's slices as devices with what the allocated
// state consumes. The maps are built anew only when the list changed, and
// never written after: the caller reads them without the lock. The devices
// read are valid until the next read of the same reader.
func (c *sliceCache) reader(all []*resourceapi.ResourceSlice) (map[string][]*resourceapi.ResourceSlice, func([]*resourceapi.ResourceSlice, *structured.AllocatedState) []drascore.Device) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.holdsExactly(all) {
		c.rebuild(all)
	}
	m := c.m
	var buf []drascore.Device
	return c.byNode, func(nodeSlices []*resourceapi.ResourceSlice, state *structured.AllocatedState) []drascore.Device {
		buf = buf[:0]
		for _, s := range nodeSlices {
			e := m[s]
			for i, d := range e.devs {
				d.Consumed = consumedOf(state, e.ids[i])
				buf = append(buf, d)
			}
		}
		return buf
	}
}

// holdsExactly reports whether the cache was built from exactly the slices
// of all.
func (c *sliceCache) holdsExactly(all []*resourceapi.ResourceSlice) bool {
	if len(all) != len(c.listed) {
		return false
	}
	for _, s := range all {
		if !c.listed[s] {
			return false
		}
	}
	return true
}

// rebuild groups all by node anew, keeping the slices already read.
func (c *sliceCache) rebuild(all []*resourceapi.ResourceSlice) {
	listed := make(map[*resourceapi.ResourceSlice]bool, len(all))
	for _, s := range all {
		listed[s] = true
	}
	byNode := drascore.ByNode(all)
	m := make(map[*resourceapi.ResourceSlice]cachedSlice, len(c.m))
	for _, ss := range byNode {
		for _, s := range ss {
			e, ok := c.m[s]
			if !ok {
				e = readSlice(s)
			}
			m[s] = e
		}
	}
	c.listed, c.byNode, c.m = listed, byNode, m
}

// readSlice reads a slice's devices and their IDs in the allocated state.
func readSlice(s *resourceapi.ResourceSlice) cachedSlice {
	e := cachedSlice{devs: drascore.SliceDevices(s)}
	for _, d := range e.devs {
		e.ids = append(e.ids, structured.MakeDeviceID(gpushare.DRADriverName, d.Pool, d.Name))
	}
	return e
}

// podClaims are the pod's ResourceClaims as the scheduler's tracker holds
// them; false while one is not created yet (the DRA plugin's PreFilter
// then keeps the pod from this far).
func (p *Plugin) podClaims(pod *corev1.Pod) ([]*resourceapi.ResourceClaim, bool) {
	out := make([]*resourceapi.ResourceClaim, 0, len(pod.Spec.ResourceClaims))
	for i := range pod.Spec.ResourceClaims {
		name, _, err := resourceclaim.Name(pod, &pod.Spec.ResourceClaims[i])
		if err != nil || name == nil {
			if err == nil {
				continue // a template's claim not needed by this pod
			}
			return nil, false
		}
		rc, err := p.dra.ResourceClaims().Get(pod.Namespace, *name)
		if err != nil {
			return nil, false
		}
		out = append(out, rc)
	}
	return out, true
}

// consumedOf reads the memory allocated claims hold of a device: the
// consumed capacity of a shared device, the whole of one allocated without
// sharing (drascore then sees it full).
func consumedOf(state *structured.AllocatedState, id structured.DeviceID) int64 {
	if state.AllocatedDevices.Has(id) {
		return 1 << 62 // more than any GPU holds: Predict never takes it
	}
	if q := state.AggregatedCapacity[id][gpushare.DRACapacityMemory]; q != nil {
		return q.Value()
	}
	return 0
}
