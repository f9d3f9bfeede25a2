package server

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/extender/cache"
)

// minPruneAt is how many remembered pods the tracker holds before it first
// drops those no longer pending between scrapes.
const minPruneAt = 1024

// unseenGrace is how long a pod the cache does not hold is still counted:
// the extender's informer may see a new pod after the scheduler filtered it.
// A pod deleted while pending is counted that long too.
const unseenGrace = 30 * time.Second

// PendingReason names why a pod the filter answered for fits none of the
// candidate nodes: the nearest kind (allocator.UnfitKinds) over the nodes the
// cache knows, or "" when it knows none. Only pods that fit nowhere pay
// for it, so a full cluster costs the filter a second pass, not every pod.
func PendingReason(c Cache, policy allocator.Policy, req allocator.Request, names []string) string {
	nearest := ""
	for _, n := range c.Nodes(names) {
		if n == nil {
			continue
		}
		_, unfit := allocator.Place(n, req, policy)
		if unfit == nil {
			continue
		}
		nearest = allocator.Nearest(nearest, allocator.Diagnose(n, req, policy, unfit))
		if nearest == allocator.KindWaiting {
			break
		}
	}
	return nearest
}

// pendingPods remembers why the filter last placed each pod nowhere, until the
// pod fits, is bound, or leaves: gpushare_extender_pending_pods counts them.
type pendingPods struct {
	pod  func(namespace, name string) (*cache.PodRecord, bool)
	now  func() time.Time
	desc *prometheus.Desc

	mu      sync.Mutex
	byUID   map[types.UID]pendingPod
	pruneAt int
}

type pendingPod struct {
	namespace, name, reason string
	at                      time.Time // when the filter last placed it nowhere
}

func newPendingPods(pod func(namespace, name string) (*cache.PodRecord, bool), now func() time.Time) *pendingPods {
	return &pendingPods{
		pod: pod,
		now: now,
		desc: prometheus.NewDesc("gpushare_extender_pending_pods",
			"Pods the filter last placed on no node and still unbound, by the nearest reason (allocator.UnfitKinds).",
			[]string{"reason"}, nil),
		byUID:   map[types.UID]pendingPod{},
		pruneAt: minPruneAt,
	}
}

// set records reason for pod; an empty reason forgets it.
func (p *pendingPods) set(pod *corev1.Pod, reason string) {
	if pod == nil || pod.UID == "" {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if reason == "" {
		delete(p.byUID, pod.UID)
		return
	}
	p.byUID[pod.UID] = pendingPod{namespace: pod.Namespace, name: pod.Name, reason: reason, at: p.now()}
	if len(p.byUID) >= p.pruneAt {
		// Pods deleted while pending are never filtered again: without
		// scrapes they would pile up. Halving here keeps the map within
		// twice the pods really pending, at amortised constant cost.
		p.countLocked()
		p.pruneAt = max(minPruneAt, 2*len(p.byUID))
	}
}

// forget drops pod uid (bound).
func (p *pendingPods) forget(uid types.UID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.byUID, uid)
}

// countLocked counts the remembered pods still unbound, by reason, and
// forgets the others: those the cache holds bound, terminating or replaced
// by a pod of another UID, and those it has not held for unseenGrace.
func (p *pendingPods) countLocked() map[string]int {
	counts := map[string]int{}
	now := p.now()
	for uid, e := range p.byUID {
		r, ok := p.pod(e.namespace, e.name)
		gone := ok && (r.UID != uid || r.NodeName != "" || r.Terminating)
		if gone || (!ok && now.Sub(e.at) > unseenGrace) {
			delete(p.byUID, uid)
			continue
		}
		counts[e.reason]++
	}
	return counts
}

// Describe implements prometheus.Collector.
func (p *pendingPods) Describe(ch chan<- *prometheus.Desc) { ch <- p.desc }

// Collect implements prometheus.Collector: a series for every reason, zero
// included, so alerts and panels never see one vanish.
func (p *pendingPods) Collect(ch chan<- prometheus.Metric) {
	p.mu.Lock()
	counts := p.countLocked()
	p.mu.Unlock()
	for _, k := range allocator.UnfitKinds() {
		if m, err := prometheus.NewConstMetric(p.desc, prometheus.GaugeValue, float64(counts[k]), k); err == nil {
			ch <- m
		}
	}
}
