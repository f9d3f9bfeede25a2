package allocate

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

// podInfo is what Match and the backstop read from one pod's spec and
// annotations. Decoding it is most of an Allocate call's cost on a busy
// node, and it changes only with the pod's resourceVersion, so a Memo keeps
// it. It is shared between calls: never modified after decodePod.
type podInfo struct {
	reqs     []gpushare.ContainerRequest // every gpu-mem container, init first
	asg      gpushare.PodAssignment
	placed   bool              // the pod carries the extender's assignment
	recorded map[string]bool   // containers in the pod's container-env record
	sets     []gpushare.GPUSet // GPUs of each entry of reqs (one, or a multi-GPU pod's set); nil when unplaced
	charges  map[int]uint64    // units the pod charges per GPU; nil when unplaced
	problem  string            // why the pod cannot be served; empty when it can
	// tier and percent are the pod's isolation wishes (gpushare.io/isolation,
	// gpushare.io/compute-percent). A malformed one is tierProblem: it keeps
	// the pod from being served but not from charging its GPU, which its
	// annotations name all the same.
	tier        gpushare.Isolation
	percent     int
	tierProblem string
}

// decodePod reads pod once. A pod that cannot be served gets a problem and
// no placement; one without gpu-mem gets no requests.
func decodePod(pod *corev1.Pod) *podInfo {
	info := &podInfo{}
	reqs, err := gpushare.ContainerRequests(pod)
	if err != nil {
		info.problem = err.Error()
		return info
	}
	info.reqs = reqs
	if len(reqs) == 0 {
		return info
	}
	decodeTier(pod, info)
	if info.asg, info.placed, err = gpushare.DecodePodAssignment(pod.Annotations); err != nil {
		info.problem = err.Error()
		return info
	}
	if raw, ok := pod.Annotations[gpushare.AnnotationContainerEnv]; ok {
		rec, err := gpushare.DecodeContainerEnvs(raw)
		if err != nil {
			info.problem = err.Error()
			return info
		}
		info.recorded = make(map[string]bool, len(rec))
		for name := range rec {
			info.recorded[name] = true
		}
	}
	if !info.placed {
		return info
	}
	if info.charges, err = info.asg.Charges(reqs); err != nil {
		info.problem = err.Error()
		return info
	}
	info.sets = make([]gpushare.GPUSet, len(reqs))
	for i, r := range reqs {
		if info.sets[i], err = info.asg.SetFor(r); err != nil {
			info.problem = err.Error()
			return info
		}
	}
	return info
}

// decodeTier reads the pod's isolation annotations into info.
func decodeTier(pod *corev1.Pod, info *podInfo) {
	var err error
	if info.tier, info.percent, err = gpushare.PodIsolationRequest(pod.Annotations); err != nil {
		info.tierProblem = err.Error()
	}
}

// Memo keeps each pod's decoded state by UID for as long as its
// resourceVersion stays the same. It is not safe for concurrent use: the
// plugin uses it under the lock that serialises Allocate calls.
type Memo struct {
	entries map[types.UID]memoEntry
}

type memoEntry struct {
	resourceVersion string
	info            *podInfo
}

// NewMemo returns an empty Memo.
func NewMemo() *Memo { return &Memo{entries: map[types.UID]memoEntry{}} }

// info returns pod's decoded state, decoding it when the Memo is nil, the pod
// is new, or its resourceVersion changed. A pod without a resourceVersion
// (built by hand, never stored) is always decoded afresh.
func (m *Memo) info(pod *corev1.Pod) *podInfo {
	if m == nil || pod.ResourceVersion == "" {
		return decodePod(pod)
	}
	if e, ok := m.entries[pod.UID]; ok && e.resourceVersion == pod.ResourceVersion {
		return e.info
	}
	info := decodePod(pod)
	m.entries[pod.UID] = memoEntry{resourceVersion: pod.ResourceVersion, info: info}
	return info
}

// Retain forgets every pod not in pods, so the Memo does not grow with the
// node's history.
func (m *Memo) Retain(pods []*corev1.Pod) {
	if m == nil || len(m.entries) <= len(pods) && m.allIn(pods) {
		return
	}
	keep := make(map[types.UID]bool, len(pods))
	for _, p := range pods {
		keep[p.UID] = true
	}
	for uid := range m.entries {
		if !keep[uid] {
			delete(m.entries, uid)
		}
	}
}

// allIn reports whether every entry is one of pods' (the usual case between
// two calls), without building a set.
func (m *Memo) allIn(pods []*corev1.Pod) bool {
	found := 0
	for _, p := range pods {
		if _, ok := m.entries[p.UID]; ok {
			found++
		}
	}
	return found == len(m.entries)
}

// Len returns how many pods the Memo holds.
func (m *Memo) Len() int { return len(m.entries) }
