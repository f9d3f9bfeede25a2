package gpushareplugin

import (
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
	consumed := consumedIn(state)
	byNode := drascore.ByNode(all)
	out := make(draScores, len(nodes))
	for _, n := range nodes {
		name := n.Node().Name
		if s, fits := drascore.Score(drascore.Devices(byNode[name], consumed), c, p.policy); fits {
			out[name] = s
		}
	}
	return out, true
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

// consumedIn reads the memory allocated claims hold of each of the
// driver's devices: the consumed capacity of a shared device, the whole of
// one allocated without sharing (drascore then sees it full).
func consumedIn(state *structured.AllocatedState) drascore.Consumed {
	return func(pool, device string) int64 {
		id := structured.MakeDeviceID(gpushare.DRADriverName, pool, device)
		if state.AllocatedDevices.Has(id) {
			return 1 << 62 // more than any GPU holds: Predict never takes it
		}
		if q := state.AggregatedCapacity[id][gpushare.DRACapacityMemory]; q != nil {
			return q.Value()
		}
		return 0
	}
}
