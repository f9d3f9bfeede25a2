package manager

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpushare/gpushare/plugin/allocate"
	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/inventory"
	"github.com/gpushare/gpushare/plugin/isolation"
	"github.com/gpushare/gpushare/plugin/podresources"
	"github.com/gpushare/gpushare/plugin/podsource"
	"github.com/gpushare/gpushare/plugin/server"
)

// allocator answers Allocate: it matches the call with allocate.Match on
// the pod store, waits a bounded time for a pod bound a moment ago to reach
// the store, records what it served in memory and on the pod.
type allocator struct {
	log       *zap.Logger
	node      string
	src       *podsource.Source
	rec       *recorder
	inventory func() *inventory.Inventory
	wait      time.Duration

	// holders, when set, tells which container the kubelet gave each device
	// (its pod-resources API); nil keeps the matched pod as the truth.
	holders func(context.Context) (podresources.Allocations, error)

	// mu serialises calls: each decision must see every earlier one in served.
	mu     sync.Mutex
	served allocate.Served
	// proven are the served containers the kubelet's own account confirmed
	// (the holder of their devices, or their pod's status): no later doubt
	// about another answer may un-serve them.
	proven map[types.UID]map[string]bool
	// memo keeps each pod decoded until its resourceVersion changes.
	memo *allocate.Memo
	// metrics counts answers and refusals; nil counts nothing.
	metrics *Metrics
	// pending are answers whose holder the kubelet has not shown yet.
	pending []pendingServe
	// deviceList shapes each answer (envvar, volume-mounts, CDI).
	deviceList server.DeviceList
	// tiers returns each GPU's isolation tier state (nil: no tiers known);
	// tierPaths are where the tiers' files are on the host.
	tiers     func(*inventory.Inventory) map[int]isolation.Status
	tierPaths isolation.Config
	// events records refusals on the Node; nil records none.
	events *nodeEvents
	// restarted is when the kubelet was last seen restarting (UnixNano), set
	// without the lock: registering again must never wait for a call or a
	// record write that holds it (kubeletRestarted).
	restarted atomic.Int64
}

// pendingServe is an answered call waiting for the kubelet to show whose
// container got its devices.
type pendingServe struct {
	decision allocate.Decision
	devices  []string // the call's devices: IDs are unique among running containers
	at       time.Time
}

// beforeRestart tells whether p was answered to a kubelet that has restarted
// since: the new kubelet shows what it kept from its checkpoint, and a
// container it does not show it will ask for again. The new kubelet calls
// only after the plugin registered again, so after restarted was set.
func (a *allocator) beforeRestart(p pendingServe) bool {
	return p.at.UnixNano() < a.restarted.Load()
}

// attributeTimeout bounds how long an answer waits for its holder. The
// kubelet records the devices right after Allocate returns, so only a pod
// whose admission failed afterwards, or a pod-resources API that does not
// answer, gets this far.
const attributeTimeout = 3 * time.Second

// Allocate implements server.Allocator.
func (a *allocator) Allocate(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	start := time.Now()
	inv := a.inventory()
	units := make([]uint64, 0, len(req.GetContainerRequests()))
	seen := map[string]bool{}
	for _, c := range req.GetContainerRequests() {
		for _, id := range c.GetDevicesIds() {
			if _, _, err := inv.ParseDevice(id); err != nil {
				return nil, status.Errorf(codes.InvalidArgument, "gpushare: %v", err)
			}
			// Units are counted by IDs; the kubelet never repeats one.
			if seen[id] {
				return nil, status.Errorf(codes.InvalidArgument, "gpushare: device %s appears twice in one Allocate call", id)
			}
			seen[id] = true
		}
		units = append(units, uint64(len(c.GetDevicesIds())))
	}

	a.mu.Lock()
	defer a.mu.Unlock()
	// The kubelet admits pods one at a time: the devices of its previous call
	// are in its pod-resources answer by now, so settle that call first.
	a.attributeLocked(ctx)
	decisions, err := a.match(ctx, inv, units)
	if err != nil {
		return nil, err
	}

	resp := &pluginapi.AllocateResponse{}
	for _, d := range decisions {
		c, err := a.answer(inv, d)
		if err != nil {
			// Never a container without its GPU or its limit.
			a.log.Error("Allocate refused: the answer cannot be built", zap.String("pod", d.Pod.Namespace+"/"+d.Pod.Name),
				zap.String("container", d.Container.Name), zap.Error(err))
			return nil, status.Errorf(codes.Internal, "gpushare: %v", err)
		}
		resp.ContainerResponses = append(resp.ContainerResponses, c)
	}
	for i, d := range decisions {
		a.served.Add(d.Pod.UID, d.Container.Name, d.Env)
		log := a.log.With(zap.String("pod", d.Pod.Namespace+"/"+d.Pod.Name), zap.String("container", d.Container.Name),
			zap.Stringer("gpus", d.Env.Set()), zap.Uint64("units", d.Env.ContainerUnits))
		if len(d.Conflicts) > 0 {
			log.Warn("ambiguous Allocate: in-flight containers of this size have different GPUs or limits; "+
				"the scheduler extender's rule was not followed and this answer may be for another pod",
				zap.Strings("conflicts", d.Conflicts))
		}
		if ids := req.GetContainerRequests()[i].GetDevicesIds(); a.holders != nil && len(ids) > 0 {
			a.pending = append(a.pending, pendingServe{decision: d, devices: ids, at: time.Now()})
		} else {
			a.recordLocked(ctx, d)
		}
		log.Info("allocated")
	}
	a.metrics.count(outcomeAllocated, len(decisions))
	a.log.Debug("Allocate answered", zap.Duration("took", time.Since(start)))
	return resp, nil
}

// answer builds one container's response: the device-list strategy's, with
// its tier's composed in.
func (a *allocator) answer(inv *inventory.Inventory, d allocate.Decision) (*pluginapi.ContainerAllocateResponse, error) {
	var uuids []string
	for _, i := range d.Env.Set().Indices() {
		g, _ := inv.GPU(i) // Match serves only GPUs the inventory has
		uuids = append(uuids, g.UUID)
	}
	req := isolation.Request{Env: d.Env, UUIDs: uuids, Unit: inv.Unit()}
	if d.Env.Isolation == gpushare.IsolationHAMiCore {
		dir, err := newCacheDir(a.tierPaths.HAMiCacheRoot)
		if err != nil {
			return nil, err
		}
		req.CacheDir = dir
	}
	tier, err := isolation.For(a.tierPaths, req)
	if err != nil {
		return nil, err
	}
	return a.deviceList.ContainerResponseWith(d.Env, uuids, tier)
}

// newCacheDir creates a fresh hami-core cache directory under root, named at
// random: an answer must not depend on its pod (the kubelet may be serving
// another pod of the same signature), and no two containers may share one.
// Any user of the container must be able to create the cache file in it.
func newCacheDir(root string) (string, error) {
	dir, err := os.MkdirTemp(root, "c-")
	if err != nil {
		return "", fmt.Errorf("create the container's HAMi-core cache directory: %w", err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		return "", fmt.Errorf("create the container's HAMi-core cache directory: %w", err)
	}
	return dir, nil
}

// match finds the containers a call is for (allocate.Match) on the node's
// pods, every answer confirmed with a fresh read (fresh.go). It waits up to
// a.wait for a pod bound a moment ago to reach the cache, or a pod that left
// to leave it, and matches on a fresh list of the node's pods when the cache
// has had no match for a while (listPlan says when, and when to give up). A
// list that proves nobody waits for the call refuses it at once.
func (a *allocator) match(ctx context.Context, inv *inventory.Inventory, units []uint64) ([]allocate.Decision, error) {
	start := time.Now()
	plan := newListPlan(start, a.wait)
	for first := true; ; first = false {
		if !first {
			// An earlier answer the kubelet did not keep (its pod left, its
			// devices dropped) holds its mark until it settles: without this
			// the call would be refused on that stale mark (the soak's
			// "no pod ... waits for a container", seed 1796164238172663089).
			a.attributeLocked(ctx)
		}
		changed := a.src.Changed()
		in := a.cachedInput(inv)
		decisions, err := a.matchConfirmed(ctx, in, units)
		if err != nil && plan.due(time.Now(), len(a.pending) == 0) {
			var nobody bool
			if decisions, nobody, err = a.matchListed(ctx, in, units, plan, err); nobody {
				return nil, a.refuse(units, err, start)
			}
		}
		if err == nil {
			return decisions, nil
		}
		if errors.Is(err, allocate.ErrIsolationDown) {
			// Refused at once: the tier is probed every few seconds, and a
			// container must not wait on it (the pod is created again).
			a.metrics.count(outcomeIsolation, len(units))
			a.log.Error("Allocate refused: the node's isolation tier is down", zap.Uint64s("units", units), zap.Error(err))
			a.events.allocateRefused(units, err)
			return nil, status.Error(codes.FailedPrecondition, err.Error())
		}
		if !errors.Is(err, allocate.ErrNoMatch) && !errors.Is(err, allocate.ErrOvercommit) {
			a.metrics.count(outcomeInvalid, len(units))
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		now := time.Now()
		settle, unsettled := a.nextSettle()
		if plan.over(now) && !unsettled {
			return nil, a.refuse(units, err, start)
		}
		wake := plan.wake(now)
		if unsettled {
			wake = min(wake, max(settle.Sub(now), 0))
		}
		t := time.NewTimer(wake)
		select {
		case <-changed:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		t.Stop()
	}
}

// matchListed matches the call on a fresh list of the node's pods; with no
// list answering it returns cachedErr, the match on the cache. nobody says
// that the list proved nobody waits for the call (nobodyWaits) while no
// earlier answer was unsettled, so it is refused at once.
func (a *allocator) matchListed(ctx context.Context, in allocate.Input, units []uint64, plan *listPlan, cachedErr error) (_ []allocate.Decision, nobody bool, _ error) {
	listed := a.listPods(ctx)
	plan.listed(time.Now(), listed != nil)
	if listed == nil {
		return nil, false, cachedErr
	}
	in.Pods = listed
	decisions, err := a.matchConfirmed(ctx, in, units)
	if nobodyWaits(err) && len(a.pending) > 0 {
		plan.undecided()
		return nil, false, err
	}
	return decisions, nobodyWaits(err), err
}

// nextSettle is when the oldest answer still waiting for its holder settles
// at the latest (attributeTimeout after it), and whether there is one. A
// call is refused only once none is left: until then a mark that hides the
// container the call is for may be one the kubelet did not keep.
func (a *allocator) nextSettle() (time.Time, bool) {
	if len(a.pending) == 0 {
		return time.Time{}, false
	}
	at := a.pending[0].at
	for _, p := range a.pending[1:] {
		if p.at.Before(at) {
			at = p.at
		}
	}
	// Just past the timeout: settling needs strictly more than attributeTimeout.
	return at.Add(attributeTimeout + time.Millisecond), true
}

// cachedInput is Match's input from the plugin's cache.
func (a *allocator) cachedInput(inv *inventory.Inventory) allocate.Input {
	cached := a.src.Pods()
	a.prune(cached)
	a.memo.Retain(cached)
	in := allocate.Input{Node: a.node, Inventory: inv, Pods: cached, Served: a.served, Memo: a.memo, Isolation: a.tiers(inv)}
	if n, ok := a.src.Node(); ok {
		in.DisableIsolation = gpushare.IsolationDisabled(n.Labels)
	}
	return in
}

// refuse logs and counts a call refused after waiting since start, and
// returns the gRPC error for the kubelet.
func (a *allocator) refuse(units []uint64, err error, start time.Time) error {
	a.events.allocateRefused(units, err)
	waited := zap.Duration("waited", time.Since(start))
	if errors.Is(err, allocate.ErrOvercommit) {
		a.metrics.count(outcomeOvercommit, len(units))
		a.log.Error("Allocate refused: the GPU would hold more than it has", zap.Uint64s("units", units), waited, zap.Error(err))
		return status.Error(codes.ResourceExhausted, err.Error())
	}
	a.metrics.count(outcomeNoMatch, len(units))
	// The marks held in memory are what a refusal of a waiting pod would
	// come from: logged so that one can be traced.
	a.log.Warn("Allocate matched no pod", zap.Uint64s("units", units), waited, zap.Strings("servedInMemory", a.marks()), zap.Error(err))
	return status.Error(codes.FailedPrecondition, err.Error())
}

// marks lists the containers served in memory, "uid/container", sorted.
func (a *allocator) marks() []string {
	var out []string
	for uid, containers := range a.served {
		for name := range containers {
			out = append(out, string(uid)+"/"+name)
		}
	}
	slices.Sort(out)
	return out
}

// prune forgets served containers whose pod left the store or whose pod's
// record already shows them, so memory does not grow with the node's history.
func (a *allocator) prune(pods []*corev1.Pod) {
	defer a.pruneProven()
	if len(a.served) == 0 {
		return
	}
	byUID := make(map[string]*corev1.Pod, len(pods))
	for _, p := range pods {
		byUID[string(p.UID)] = p
	}
	for uid, containers := range a.served {
		p, ok := byUID[string(uid)]
		if !ok {
			delete(a.served, uid)
			continue
		}
		raw, ok := p.Annotations[gpushare.AnnotationContainerEnv]
		if !ok {
			continue
		}
		rec, err := gpushare.DecodeContainerEnvs(raw)
		if err != nil {
			continue
		}
		for name := range containers {
			if _, ok := rec[name]; ok {
				delete(containers, name)
			}
		}
		if len(containers) == 0 {
			delete(a.served, uid)
		}
	}
}

// pruneProven forgets the proofs of containers no longer served in memory.
func (a *allocator) pruneProven() {
	for uid, names := range a.proven {
		for name := range names {
			if _, ok := a.served[uid][name]; !ok {
				delete(names, name)
			}
		}
		if len(names) == 0 {
			delete(a.proven, uid)
		}
	}
}

// prove marks a served container as confirmed by the kubelet.
func (a *allocator) prove(uid types.UID, container string) {
	if a.proven == nil {
		a.proven = map[types.UID]map[string]bool{}
	}
	if a.proven[uid] == nil {
		a.proven[uid] = map[string]bool{}
	}
	a.proven[uid][container] = true
}

// recordLocked writes what container d got on its pod. Every caller has
// proof that d's container got it (or runs without the pod-resources API,
// where nothing is ever un-served), so the mark becomes proven.
func (a *allocator) recordLocked(ctx context.Context, d allocate.Decision) {
	a.prove(d.Pod.UID, d.Container.Name)
	if retrying, err := a.rec.record(ctx, d); err != nil {
		// The environment is right whatever happens to the record, and the
		// in-memory record keeps this process from serving the container
		// twice; failing the pod would help nobody. The recorder retries in
		// the background where that can help.
		a.log.Warn("record the container's environment on the pod", zap.String("pod", d.Pod.Namespace+"/"+d.Pod.Name),
			zap.String("container", d.Container.Name), zap.Bool("retrying", retrying), zap.Error(err))
	}
}

// attribute settles pending answers; the manager calls it periodically so
// the last call of a burst is recorded without waiting for another.
func (a *allocator) attribute(ctx context.Context) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.attributeLocked(ctx)
}

// attributeLocked checks, for each pending answer, whose container the
// kubelet gave the devices to. Usually it is the matched one. It is not when
// the kubelet called for a pod that is not in flight: a restarted kubelet
// admits again a pod being deleted whose devices it had already released,
// and allocates it anew. Trusting the match would then mark an in-flight pod
// served that is still to come, and every later call of that size would be
// answered one pod off. So the served mark moves to the real holder when it
// is in flight (it got the same environment, by the extender's rule), and is
// dropped otherwise; only then is the record written.
func (a *allocator) attributeLocked(ctx context.Context) {
	if len(a.pending) == 0 {
		return
	}
	hctx, cancel := context.WithTimeout(ctx, time.Second)
	holders, err := a.holders(hctx)
	cancel()
	keep := a.pending[:0]
	for _, p := range a.pending {
		d := p.decision
		switch {
		case err != nil && time.Since(p.at) > attributeTimeout:
			// Recording the matched pod unchecked could mark a pod served whose
			// call is still to come, while the reconciler records the pod that
			// really got it: one call counted twice.
			a.unserve(d)
			a.log.Warn("the kubelet's pod-resources API does not answer; the answer stays unrecorded until its pod's containers start",
				zap.String("pod", d.Pod.Namespace+"/"+d.Pod.Name), zap.String("container", d.Container.Name), zap.Error(err))
		case err != nil:
			keep = append(keep, p)
		case plainInit(d.Container):
			if !a.settleInit(ctx, p, holders) {
				keep = append(keep, p)
			}
		default:
			if !a.settle(ctx, p, holders) {
				keep = append(keep, p)
			}
		}
	}
	a.pending = keep
}

// settle settles an answer for a regular container or a sidecar by the
// holder of its devices; false means it waits for the next look.
func (a *allocator) settle(ctx context.Context, p pendingServe, kubelet podresources.Allocations) bool {
	d := p.decision
	h, found := kubelet.Holders[p.devices[0]]
	switch {
	case found && h.Namespace == d.Pod.Namespace && h.Pod == d.Pod.Name && h.Container == d.Container.Name:
		a.recordLocked(ctx, d)
	case found:
		a.unserve(d)
		a.moveTo(ctx, d, h, func(r gpushare.ContainerRequest) bool { return r.Name == h.Container })
	case a.beforeRestart(p) && kubelet.Pods[d.Pod.Namespace+"/"+d.Pod.Name]:
		// Kept as served, the container the kubelet asks for again would
		// skip it and take the next waiting container's environment: a pod
		// with two containers of one size on two GPUs ran one on the
		// other's GPU (TestSystemKubeletRestart in CI).
		a.unserve(d)
		a.log.Info("the restarted kubelet did not keep the devices of an Allocate answered before its restart; the container waits again",
			zap.String("pod", d.Pod.Namespace+"/"+d.Pod.Name), zap.String("container", d.Container.Name))
	case time.Since(p.at) > attributeTimeout:
		a.unserve(d)
		a.log.Warn("no container holds the devices of an answered Allocate (the kubelet refused the pod after it?); the matched container waits again",
			zap.String("pod", d.Pod.Namespace+"/"+d.Pod.Name), zap.String("container", d.Container.Name))
	default:
		return false
	}
	return true
}

// plainInit reports whether r is an init container that runs to completion
// before the next one starts (not a sidecar).
func plainInit(r gpushare.ContainerRequest) bool { return r.Init && !r.Sidecar }

// settleInit settles an answer for a plain init container. The kubelet's
// pod-resources List reports regular containers and sidecars only
// (pkg/kubelet/apis/podresources/server_v1.go, Kubernetes v1.37), so such a
// container never shows as a holder; but the device manager hands an init
// container's devices on to the containers of the same pod that follow it
// (devicesToReuse in pkg/kubelet/cm/devicemanager/manager.go), so they show
// up under the pod that really got the answer. When nothing after it uses
// the GPU, the answer is dropped after attributeTimeout and the reconciler
// records the pod once its first container has started.
func (a *allocator) settleInit(ctx context.Context, p pendingServe, kubelet podresources.Allocations) bool {
	d := p.decision
	for _, id := range p.devices {
		h, ok := kubelet.Holders[id]
		switch {
		case !ok:
			continue
		case h.Namespace == d.Pod.Namespace && h.Pod == d.Pod.Name:
			a.recordLocked(ctx, d)
		default:
			a.unserve(d)
			a.moveTo(ctx, d, h, plainInit)
		}
		return true
	}
	restarted := a.beforeRestart(p) && kubelet.Pods[d.Pod.Namespace+"/"+d.Pod.Name]
	if time.Since(p.at) <= attributeTimeout && !restarted {
		return false
	}
	a.unserve(d)
	a.log.Info("no later container of the pod holds an init container's devices; its record waits for the pod to start",
		zap.String("pod", d.Pod.Namespace+"/"+d.Pod.Name), zap.String("container", d.Container.Name))
	return true
}

// kubeletRestarted notes that the kubelet restarted: every answer given
// until now went to the old one (beforeRestart). It takes no lock: the
// plugin registers again right after it, and the restarted kubelet refuses
// every pod it admits before that ("no healthy devices present"), so it must
// not wait for an Allocate or a record write holding the allocator's lock.
func (a *allocator) kubeletRestarted() {
	a.restarted.Store(time.Now().UnixNano())
}

func (a *allocator) unserve(d allocate.Decision) {
	if a.proven[d.Pod.UID][d.Container.Name] {
		return // the kubelet confirmed this container served by another call
	}
	if m := a.served[d.Pod.UID]; m != nil {
		delete(m, d.Container.Name)
		if len(m) == 0 {
			delete(a.served, d.Pod.UID)
		}
	}
}

// moveTo records d's answer on the first container of h's pod that want
// accepts, when that pod is in flight and the container, of d's size, still
// waits for it.
func (a *allocator) moveTo(ctx context.Context, d allocate.Decision, h podresources.Holder, want func(gpushare.ContainerRequest) bool) {
	log := a.log.With(zap.String("matched", d.Pod.Namespace+"/"+d.Pod.Name+"/"+d.Container.Name),
		zap.String("holder", h.Namespace+"/"+h.Pod+"/"+h.Container))
	if p, r, ok := a.waitingContainer(h, d.Container.Units, want); ok {
		log.Info("the kubelet gave the answer to another in-flight container of the same size; recording it there",
			zap.String("recorded", r.Name))
		a.served.Add(p.UID, r.Name, d.Env)
		a.recordLocked(ctx, allocate.Decision{Pod: p, Container: r, Env: d.Env})
		return
	}
	log.Warn("the kubelet allocated devices to a container that is not waiting for a GPU " +
		"(a pod being deleted, admitted again after a kubelet restart?); the matched container waits again")
}

// waitingContainer finds h's pod on this node, in flight, and its first
// container of units units that want accepts and the plugin has not served.
// It reads the pod's annotations afresh: it runs only when the kubelet and
// the plugin disagree, which is rare.
func (a *allocator) waitingContainer(h podresources.Holder, units uint64, want func(gpushare.ContainerRequest) bool) (*corev1.Pod, gpushare.ContainerRequest, bool) {
	p, ok := a.src.Pod(h.Namespace, h.Pod)
	if !ok || p.Spec.NodeName != a.node || p.DeletionTimestamp != nil {
		return nil, gpushare.ContainerRequest{}, false
	}
	asg, placed, err := gpushare.DecodePodAssignment(p.Annotations)
	if err != nil || !placed || asg.Assigned {
		return nil, gpushare.ContainerRequest{}, false
	}
	reqs, err := gpushare.ContainerRequests(p)
	if err != nil {
		return nil, gpushare.ContainerRequest{}, false
	}
	for _, r := range reqs {
		if r.Units != units || !want(r) {
			continue
		}
		if _, done := a.served[p.UID][r.Name]; !done {
			return p, r, true
		}
	}
	return nil, gpushare.ContainerRequest{}, false
}
