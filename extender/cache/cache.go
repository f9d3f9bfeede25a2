package cache

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/extender/preempt"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

// Errors of Assume, matched with errors.Is.
var (
	// ErrUnknownNode means the node is not in the cache (not yet seen, or deleted).
	ErrUnknownNode = errors.New("node not in the extender's cache")
	// ErrAlreadyBound means the pod is already charged as bound to a node
	// (a *BoundError names it).
	ErrAlreadyBound = errors.New("pod already bound")
	// ErrBindInProgress means another bind of the same pod is running.
	ErrBindInProgress = errors.New("a bind of this pod is in progress")
)

// Config holds what a Cache needs.
type Config struct {
	Client kubernetes.Interface
	Logger *zap.Logger
	// AssumeTTL is how long a charge the informer has not confirmed (a pod
	// whose bind ended, or one a catch-up listed) waits before the cache asks
	// the API server whether the pod still holds it; zero means
	// DefaultAssumeTTL. Time alone never releases a charge: only the
	// informer or a GET showing the pod deleted, replaced, finished, unbound
	// or bound elsewhere does.
	AssumeTTL time.Duration
	// WriteHorizon is how long after a Binding was sent the API server may
	// still commit it, although its client already saw an error or gave up:
	// the API server's --request-timeout plus a margin for a write already
	// handed to etcd. A pod whose Binding got no definite answer is not
	// taken as unbound on a read started before that; zero means
	// DefaultWriteHorizon.
	WriteHorizon time.Duration
	// Verify reads one pod from the API server; nil means a GET through Client.
	Verify func(ctx context.Context, namespace, name string) (*corev1.Pod, error)
	// VerifyBatch caps the GETs of one verification round (one every quarter
	// TTL); zero means 20.
	VerifyBatch int
	// VerifyTimeout bounds one verification GET; zero means 5 seconds.
	VerifyTimeout time.Duration
	// OnVerify, when set, is told the result of every verification GET
	// (VerifyBound, VerifyReleased or VerifyError), for metrics.
	OnVerify func(result string)
	// Now returns the time; nil means time.Now. Tests pass a fake.
	Now func() time.Time
	// OnFreed, when set, is called after a change that may let a pod the
	// hold-back rule kept waiting fit: a charge removed, or an in-flight
	// charge allocated by the device plugin. It runs outside the cache's
	// lock, after the change is visible to readers, on the goroutine that
	// made it (an informer's handler, the binder or the verifier): it must
	// not block.
	OnFreed func()
	// Binder is this binder's name in the pods' gpushare.AnnotationBoundBy
	// (gpushare.BinderExtender or gpushare.BinderSchedulerPlugin).
	Binder string
	// OnForeignBind, when set, is told of each pod the informer shows bound
	// with a GPU assignment, after its initial list, that this cache never
	// charged and another binder signed (or nobody did): a second binder on
	// these nodes, whose charges this cache cannot see. It runs outside the
	// cache's lock on the informer's goroutine: it must not block.
	OnForeignBind func(pod *PodRecord)
	// Shared, when set, is the factory whose pod and node informers the
	// cache reads instead of watching pods and nodes itself: kube-scheduler's
	// in plugin mode, so its process decodes each event once and the API
	// server feeds one watch fewer. Its pod informer must leave finished pods
	// out, as the scheduler's does. Its owner starts and stops it; Run only
	// starts it too, which an informer factory allows.
	Shared informers.SharedInformerFactory
}

// Defaults of Config.
const (
	// DefaultAPIServerRequestTimeout is kube-apiserver's --request-timeout
	// default: the longest a request is handled before the API server
	// answers 504, and goes on handling it.
	DefaultAPIServerRequestTimeout = 60 * time.Second
	// WriteMargin is added to the API server's request timeout for a write
	// etcd received before the request's context ended, and commits after.
	WriteMargin = 15 * time.Second
	// DefaultWriteHorizon is WriteHorizon's default.
	DefaultWriteHorizon = DefaultAPIServerRequestTimeout + WriteMargin
	// DefaultAssumeTTL is above DefaultWriteHorizon, so the first GET of a
	// charge whose Binding got no definite answer can already settle it.
	DefaultAssumeTTL = 90 * time.Second
)

// Cache is the informer-fed, per-node GPU view. Build it with New, start it
// with Run. All methods are safe for concurrent use.
type Cache struct {
	log           *zap.Logger
	ttl           time.Duration
	horizon       time.Duration
	now           func() time.Time
	verify        func(ctx context.Context, namespace, name string) (*corev1.Pod, error)
	verifyBatch   int
	verifyTimeout time.Duration
	onVerify      func(result string)
	onFreed       func()
	binderName    string
	onForeignBind func(pod *PodRecord)

	podInformer  toolscache.SharedIndexInformer
	nodeInformer toolscache.SharedIndexInformer
	cmInformer   toolscache.SharedIndexInformer
	factories    []informers.SharedInformerFactory // started and shut down by Run
	shared       informers.SharedInformerFactory   // Config.Shared: started by Run, never shut down
	synced       []toolscache.InformerSynced

	mu sync.RWMutex
	// freed is set under mu by a change OnFreed must hear of; unlock tells it.
	freed bool
	// foreign are pods bound by another binder, for OnForeignBind; unlock
	// tells it.
	foreign []*PodRecord
	nodes   map[string]*nodeState
	// published holds each known node's *Published, replaced whole under
	// mu and read without it: a scheduler plugin's Filter reads one node per
	// call on sixteen goroutines, where a shared read lock costs more than
	// the placement.
	published publishedNodes
	pods      map[types.UID]*podState
	// released are pods Release dropped before this cache's informer
	// delivered their deletion: their late updates are ignored until it does.
	released map[types.UID]bool
}

// nodeState is everything known about one node; view is rebuilt from it.
type nodeState struct {
	name      string
	node      *corev1.Node // nil until seen, and after deletion while pods remain
	unhealthy []int        // from the unhealthy-gpu ConfigMap
	pods      map[types.UID]*podState
	view      *allocator.Node
	// layout is what node said of its GPUs (read by readLayout), decoded
	// again only when the node object changes, not with every pod.
	layout   nodeLayout
	layoutOf *corev1.Node
	// terminating are the charged pods being deleted, rebuilt with view.
	terminating []preempt.Holder
}

// nodeLayout is a node's GPUs, unused and healthy per its own description
// (a template each snapshot copies), and what snapshots share unchanged.
type nodeLayout struct {
	gpus    []allocator.GPU
	tiers   []allocator.Tier
	reasons map[int]string
	links   allocator.LinkScores
	shares  bool
}

// readLayout decodes node's description of its GPUs.
func readLayout(node *corev1.Node, log *zap.Logger) nodeLayout {
	var l nodeLayout
	var links []gpushare.GPULink
	l.gpus, l.tiers, l.reasons, links, l.shares = layout(node, log)
	l.links = allocator.NewLinkScores(l.gpus, links)
	return l
}

// Published is one node as the cache published it at one moment. View and
// Terminating never change once published. A reader may remember on it a fit
// it computed from View alone (RememberFit); a change to the node publishes a
// new Published, which remembers nothing.
type Published struct {
	View *allocator.Node
	// Terminating are the charged pods there being deleted (nil when none).
	Terminating []preempt.Holder
	fit         atomic.Pointer[rememberedFit]
}

// rememberedFit is a request key that fits a Published view, and its score.
type rememberedFit struct {
	key   string
	score int64
}

// Fit returns the score remembered for a request of key on s; ok is false
// when none is, or the last remembered was for another key.
func (s *Published) Fit(key string) (score int64, ok bool) {
	f := s.fit.Load()
	if f == nil || f.key != key {
		return 0, false
	}
	return f.score, true
}

// RememberFit keeps that a request of key fits s with score: the scheduler
// plugin's Filter places each pod on hundreds of nodes, most unchanged since
// the last pod, which asked alike in a burst of replicas. The last key
// remembered stands.
func (s *Published) RememberFit(key string, score int64) {
	s.fit.Store(&rememberedFit{key: key, score: score})
}

// podState is one charged (or assumed) pod.
type podState struct {
	uid       types.UID
	namespace string
	name      string
	node      string
	req       allocator.Request
	placement allocator.Placement
	charges   map[int]uint64
	podUnits  uint64 // the ALIYUN_COM_GPU_MEM_POD value, the plugin's view of the pod
	inFlight  bool
	// priority and terminating are what preemption weighs (Holders).
	priority    int32
	terminating bool
	gpuMemOnly  bool
	assumed     bool
	// unverified marks an assumed pod whose Binding got no definite answer
	// (timeout, lost connection, 5xx) and whose outcome the binder could not
	// read back: it may be bound, so it stays charged until verified.
	unverified bool
	// listed marks a pod charged by CatchUp from a LIST the informer has not
	// delivered yet: bound like a confirmed pod, verified like an assumed one.
	listed bool
	// verifyAt is when to ask the API server about an assumed pod whose bind
	// has ended, or a listed one, if the informer has not confirmed it by
	// then; zero while the bind runs (the binder decides) and for confirmed pods.
	verifyAt time.Time
	// landBy is, for an unverified pod, when its Binding can no longer be
	// committed (BindOutcomeUnknown's time plus the write horizon): a read
	// started before it that shows the pod unbound says nothing.
	landBy time.Time
	checks int // verifications that left the charge in place, for the backoff
}

// New builds a Cache and its informers; nothing runs until Run.
func New(cfg Config) (*Cache, error) {
	c := &Cache{
		log:           cfg.Logger,
		ttl:           cmp.Or(cfg.AssumeTTL, DefaultAssumeTTL),
		horizon:       cmp.Or(cfg.WriteHorizon, DefaultWriteHorizon),
		now:           cfg.Now,
		verify:        cfg.Verify,
		verifyBatch:   cmp.Or(cfg.VerifyBatch, 20),
		verifyTimeout: cmp.Or(cfg.VerifyTimeout, 5*time.Second),
		onVerify:      cfg.OnVerify,
		onFreed:       cfg.OnFreed,
		binderName:    cfg.Binder,
		onForeignBind: cfg.OnForeignBind,
		nodes:         map[string]*nodeState{},
		released:      map[types.UID]bool{},
		pods:          map[types.UID]*podState{},
	}
	if c.log == nil {
		c.log = zap.NewNop()
	}
	if c.now == nil {
		c.now = time.Now
	}
	if c.ttl < 0 || c.horizon < 0 || c.verifyBatch < 0 || c.verifyTimeout < 0 {
		return nil, fmt.Errorf("cache: negative AssumeTTL %v, WriteHorizon %v, VerifyBatch %d or VerifyTimeout %v", c.ttl, c.horizon, c.verifyBatch, c.verifyTimeout)
	}
	if c.verify == nil {
		if cfg.Client == nil {
			return nil, errors.New("cache: Client is required")
		}
		c.verify = func(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
			return cfg.Client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		}
	}
	cmFactory := informers.NewSharedInformerFactoryWithOptions(cfg.Client, 0, informers.WithNamespace(gpushare.UnhealthyConfigMapNamespace))
	c.factories = []informers.SharedInformerFactory{cmFactory}
	podFactory, nodeFactory := cfg.Shared, cfg.Shared
	if cfg.Shared == nil {
		podFactory, nodeFactory = ownFactories(cfg.Client)
		c.factories = append(c.factories, podFactory, nodeFactory)
	}
	c.shared = cfg.Shared
	c.podInformer = podFactory.Core().V1().Pods().Informer()
	c.nodeInformer = nodeFactory.Core().V1().Nodes().Informer()
	c.cmInformer = cmFactory.Core().V1().ConfigMaps().Informer()

	for _, h := range []struct {
		inf     toolscache.SharedIndexInformer
		upsert  func(obj any, initial bool)
		deleted func(any)
	}{
		{c.podInformer, c.upsertPod, c.deletePod},
		{c.nodeInformer, func(obj any, _ bool) { c.upsertNode(obj) }, c.deleteNode},
		{c.cmInformer, func(obj any, _ bool) { c.upsertConfigMap(obj) }, c.deleteConfigMap},
	} {
		reg, err := h.inf.AddEventHandler(toolscache.ResourceEventHandlerDetailedFuncs{
			AddFunc:    h.upsert,
			UpdateFunc: func(_, obj any) { h.upsert(obj, false) },
			DeleteFunc: h.deleted,
		})
		if err != nil {
			return nil, fmt.Errorf("add event handler: %w", err)
		}
		// The registration's HasSynced also waits for our handler to have
		// seen the initial list, so ready means the view is rebuilt.
		c.synced = append(c.synced, reg.HasSynced)
	}
	return c, nil
}

// ownFactories are the cache's own pod and node informers, when it shares none.
func ownFactories(client kubernetes.Interface) (pods, nodes informers.SharedInformerFactory) {
	// Finished pods never hold a GPU; leaving them out of the watch keeps
	// memory flat in clusters with many completed jobs. A pod that finishes
	// leaves the selector, which the informer reports as a delete.
	pods = informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.AndSelectors(
				fields.OneTermNotEqualSelector("status.phase", string(corev1.PodSucceeded)),
				fields.OneTermNotEqualSelector("status.phase", string(corev1.PodFailed)),
			).String()
		}),
		// The store keeps a PodRecord per pod, not the pod (record.go): use
		// Cache.Pod, never the typed lister.
		informers.WithTransform(compactPod))
	nodes = informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(trimNode))
	return pods, nodes
}

// Run starts the informers and the verification loop, and blocks until ctx ends.
func (c *Cache) Run(ctx context.Context) {
	for _, f := range c.factories {
		f.Start(ctx.Done())
	}
	if c.shared != nil {
		c.shared.Start(ctx.Done())
	}
	tick := time.NewTicker(max(c.ttl/4, 100*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			for _, f := range c.factories {
				f.Shutdown()
			}
			return
		case <-tick.C:
			c.verifyDue(ctx)
		}
	}
}

// HasSynced reports whether every informer's initial list has been applied.
func (c *Cache) HasSynced() bool {
	for _, s := range c.synced {
		if !s() {
			return false
		}
	}
	return true
}

// WaitForSync blocks until HasSynced or ctx ends, reporting which.
func (c *Cache) WaitForSync(ctx context.Context) bool {
	return toolscache.WaitForCacheSync(ctx.Done(), c.synced...)
}

// Pod returns the informer's record of a pod; callers must not modify it.
func (c *Cache) Pod(namespace, name string) (*PodRecord, bool) {
	obj, ok, err := c.podInformer.GetStore().GetByKey(namespace + "/" + name)
	if err != nil || !ok {
		return nil, false
	}
	return recordOf(obj)
}

// stored reports whether the pod informer's store still holds p (its
// deletion not delivered yet), or cannot tell.
func (c *Cache) stored(p *podState) bool {
	obj, ok, err := c.podInformer.GetStore().GetByKey(p.namespace + "/" + p.name)
	if err != nil {
		return true
	}
	if !ok {
		return false
	}
	r, isPod := recordOf(obj)
	return !isPod || r.UID == p.uid
}

// Node returns the snapshot of one node; ok is false for a node the cache
// has never seen or that was deleted.
func (c *Cache) Node(name string) (*allocator.Node, bool) {
	p, ok := c.Published(name)
	if !ok {
		return nil, false
	}
	return p.View, true
}

// Nodes returns the snapshots of names, nil for unknown nodes, under one read
// lock so a filter sees one consistent moment.
func (c *Cache) Nodes(names []string) []*allocator.Node {
	out := make([]*allocator.Node, len(names))
	c.mu.RLock()
	defer c.mu.RUnlock()
	for i, name := range names {
		if n, ok := c.nodes[name]; ok && n.node != nil {
			out[i] = n.view
		}
	}
	return out
}

// Holders returns node name's snapshot and the pods charged there, as
// preemption weighs them; ok is false for a node the cache does not know.
// A pod is evictable only when its charge is confirmed (bound, seen by the
// informer or a LIST) and it is not terminating.
func (c *Cache) Holders(name string) (*allocator.Node, []preempt.Holder, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	n, ok := c.nodes[name]
	if !ok || n.node == nil {
		return nil, nil, false
	}
	out := make([]preempt.Holder, 0, len(n.pods))
	for _, uid := range slices.Sorted(maps.Keys(n.pods)) {
		out = append(out, holderOf(n.pods[uid]))
	}
	return n.view, out, true
}

// Published returns node name as last published; ok is false for a node the
// cache has never seen or that was deleted.
func (c *Cache) Published(name string) (*Published, bool) {
	return c.published.load(name)
}

// holderOf is p as preemption weighs it.
func holderOf(p *podState) preempt.Holder {
	return preempt.Holder{
		UID: string(p.uid), Name: p.namespace + "/" + p.name, Priority: p.priority,
		Charges: p.charges, Evictable: !p.assumed && !p.unverified && !p.terminating, Terminating: p.terminating,
		GPUMemOnly: p.gpuMemOnly,
	}
}

// All returns the snapshots of every known node, sorted by name.
func (c *Cache) All() []*allocator.Node {
	c.mu.RLock()
	out := make([]*allocator.Node, 0, len(c.nodes))
	for _, n := range c.nodes {
		if n.node != nil {
			out = append(out, n.view)
		}
	}
	c.mu.RUnlock()
	slices.SortFunc(out, func(a, b *allocator.Node) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	return out
}

// BoundError is ErrAlreadyBound naming the node the pod is charged on.
type BoundError struct {
	Pod, Node string
	// Unverified: the charge comes from a bind whose outcome is unknown, so
	// the pod may or may not be bound there; ask the API server before
	// answering a retried bind.
	Unverified bool
}

func (e *BoundError) Error() string {
	return fmt.Sprintf("%v: %s is charged on node %s", ErrAlreadyBound, e.Pod, e.Node)
}

func (e *BoundError) Unwrap() error { return ErrAlreadyBound }

// Assumption is what Assume decided for a pod.
type Assumption struct {
	Request   allocator.Request
	Placement allocator.Placement
}

// Assume re-checks that pod fits node under the cache lock and, if it does,
// charges it there at once (state Assumed). The caller must follow with
// FinishBinding after a successful bind, Forget after a failed one, or
// BindOutcomeUnknown when it cannot tell.
func (c *Cache) Assume(pod *PodRecord, node string, policy allocator.Policy) (Assumption, error) {
	r, err := pod.Request()
	if err != nil {
		return Assumption{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	n, ok := c.nodes[node]
	if !ok || n.node == nil {
		return Assumption{}, fmt.Errorf("%w: %s", ErrUnknownNode, node)
	}
	if old, ok := c.pods[pod.UID]; ok {
		if old.assumed && old.verifyAt.IsZero() {
			// The scheduler retried while our first bind is still running.
			// Replacing that assumption would let the loser of the two
			// Bindings forget the winner's charge.
			return Assumption{}, fmt.Errorf("%w: %s/%s", ErrBindInProgress, pod.Namespace, pod.Name)
		}
		// Confirmed, listed, or assumed with its bind done but not yet seen
		// by the informer (whose stale copy still shows the pod unbound).
		return Assumption{}, &BoundError{Pod: pod.Namespace + "/" + pod.Name, Node: old.node, Unverified: old.unverified}
	}
	p, unfit := allocator.Place(n.view, r, policy)
	if unfit != nil {
		return Assumption{}, unfit
	}
	ps := &podState{
		uid: pod.UID, namespace: pod.Namespace, name: pod.Name, node: node,
		req: r, placement: p, charges: allocator.Charges(r, p), podUnits: r.Units,
		inFlight: true, assumed: true, priority: pod.Priority, gpuMemOnly: pod.GPUMemOnly,
	}
	c.addLocked(ps)
	return Assumption{Request: r, Placement: p}, nil
}

// FinishBinding records that the Binding of an assumed pod succeeded: the
// informer should show the pod bound soon. If it has not within the TTL, the
// cache asks the API server (it never drops the charge for the delay alone).
func (c *Cache) FinishBinding(uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p, ok := c.pods[uid]; ok && p.assumed {
		p.unverified, p.landBy, p.checks = false, time.Time{}, 0
		p.verifyAt = c.now().Add(c.ttl)
	}
}

// BindOutcomeUnknown records that the Binding of an assumed pod got no
// definite answer: the binder could not read the outcome back, or read the
// pod unbound while the Binding may still be committed (an API server goes
// on with a request after answering 504, etcd after its client gave up).
// The pod may be bound and using the memory, so it stays charged (and a
// retried bind is told so) until the informer shows it, or a GET settles it:
// one showing the pod unbound counts only if it started after the write
// horizon from now (ForgetUnbound, verification).
func (c *Cache) BindOutcomeUnknown(uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p, ok := c.pods[uid]; ok && p.assumed {
		now := c.now()
		p.unverified, p.landBy, p.checks = true, now.Add(c.horizon), 0
		p.verifyAt = later(now.Add(c.ttl), p.landBy)
	}
}

// Now is the time by the cache's clock, the clock of the write horizon:
// a caller reading a pod for ForgetUnbound takes it before the read.
func (c *Cache) Now() time.Time { return c.now() }

// ForgetUnbound drops the charge of an assumed pod whose Binding got no
// definite answer, on a read of the pod, started at readAt, that showed it
// unbound: only when readAt is past the write horizon, after which no
// Binding of it can still be committed. It reports whether it dropped it;
// before the horizon the charge stays.
func (c *Cache) ForgetUnbound(uid types.UID, readAt time.Time) bool {
	c.mu.Lock()
	defer c.unlock()
	p, ok := c.pods[uid]
	if !ok || !p.assumed || readAt.Before(p.landBy) {
		return false
	}
	c.removeLocked(p)
	c.freed = true
	return true
}

// LandBy is when the Binding of an unverified pod can no longer be
// committed; zero when the pod is not charged as unverified.
func (c *Cache) LandBy(uid types.UID) time.Time {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if p, ok := c.pods[uid]; ok && p.assumed && p.unverified {
		return p.landBy
	}
	return time.Time{}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// Forget drops an assumed pod (its bind definitely failed, or the API server
// shows it unbound). Confirmed and listed pods are left alone: the informer,
// not the binder, knows they are bound.
func (c *Cache) Forget(uid types.UID) {
	c.mu.Lock()
	defer c.unlock()
	if p, ok := c.pods[uid]; ok && p.assumed {
		c.removeLocked(p)
		c.freed = true
	}
}

// unlock releases the write lock, then calls OnFreed when a change made
// under it freed room: after the unlock, so a pod it wakes reads the change.
func (c *Cache) unlock() {
	freed, foreign := c.freed, c.foreign
	c.freed, c.foreign = false, nil
	c.mu.Unlock()
	if freed && c.onFreed != nil {
		c.onFreed()
	}
	if c.onForeignBind != nil {
		for _, p := range foreign {
			c.onForeignBind(p)
		}
	}
}

// objectOf unwraps a delete handler's tombstone.
func objectOf(obj any) any {
	if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		return t.Obj
	}
	return obj
}

// upsertPod applies a pod's add (initial: from the informer's first list) or
// update.
func (c *Cache) upsertPod(obj any, initial bool) {
	pod, ok := recordOf(obj)
	if !ok {
		return
	}
	ps, reason := c.podStateOf(pod)
	c.mu.Lock()
	defer c.unlock()
	if c.released[pod.UID] {
		return
	}
	old, had := c.pods[pod.UID]
	if ps != nil && !had && !initial && c.onForeignBind != nil && pod.Annotations[gpushare.AnnotationBoundBy] != c.binderName {
		c.foreign = append(c.foreign, pod)
	}
	if ps == nil {
		// Until the binder's Binding lands the informer still sees the pod
		// unbound; keep the assumption until the bind lands or is forgotten.
		// A listed pod's older, unbound versions may still be on their way too.
		if had && (old.assumed || old.listed) && pod.NodeName == "" && !finished(pod.Phase) {
			return
		}
		if reason != "" {
			c.log.Warn("pod not charged", zap.String("pod", pod.Namespace+"/"+pod.Name), zap.String("node", pod.NodeName), zap.String("reason", reason))
		}
		if had {
			c.removeLocked(old)
			c.freed = true
		}
		return
	}
	if had {
		c.removeLocked(old)
		c.freed = old.inFlight && !ps.inFlight || old.node != ps.node
	}
	c.addLocked(ps)
}

func (c *Cache) deletePod(obj any) {
	pod, ok := recordOf(objectOf(obj))
	if !ok {
		return
	}
	c.mu.Lock()
	defer c.unlock()
	delete(c.released, pod.UID)
	if old, ok := c.pods[pod.UID]; ok {
		c.removeLocked(old)
		c.freed = true
	}
}

// Release drops, on node, the charges of the given pods that this cache
// holds as terminating and whose deletion the pod informer's store already
// shows (it no longer holds the pod): the store changes before any handler
// runs, so kube-scheduler's handler (plugin mode, one shared informer) may
// have seen the deletion while this cache's has not yet. Charging them until
// then made the scheduler preempt again for room its first preemption had
// freed. A caller's word alone is no evidence: a pod missing from the
// scheduler's snapshot may be one bound after it, and a terminating pod
// still runs its containers through its grace period; such pods are kept.
// It returns how many pods it released.
func (c *Cache) Release(node string, uids []string) int {
	c.mu.Lock()
	defer c.unlock()
	n, ok := c.nodes[node]
	if !ok {
		return 0
	}
	released := 0
	for _, uid := range uids {
		p, ok := n.pods[types.UID(uid)]
		if !ok || !p.terminating || p.assumed || c.stored(p) {
			continue
		}
		c.released[p.uid] = true
		delete(c.pods, p.uid)
		delete(n.pods, p.uid)
		released++
	}
	if released > 0 {
		c.rebuildLocked(n)
		c.dropIfEmptyLocked(n)
		c.freed = true
	}
	return released
}

// finished reports whether a pod in phase has its containers gone for good.
func finished(phase corev1.PodPhase) bool {
	return phase == corev1.PodSucceeded || phase == corev1.PodFailed
}

// podStateOf reads a confirmed pod's charge from its annotations; nil when
// the pod holds no GPU, with a reason when it should and cannot be read.
func (c *Cache) podStateOf(pod *PodRecord) (*podState, string) {
	if pod.NodeName == "" || finished(pod.Phase) {
		return nil, ""
	}
	r, err := pod.ChargedRequest()
	if err != nil {
		return nil, err.Error()
	}
	if r.Units == 0 {
		return nil, ""
	}
	a, ok, err := gpushare.DecodePodAssignment(pod.Annotations)
	if err != nil {
		return nil, err.Error()
	}
	if !ok {
		// Bound by someone else without our annotations: the device plugin
		// refuses such a pod, so it holds no GPU memory.
		return nil, "bound without a GPU assignment"
	}
	p, err := allocator.PlacementFromAssignment(a, r)
	if err != nil {
		return nil, err.Error()
	}
	podUnits := a.PodUnits
	if podUnits == 0 {
		podUnits = r.Units
	}
	return &podState{
		uid: pod.UID, namespace: pod.Namespace, name: pod.Name, node: pod.NodeName,
		req: r, placement: p, charges: allocator.Charges(r, p), podUnits: podUnits,
		inFlight: !a.Assigned, priority: pod.Priority, terminating: pod.Terminating, gpuMemOnly: pod.GPUMemOnly,
	}, ""
}

func (c *Cache) upsertNode(obj any) {
	node, ok := obj.(*corev1.Node)
	if !ok {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodeLocked(node.Name)
	n.node = node
	c.rebuildLocked(n)
}

func (c *Cache) deleteNode(obj any) {
	node, ok := objectOf(obj).(*corev1.Node)
	if !ok {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	n, ok := c.nodes[node.Name]
	if !ok {
		return
	}
	n.node = nil
	c.publishLocked(n)
	c.dropIfEmptyLocked(n)
}

func (c *Cache) upsertConfigMap(obj any) {
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok {
		return
	}
	node, ok := unhealthyNode(cm)
	if !ok {
		return
	}
	gpus, err := gpushare.ParseUnhealthyGPUs(cm.Data[gpushare.UnhealthyConfigMapKey])
	if err != nil {
		// Keep avoiding what could be read: a typo must not make a broken GPU usable.
		c.log.Warn("unhealthy-GPU ConfigMap partly unreadable", zap.String("configmap", cm.Name), zap.Error(err))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodeLocked(node)
	n.unhealthy = gpus
	c.rebuildLocked(n)
}

func (c *Cache) deleteConfigMap(obj any) {
	cm, ok := objectOf(obj).(*corev1.ConfigMap)
	if !ok {
		return
	}
	node, ok := unhealthyNode(cm)
	if !ok {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if n, ok := c.nodes[node]; ok {
		n.unhealthy = nil
		c.rebuildLocked(n)
		c.dropIfEmptyLocked(n)
	}
}

// unhealthyNode returns the node an unhealthy-GPU ConfigMap is about.
func unhealthyNode(cm *corev1.ConfigMap) (string, bool) {
	if cm.Namespace != gpushare.UnhealthyConfigMapNamespace || len(cm.Name) <= len(gpushare.UnhealthyConfigMapPrefix) ||
		cm.Name[:len(gpushare.UnhealthyConfigMapPrefix)] != gpushare.UnhealthyConfigMapPrefix {
		return "", false
	}
	return cm.Name[len(gpushare.UnhealthyConfigMapPrefix):], true
}

func (c *Cache) nodeLocked(name string) *nodeState {
	n, ok := c.nodes[name]
	if !ok {
		n = &nodeState{name: name, pods: map[types.UID]*podState{}}
		c.nodes[name] = n
	}
	return n
}

func (c *Cache) dropIfEmptyLocked(n *nodeState) {
	if n.node == nil && len(n.pods) == 0 && len(n.unhealthy) == 0 {
		delete(c.nodes, n.name)
	}
}

func (c *Cache) addLocked(p *podState) {
	c.pods[p.uid] = p
	n := c.nodeLocked(p.node)
	n.pods[p.uid] = p
	c.rebuildLocked(n)
}

func (c *Cache) removeLocked(p *podState) {
	delete(c.pods, p.uid)
	if n, ok := c.nodes[p.node]; ok {
		delete(n.pods, p.uid)
		c.rebuildLocked(n)
		c.dropIfEmptyLocked(n)
	}
}

// rebuildLocked replaces n's snapshot. Snapshots are never modified after
// publication, so readers keep using theirs without locks.
func (c *Cache) rebuildLocked(n *nodeState) {
	v := &allocator.Node{Name: n.name}
	if n.node != nil {
		if n.layoutOf != n.node {
			n.layout, n.layoutOf = readLayout(n.node, c.log), n.node
		}
		l := n.layout
		v.GPUs, v.Tiers, v.IsolationReasons, v.Links, v.GPUShare = slices.Clone(l.gpus), l.tiers, l.reasons, l.links, l.shares
		for _, idx := range n.unhealthy {
			if i, ok := slices.BinarySearchFunc(v.GPUs, idx, func(g allocator.GPU, t int) int { return g.Index - t }); ok {
				v.GPUs[i].Healthy = false
			}
		}
	}
	n.terminating = nil
	for _, uid := range slices.Sorted(maps.Keys(n.pods)) {
		p := n.pods[uid]
		if p.terminating {
			n.terminating = append(n.terminating, holderOf(p))
		}
		for g, units := range p.charges {
			if i, ok := slices.BinarySearchFunc(v.GPUs, g, func(x allocator.GPU, t int) int { return x.Index - t }); ok {
				v.GPUs[i].Used += units
			}
		}
		if p.inFlight {
			v.InFlight = append(v.InFlight, allocator.InFlight{
				Pod: p.namespace + "/" + p.name, PodUnits: p.podUnits, Isolation: p.req.Isolation,
				Slots: allocator.Slots(p.req, p.placement),
			})
		}
	}
	n.view = v
	c.publishLocked(n)
}

// publishLocked makes n's snapshot what lock-free readers see, or hides a
// node not (or no longer) seen.
func (c *Cache) publishLocked(n *nodeState) {
	if n.node == nil {
		c.published.store(n.name, nil)
		return
	}
	c.published.store(n.name, &Published{View: n.view, Terminating: n.terminating})
}

// layout returns a node's GPUs, healthy per the node annotation or all
// healthy in the total/count fallback, their isolation tiers (nil when all
// offer none, always so in the fallback), why a GPU fell back from its tier
// (nil when none did), the links between them (nil in the fallback), and
// whether the node shares GPUs.
func layout(node *corev1.Node, log *zap.Logger) ([]allocator.GPU, []allocator.Tier, map[int]string, []gpushare.GPULink, bool) {
	total := quantity(node, gpushare.ResourceName)
	if total == 0 {
		return nil, nil, nil, nil, false
	}
	if raw, ok := node.Annotations[gpushare.AnnotationNodeGPUs]; ok {
		desc, err := gpushare.DecodeNodeGPUs(raw)
		if err == nil && len(desc.GPUs) > 0 {
			gpus := make([]allocator.GPU, len(desc.GPUs))
			for i, g := range desc.GPUs {
				gpus[i] = allocator.GPU{Index: g.Index, Units: g.Units, Healthy: g.Healthy}
			}
			tiers, reasons := tiersOf(desc.GPUs)
			return gpus, tiers, reasons, desc.Links, true
		}
		log.Warn("node GPU description unreadable, dividing the total by the GPU count", zap.String("node", node.Name), zap.Error(err))
	}
	count := quantity(node, gpushare.ResourceCount)
	if count == 0 || count > gpushare.MaxGPUsPerNode {
		return nil, nil, nil, nil, false
	}
	out := make([]allocator.GPU, count)
	for i := range out {
		out[i] = allocator.GPU{Index: i, Units: total / count, Healthy: true}
	}
	return out, nil, nil, nil, true
}

// tiersOf reads the published GPUs' effective tiers, by position (nil when
// every GPU offers none, so nodes without isolation cost nothing more; a GPU
// that fell back is fenced), and why a GPU fell back, by index (nil when none
// did).
func tiersOf(gpus []gpushare.GPUInfo) ([]allocator.Tier, map[int]string) {
	var tiers []allocator.Tier
	var reasons map[int]string
	for i, g := range gpus {
		t := allocator.TierOf(g.Isolation)
		if g.IsolationReason != "" {
			t = allocator.TierFenced // its plugin refuses every container there
		}
		if t != allocator.TierNone {
			if tiers == nil {
				tiers = make([]allocator.Tier, len(gpus))
			}
			tiers[i] = t
		}
		if g.IsolationReason != "" {
			if reasons == nil {
				reasons = map[int]string{}
			}
			reasons[g.Index] = g.IsolationReason
		}
	}
	return tiers, reasons
}

// quantity reads an extended resource from allocatable, else capacity.
func quantity(node *corev1.Node, name corev1.ResourceName) uint64 {
	q, ok := node.Status.Allocatable[name]
	if !ok {
		q, ok = node.Status.Capacity[name]
	}
	limit := int64(gpushare.MaxUnits) * gpushare.MaxGPUsPerNode
	// The float bound first: CmpInt64 alone builds 10^exponent, endless for 1e999999999.
	if !ok || q.Sign() <= 0 || q.AsApproximateFloat64() > 2*float64(limit) || q.CmpInt64(limit) > 0 {
		return 0
	}
	return uint64(q.Value())
}
