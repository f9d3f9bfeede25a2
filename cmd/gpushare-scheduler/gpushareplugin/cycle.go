package gpushareplugin

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/extender/cache"
	"github.com/gpushare/gpushare/extender/preempt"
)

const stateKey fwk.StateKey = Name

// state is one pod's scheduling cycle: its request from PreFilter, what the
// scheduler's preemption took off or put on each node in its what-ifs, and
// the placement Reserve charged.
type state struct {
	record *cache.PodRecord
	req    allocator.Request
	// key is req's allocator.Request.Key under the plugin's policy: a fit
	// remembered under it on a node's published view is this pod's fit too.
	key string
	// removed and added are, by node, the pods RemovePod took off (victims
	// under evaluation) and the pods AddPod put on that were not taken off
	// first (pods nominated there).
	removed map[string][]preempt.Holder
	added   map[string][]nominated
	// scores are Filter's placements scored on views the cycle changed (a
	// what-if, or deleted pods left off), for Score; shared by clones. A fit
	// on a node's published view is remembered there instead.
	scores *nodeScores
	// assumed is set by Reserve; bindStarted once Bind sent the Binding,
	// after which the binder, not Unreserve, settles the charge.
	assumed     *cache.Assumption
	bindStarted bool
}

// Clone copies the what-if maps, which RemovePod and AddPod change on the
// clones the scheduler's preemption makes; the rest is shared.
func (s *state) Clone() fwk.StateData {
	c := *s
	c.removed = maps.Clone(s.removed)
	c.added = maps.Clone(s.added)
	return &c
}

// nodeScores are, by node, what the placement Filter found scores
// (allocator.ScorePlaced): Score reads them instead of placing the pod again
// on a second read of the cache. Filter runs on many nodes at once.
type nodeScores struct {
	mu   sync.Mutex
	m    map[string]int64
	size atomic.Int32 // len(m), read without mu
}

func (n *nodeScores) set(node string, score int64) {
	n.mu.Lock()
	n.m[node] = score
	n.size.Store(int32(len(n.m)))
	n.mu.Unlock()
}

// drop forgets node's score, if any: a later pass placed the pod on the
// node's published view and remembered the fit there.
func (n *nodeScores) drop(node string) {
	if n.size.Load() == 0 {
		return
	}
	n.mu.Lock()
	delete(n.m, node)
	n.size.Store(int32(len(n.m)))
	n.mu.Unlock()
}

func (n *nodeScores) get(node string) (int64, bool) {
	if n.size.Load() == 0 { // the common case: every fit was remembered on its node
		return 0, false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	v, ok := n.m[node]
	return v, ok
}

// nominated is a pod AddPod put on a node that holds nothing there yet.
type nominated struct {
	uid string
	req allocator.Request
}

// stateOf returns the pod's cycle state, nil when PreFilter skipped the pod.
func stateOf(cs fwk.CycleState) *state {
	d, err := cs.Read(stateKey)
	if err != nil {
		return nil
	}
	s, _ := d.(*state)
	return s
}

// PreFilter reads the pod's request; pods asking for no gpu-mem are skipped
// (the other plugins and the default binder handle them). An unreadable
// request is unresolvable, with the extender's reason.
func (p *Plugin) PreFilter(_ context.Context, cs fwk.CycleState, pod *corev1.Pod, _ []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	rec := cache.RecordOf(pod)
	if !rec.NamesGPUMem {
		return nil, fwk.NewStatus(fwk.Skip)
	}
	req, err := rec.Request()
	if err != nil {
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, err.Error())
	}
	if req.Units == 0 {
		return nil, fwk.NewStatus(fwk.Skip)
	}
	cs.Write(stateKey, &state{record: rec, req: req, key: fitKey(p.policy, req), removed: map[string][]preempt.Holder{}, added: map[string][]nominated{},
		scores: &nodeScores{m: map[string]int64{}}})
	return nil, nil
}

// fitKey is what a fit of req under policy is remembered by on a node's
// published view (cache.Published.RememberFit).
func fitKey(policy allocator.Policy, req allocator.Request) string {
	return policy.String() + "/" + req.Key()
}

// PreFilterExtensions lets preemption's what-ifs reach Filter.
func (p *Plugin) PreFilterExtensions() fwk.PreFilterExtensions { return p }

// AddPod puts a pod back on the node in the what-if: a victim RemovePod took
// off returns to its own GPUs (preemption reprieving it); any other pod is
// one nominated to the node, placed where it would go.
func (p *Plugin) AddPod(_ context.Context, cs fwk.CycleState, _ *corev1.Pod, add fwk.PodInfo, node fwk.NodeInfo) *fwk.Status {
	s := stateOf(cs)
	if s == nil {
		return nil
	}
	name, uid := node.Node().Name, string(add.GetPod().UID)
	if i := slices.IndexFunc(s.removed[name], func(h preempt.Holder) bool { return h.UID == uid }); i >= 0 {
		s.removed[name] = slices.Delete(slices.Clone(s.removed[name]), i, i+1)
		return nil
	}
	req, err := cache.RecordOf(add.GetPod()).Request()
	if err != nil || req.Units == 0 {
		return nil
	}
	s.added[name] = append(slices.Clip(s.added[name]), nominated{uid: uid, req: req})
	return nil
}

// RemovePod takes a pod off the node in the what-if: a nominated pod AddPod
// put there, or a victim under evaluation, with the GPUs it holds.
func (p *Plugin) RemovePod(_ context.Context, cs fwk.CycleState, _ *corev1.Pod, remove fwk.PodInfo, node fwk.NodeInfo) *fwk.Status {
	s := stateOf(cs)
	if s == nil {
		return nil
	}
	name, uid := node.Node().Name, string(remove.GetPod().UID)
	if i := slices.IndexFunc(s.added[name], func(n nominated) bool { return n.uid == uid }); i >= 0 {
		s.added[name] = slices.Delete(slices.Clone(s.added[name]), i, i+1)
		return nil
	}
	_, holders, ok := p.cache.Holders(name)
	if !ok {
		return nil
	}
	for _, h := range holders {
		if h.UID == uid && !slices.ContainsFunc(s.removed[name], func(r preempt.Holder) bool { return r.UID == uid }) {
			s.removed[name] = append(slices.Clip(s.removed[name]), h)
		}
	}
	return nil
}

// view is the node as the cycle sees it: the cache's published view with the
// what-if applied (pub.View itself when nothing applies).
//
// Pods the cache holds as terminating that the scheduler no longer lists are
// off it (deleted: the scheduler's watch was first). Counted, they made the
// scheduler preempt again, for room its first preemption had freed (three
// test bed runs in four evicted one more pod so). In a preemption what-if
// (RemovePod ran for this node) every terminating pod is off too: its
// memory is on its way back. Otherwise the cache's charges stand, whatever
// the scheduler lists: only they prevent over-commit.
func (p *Plugin) view(s *state, node fwk.NodeInfo, pub *cache.Published) *allocator.Node {
	name := node.Node().Name
	n := pub.View
	victims := s.removed[name]
	off := slices.Clone(victims)
	for _, h := range pub.Terminating {
		if (len(victims) > 0 || !listedOn(node, h.UID)) && !slices.ContainsFunc(victims, func(v preempt.Holder) bool { return v.UID == h.UID }) {
			off = append(off, h)
		}
	}
	if len(off) > 0 {
		n = preempt.Without(n, off)
	}
	for _, a := range s.added[name] {
		n = withPlaced(n, a.req, p.policy)
	}
	return n
}

// listedOn tells whether the scheduler's node info lists the pod.
func listedOn(node fwk.NodeInfo, uid string) bool {
	return slices.ContainsFunc(node.GetPods(), func(pi fwk.PodInfo) bool { return string(pi.GetPod().UID) == uid })
}

// withPlaced returns n with r charged where Place puts it; n itself when r
// does not fit (the nominated pod then holds nothing there).
func withPlaced(n *allocator.Node, r allocator.Request, policy allocator.Policy) *allocator.Node {
	pl, unfit := allocator.Place(n, r, policy)
	if unfit != nil {
		return n
	}
	out := *n
	out.GPUs = slices.Clone(n.GPUs)
	for g, u := range allocator.Charges(r, pl) {
		if i, ok := slices.BinarySearchFunc(out.GPUs, g, func(x allocator.GPU, t int) int { return x.Index - t }); ok {
			out.GPUs[i].Used += u
		}
	}
	return &out
}

// Filter places the pod on the node's GPUs as the extender's filter does,
// with its reasons: unresolvable when evicting pods cannot help, Pending
// when only the hold-back rule keeps it off (it fits once an in-flight pod
// is allocated: the pod is held, and retried when the cache sees that). A
// fit is scored here, for Score.
//
// In the scheduler's pass with pods nominated to the node (on a clone of
// the state) and the pass without them that follows, both store a score;
// the last, without them, stands, as the extender scores the cache's nodes.
func (p *Plugin) Filter(_ context.Context, cs fwk.CycleState, pod *corev1.Pod, node fwk.NodeInfo) *fwk.Status {
	s := stateOf(cs)
	if s == nil {
		return nil
	}
	name := node.Node().Name
	unfit, known := p.place(s, node)
	if known && unfit != nil && unfit.Waiting {
		p.held.hold(pod)
		unfit, known = p.place(s, node)
	}
	switch {
	case !known:
		return fwk.NewStatus(fwk.Unschedulable, "node "+name+" is not in the gpushare cache")
	case unfit == nil:
		return nil
	case unfit.Unresolvable:
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, unfit.Reason)
	case unfit.Waiting:
		return fwk.NewStatus(fwk.Pending, unfit.Reason)
	}
	return fwk.NewStatus(fwk.Unschedulable, unfit.Reason)
}

// place tries the pod on the node as the cycle sees it and keeps a fit's
// score for Score: remembered on the node's published view when the cycle
// changed nothing of it (where a fit remembered for the same key is the
// answer), else in the cycle's scores. known is false for a node the cache
// does not know.
func (p *Plugin) place(s *state, node fwk.NodeInfo) (unfit *allocator.Unfit, known bool) {
	name := node.Node().Name
	pub, known := p.cache.Published(name)
	if !known {
		return nil, false
	}
	n := p.view(s, node, pub)
	published := n == pub.View
	if published {
		s.scores.drop(name)
		if _, ok := pub.Fit(s.key); ok {
			return nil, true
		}
	}
	pl, unfit := allocator.Place(n, s.req, p.policy)
	if unfit != nil {
		return unfit, true
	}
	score := allocator.ScorePlaced(n, s.req, pl, p.policy)
	if published {
		pub.RememberFit(s.key, score)
	} else {
		s.scores.set(name, score)
	}
	return nil, true
}

// PreScore skips scoring for pods PreFilter skipped, unless their DRA
// claims ask the gpushare driver for memory: those are scored by drascore.
func (p *Plugin) PreScore(_ context.Context, cs fwk.CycleState, pod *corev1.Pod, nodes []fwk.NodeInfo) *fwk.Status {
	if stateOf(cs) != nil {
		return nil
	}
	scores, ok := p.scoreDRA(pod, nodes)
	if !ok {
		return fwk.NewStatus(fwk.Skip)
	}
	cs.Write(draStateKey, scores)
	return nil
}

// Score is the extender's prioritize, scaled to the framework's range: the
// score of the placement Filter found on the node, kept by place.
func (p *Plugin) Score(_ context.Context, cs fwk.CycleState, _ *corev1.Pod, node fwk.NodeInfo) (int64, *fwk.Status) {
	s := stateOf(cs)
	name := node.Node().Name
	if s == nil {
		if d, err := cs.Read(draStateKey); err == nil {
			return d.(draScores)[name], nil
		}
		return 0, nil
	}
	score, ok := s.scores.get(name)
	if !ok {
		pub, known := p.cache.Published(name)
		if !known {
			return 0, nil
		}
		// Remembered by Filter, unless the node changed since: then the
		// pod is placed on the cache's node as it is now.
		if score, ok = pub.Fit(s.key); !ok {
			score = allocator.Score(pub.View, s.req, p.policy)
		}
	}
	return score * (fwk.MaxNodeScore / maxExtenderPriority), nil
}

// maxExtenderPriority is allocator.Score's top (the extender API's 10).
const maxExtenderPriority = 10

// ScoreExtensions: the scores need no normalising.
func (p *Plugin) ScoreExtensions() fwk.ScoreExtensions { return nil }

// Reserve charges the pod's GPUs in the cache under its lock, re-checking
// the fit, so no later pod of this scheduler takes them before the bind.
// The deleted pods Filter left off (view) are released first, or the
// re-check would refuse the room Filter found.
func (p *Plugin) Reserve(_ context.Context, cs fwk.CycleState, _ *corev1.Pod, node string) *fwk.Status {
	s := stateOf(cs)
	if s == nil {
		return nil
	}
	p.releaseDeleted(node)
	a, err := p.cache.Assume(s.record, node, p.policy)
	if err != nil {
		var unfit *allocator.Unfit
		if errors.As(err, &unfit) {
			return fwk.NewStatus(fwk.Unschedulable, unfit.Reason)
		}
		return fwk.AsStatus(err)
	}
	s.assumed = &a
	return nil
}

// Unreserve drops the charge of a pod that is not going to be bound; once
// the Binding was sent, the binder has settled the charge by its answer.
func (p *Plugin) Unreserve(_ context.Context, cs fwk.CycleState, pod *corev1.Pod, _ string) {
	s := stateOf(cs)
	if s == nil || s.assumed == nil || s.bindStarted {
		return
	}
	p.cache.Forget(pod.UID)
	s.assumed = nil
}

// Bind sends the one annotated Binding; pods PreFilter skipped are left to
// the default binder.
func (p *Plugin) Bind(ctx context.Context, cs fwk.CycleState, _ *corev1.Pod, node string) *fwk.Status {
	s := stateOf(cs)
	if s == nil || s.assumed == nil {
		return fwk.NewStatus(fwk.Skip)
	}
	s.bindStarted = true
	if err := p.binder.BindAssumed(ctx, s.record, node, *s.assumed); err != nil {
		return fwk.AsStatus(err)
	}
	return nil
}

// releaseDeleted releases, in the cache, the terminating pods on node that
// the scheduler's snapshot no longer lists.
func (p *Plugin) releaseDeleted(node string) {
	pub, ok := p.cache.Published(node)
	if !ok || len(pub.Terminating) == 0 {
		return
	}
	info, err := p.nodeInfo(node)
	if err != nil {
		return
	}
	var deleted []string
	for _, h := range pub.Terminating {
		if !listedOn(info, h.UID) {
			deleted = append(deleted, h.UID)
		}
	}
	if n := p.cache.Release(node, deleted); n > 0 {
		p.log.Info("released pods the scheduler saw deleted before the GPU cache did", zap.String("node", node), zap.Int("pods", n))
	}
}
