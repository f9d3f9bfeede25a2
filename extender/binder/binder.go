package binder

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/extender/cache"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

// ErrUIDMismatch means the pod named in the bind request was replaced by
// another pod of the same name; binding it would place the wrong pod.
var ErrUIDMismatch = errors.New("pod UID does not match the bind request")

// ErrRefused is wrapped by every error of a bind the extender will not carry
// out because it is not its to make, whatever the cluster's state: a pod that
// does not mention aliyun.com/gpu-mem in any container, or a node that is not
// in the extender's cache with GPUs. Such a bind is refused before any API
// write (the server answers it with a 4xx).
var ErrRefused = errors.New("bind refused")

// Config holds what a Binder needs.
type Config struct {
	Client kubernetes.Interface
	Cache  *cache.Cache
	Policy allocator.Policy
	Logger *zap.Logger
	// Name signs each Binding (gpushare.AnnotationBoundBy), so another
	// binder on the same nodes can tell the pod is not its own; empty means
	// gpushare.BinderExtender.
	Name string
	// Now returns the time for ALIYUN_COM_GPU_MEM_ASSUME_TIME; nil means time.Now.
	Now func() time.Time
	// BindTimeout bounds the Binding POST, which runs detached from the
	// scheduler's request (so a scheduler giving up cannot cut it in half)
	// but never past a deadline of that request's context (the leader's
	// term); zero means DefaultBindTimeout.
	BindTimeout time.Duration
	// VerifyTimeout bounds the GET that reads back the outcome of a Binding
	// that got no definite answer; zero means DefaultVerifyTimeout.
	VerifyTimeout time.Duration
	// OnAmbiguous, when set, is told how every Binding without a definite
	// answer was resolved: AmbiguousBound, AmbiguousReleased or
	// AmbiguousUnknown; for metrics.
	OnAmbiguous func(resolution string)
	// Events, when set, records on each pod a Normal GPUShareScheduled
	// event once it is bound and a Warning GPUShareBindRefused when Bind
	// refuses it, so `kubectl describe pod` tells where it went or why not;
	// nil records none (the scheduler plugin's framework records its own).
	Events EventRecorder
}

// EventRecorder is the part of client-go's events.EventRecorder the binder
// uses; events.NewFakeRecorder satisfies it too.
type EventRecorder interface {
	Eventf(regarding, related runtime.Object, eventtype, reason, action, note string, args ...any)
}

// Defaults of Config. kube-scheduler must wait longer than a bind can take:
// its extender httpTimeout should exceed BindTimeout + VerifyTimeout plus the
// pod GET a bind may start with (the shipped configurations set 30s).
const (
	DefaultBindTimeout   = 10 * time.Second
	DefaultVerifyTimeout = 5 * time.Second
)

// Resolutions of a Binding without a definite answer, the values OnAmbiguous receives.
const (
	// AmbiguousBound: the GET shows the pod bound to the node with its
	// assignment; the charge stays and the bind succeeds.
	AmbiguousBound = "bound"
	// AmbiguousReleased: the GET shows the pod gone, replaced or bound
	// elsewhere, none of which a late commit of the Binding can undo; the
	// charge is dropped and the bind fails.
	AmbiguousReleased = "released"
	// AmbiguousPending: the GET shows the pod unbound, but the Binding may
	// still be committed; the charge stays, unverified, until the informer
	// shows the pod or a read after the write horizon settles it, and the
	// bind fails.
	AmbiguousPending = "pending"
	// AmbiguousUnknown: the GET failed too; the charge stays (the cache
	// verifies it later) and the bind fails.
	AmbiguousUnknown = "unknown"
)

// Binder binds pods to nodes with their GPU assignment.
type Binder struct {
	cfg Config
	log *zap.Logger
}

// New returns a Binder.
func New(cfg Config) *Binder {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Name == "" {
		cfg.Name = gpushare.BinderExtender
	}
	if cfg.BindTimeout <= 0 {
		cfg.BindTimeout = DefaultBindTimeout
	}
	if cfg.VerifyTimeout <= 0 {
		cfg.VerifyTimeout = DefaultVerifyTimeout
	}
	if cfg.OnAmbiguous == nil {
		cfg.OnAmbiguous = func(string) {}
	}
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	return &Binder{cfg: cfg, log: log}
}

// Bind places the pod of args on args.Node. An *allocator.Unfit error means
// the pod no longer fits there (the scheduler retries it elsewhere). Every
// error is also recorded as an event on the pod (Config.Events).
func (b *Binder) Bind(ctx context.Context, args extenderv1.ExtenderBindingArgs) error {
	err := b.bind(ctx, args)
	if err != nil {
		b.refused(args, err)
	}
	return err
}

func (b *Binder) bind(ctx context.Context, args extenderv1.ExtenderBindingArgs) error {
	key := args.PodNamespace + "/" + args.PodName
	// Only nodes the extender accounts GPUs for: checked before anything
	// else, so a bind to any other name costs no API call at all.
	if n, ok := b.cfg.Cache.Node(args.Node); !ok {
		return fmt.Errorf("%w: pod %s: node %s is not in the extender's cache", ErrRefused, key, args.Node)
	} else if len(n.GPUs) == 0 {
		return fmt.Errorf("%w: pod %s: node %s has no GPU in the extender's cache", ErrRefused, key, args.Node)
	}
	pod, err := b.pod(ctx, args.PodNamespace, args.PodName, args.PodUID)
	if err != nil {
		return err
	}
	r, err := pod.Request()
	if err != nil {
		return fmt.Errorf("bind pod %s: %w", key, err)
	}
	if !pod.NamesGPUMem {
		// gpu-mem: 0 is bound (the scheduler sends us every pod naming the
		// resource), a pod that does not name it at all is not ours.
		return fmt.Errorf("%w: pod %s does not request %s in any container: not a gpushare pod", ErrRefused, key, gpushare.ResourceName)
	}
	if pod.NodeName != "" {
		// A retry of a bind that did succeed (the scheduler's request timed
		// out after we answered): succeed again only if it is the same bind.
		if pod.NodeName == args.Node {
			if _, ok, err := gpushare.DecodePodAssignment(pod.Annotations); r.Units == 0 || (ok && err == nil) {
				return nil
			}
		}
		return fmt.Errorf("pod %s is already bound to node %s", key, pod.NodeName)
	}
	if r.Units == 0 {
		return b.bindNoGPU(ctx, pod, args)
	}
	assumed, err := b.cfg.Cache.Assume(pod, args.Node, b.cfg.Policy)
	var bound *cache.BoundError
	if errors.As(err, &bound) && bound.Node == args.Node {
		// A retry of a bind that ended, arriving before the informer showed
		// it (so the pod above still looked unbound).
		return b.retried(ctx, pod, args, bound)
	}
	if err != nil {
		return fmt.Errorf("bind pod %s to node %s: %w", key, args.Node, err)
	}
	return b.BindAssumed(ctx, pod, args.Node, assumed)
}

// BindAssumed sends the annotated Binding of pod to node for a placement the
// caller has charged with Cache.Assume (the scheduler plugin's Reserve), and
// settles the charge by the answer: kept on success, dropped when the API
// server refuses the Binding, read back when the answer is lost (the same
// rules as Bind, docs/design.md).
func (b *Binder) BindAssumed(ctx context.Context, pod *cache.PodRecord, node string, assumed cache.Assumption) error {
	args := extenderv1.ExtenderBindingArgs{PodName: pod.Name, PodNamespace: pod.Namespace, PodUID: pod.UID, Node: node}
	binding, err := b.binding(pod, args, &assumed)
	if err != nil {
		b.cfg.Cache.Forget(pod.UID) // nothing was sent
		return err
	}
	err = b.post(ctx, binding)
	switch {
	case err == nil:
		b.cfg.Cache.FinishBinding(pod.UID)
	case Rejected(err):
		// The API server refused it: nothing changed, the charge goes.
		b.cfg.Cache.Forget(pod.UID)
		return err
	default:
		if err := b.resolve(ctx, pod, args, err); err != nil {
			return err
		}
	}
	b.log.Debug("bound", zap.String("pod", pod.Namespace+"/"+pod.Name), zap.String("node", node),
		zap.Int("gpu", assumed.Placement.Home), zap.Bool("split", assumed.Placement.Split))
	b.scheduled(pod, node, &assumed)
	return nil
}

// bindNoGPU binds a pod that asks for gpu-mem: 0: nothing to place, charge
// or record, but the scheduler still hands us its bind.
func (b *Binder) bindNoGPU(ctx context.Context, pod *cache.PodRecord, args extenderv1.ExtenderBindingArgs) error {
	binding, err := b.binding(pod, args, nil)
	if err != nil {
		return err
	}
	err = b.post(ctx, binding)
	if err == nil {
		b.scheduled(pod, args.Node, nil)
	}
	if err == nil || Rejected(err) && !apierrors.IsConflict(err) {
		return err
	}
	// Lost answer, or a retry of a bind that succeeded before the informer
	// showed it (Conflict: already assigned): read the pod back.
	live, gerr := b.readBack(ctx, pod)
	if gerr == nil && live.UID == pod.UID && live.Spec.NodeName == args.Node {
		return nil
	}
	return err
}

// resolve decides an assumed pod's charge after a Binding that got no
// definite answer: it may have been committed before the answer was lost,
// or be committed still. The API server is asked; only what it shows
// decides, and an unbound pod is no answer yet: the charge stays, as it
// does when the API server cannot be asked, since the pod may be running on
// the memory.
func (b *Binder) resolve(ctx context.Context, pod *cache.PodRecord, args extenderv1.ExtenderBindingArgs, bindErr error) error {
	key := pod.Namespace + "/" + pod.Name
	live, gerr := b.readBack(ctx, pod)
	switch outcome(pod.UID, args.Node, live, gerr) {
	case bindLanded:
		b.cfg.OnAmbiguous(AmbiguousBound)
		b.log.Warn("bind answer lost, but the pod is bound: charge kept", zap.String("pod", key), zap.String("node", args.Node), zap.Error(bindErr))
		b.cfg.Cache.FinishBinding(pod.UID)
		return nil
	case bindMissing:
		b.cfg.OnAmbiguous(AmbiguousReleased)
		b.cfg.Cache.Forget(pod.UID)
		return bindErr
	case bindPending:
		b.cfg.OnAmbiguous(AmbiguousPending)
		b.cfg.Cache.BindOutcomeUnknown(pod.UID)
		until := b.cfg.Cache.LandBy(pod.UID)
		b.log.Warn("bind answer unclear and the pod not bound yet: charge kept while the Binding may still be committed",
			zap.String("pod", key), zap.String("node", args.Node), zap.Time("until", until), zap.Error(bindErr))
		return fmt.Errorf("%w (the pod is not bound yet, but the Binding may still be committed: its charge is kept until %s)", bindErr, until.Format(time.RFC3339))
	}
	b.cfg.OnAmbiguous(AmbiguousUnknown)
	b.log.Warn("bind outcome unknown: charge kept until the API server shows the pod", zap.String("pod", key), zap.String("node", args.Node),
		zap.NamedError("bindError", bindErr), zap.NamedError("getError", gerr))
	b.cfg.Cache.BindOutcomeUnknown(pod.UID)
	return fmt.Errorf("%w (and reading the pod back failed: %v; its charge is kept until the API server shows whether it is bound)", bindErr, gerr)
}

// retried answers a bind for a pod already charged on the same node. A bind
// that succeeded, or a pod listed at takeover, is the same bind: success. A
// charge from a bind whose outcome is unknown is checked with the API server
// first, so the scheduler is never told a pod is bound when it is not; it is
// dropped only when no earlier Binding can still land (Cache.ForgetUnbound).
func (b *Binder) retried(ctx context.Context, pod *cache.PodRecord, args extenderv1.ExtenderBindingArgs, bound *cache.BoundError) error {
	if !bound.Unverified {
		return nil
	}
	readAt := b.cfg.Cache.Now()
	live, gerr := b.readBack(ctx, pod)
	switch outcome(pod.UID, args.Node, live, gerr) {
	case bindLanded:
		b.cfg.Cache.FinishBinding(pod.UID)
		return nil
	case bindMissing:
		b.cfg.Cache.Forget(pod.UID)
		return fmt.Errorf("an earlier bind of pod %s to node %s did not land; retry", bound.Pod, args.Node)
	case bindPending:
		if b.cfg.Cache.ForgetUnbound(pod.UID, readAt) {
			// The scheduler's next try binds afresh.
			return fmt.Errorf("an earlier bind of pod %s to node %s did not land; retry", bound.Pod, args.Node)
		}
		return fmt.Errorf("an earlier Binding of pod %s to node %s may still be committed: its charge is kept until %s",
			bound.Pod, args.Node, b.cfg.Cache.LandBy(pod.UID).Format(time.RFC3339))
	}
	return fmt.Errorf("the outcome of an earlier bind of pod %s to node %s is still unknown (%v); its charge is kept", bound.Pod, args.Node, gerr)
}

// readBack reads the pod from the API server under a deadline of its own,
// detached from the scheduler's request: the answer decides whether a charge
// stays, so it must not be lost to the scheduler giving up.
func (b *Binder) readBack(ctx context.Context, pod *cache.PodRecord) (*corev1.Pod, error) {
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.cfg.VerifyTimeout)
	defer cancel()
	return b.cfg.Client.CoreV1().Pods(pod.Namespace).Get(gctx, pod.Name, metav1.GetOptions{})
}

// Outcomes of a Binding read back from the API server.
const (
	bindUnknown = iota // the GET failed
	bindLanded         // bound to the node, with an assignment
	bindPending        // unbound: the Binding may still be committed
	bindMissing        // gone, replaced, or bound without it: it never will be
)

// outcome reads what a GET of the pod says about our Binding of uid to node.
func outcome(uid types.UID, node string, live *corev1.Pod, err error) int {
	switch {
	case apierrors.IsNotFound(err):
		return bindMissing
	case err != nil || live == nil:
		return bindUnknown
	case live.UID != uid:
		return bindMissing
	case live.Spec.NodeName == "":
		return bindPending
	case live.Spec.NodeName != node:
		return bindMissing
	}
	// Bound to node: ours when it carries a readable assignment (the
	// Binding sets node and annotations in one update). Bound there by
	// someone else without one, it holds no GPU memory.
	if _, ok, err := gpushare.DecodePodAssignment(live.Annotations); ok && err == nil {
		return bindLanded
	}
	return bindMissing
}

// Rejected reports whether err is the API server's definite refusal of a
// request, after which nothing was changed: a 4xx status (Conflict, NotFound,
// Invalid, Forbidden, BadRequest, a UID precondition failure, which the API
// server reports as a Conflict, ...) except 408 and 429, which say the request
// was not processed in time or at all but might be if sent again. Everything
// else (timeouts, lost connections, 5xx, unknown errors) is ambiguous: the
// Binding may have been committed before the answer was lost.
func Rejected(err error) bool {
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return false
	}
	code := status.Status().Code
	return code >= 400 && code < 500 && code != http.StatusRequestTimeout && code != http.StatusTooManyRequests
}

// pod returns the informer's record of the pod, or the record of the API
// server's pod when the informer has not seen it yet or holds an older pod of
// the same name.
func (b *Binder) pod(ctx context.Context, namespace, name string, uid types.UID) (*cache.PodRecord, error) {
	if p, ok := b.cfg.Cache.Pod(namespace, name); ok && p.UID == uid {
		return p, nil
	}
	p, err := b.cfg.Client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get pod %s/%s: %w", namespace, name, err)
	}
	if p.UID != uid {
		return nil, fmt.Errorf("%w: pod %s/%s has UID %s, the request names %s", ErrUIDMismatch, namespace, name, p.UID, uid)
	}
	return cache.RecordOf(p), nil
}

// binding builds the Binding carrying the annotations. The API server merges
// a Binding's annotations into the pod in the same update that sets its node
// (pods/binding), so one request does what the old extender did with a PATCH
// and a POST, and no pod is ever seen annotated but unbound, or bound without
// its GPU. The Binding's UID is a precondition: if the name now belongs to
// another pod, the API server refuses it. A nil a binds without annotations.
func (b *Binder) binding(pod *cache.PodRecord, args extenderv1.ExtenderBindingArgs, a *cache.Assumption) (*corev1.Binding, error) {
	key := pod.Namespace + "/" + pod.Name
	var annotations map[string]string
	if a != nil {
		var err error
		if annotations, err = a.Placement.Assignment(a.Request, b.cfg.Now().UnixNano()).Encode(); err != nil {
			return nil, fmt.Errorf("encode assignment of pod %s: %w", key, err)
		}
		if err := overwriteStale(pod, *a, annotations); err != nil {
			return nil, fmt.Errorf("encode assignment of pod %s: %w", key, err)
		}
		annotations[gpushare.AnnotationBoundBy] = b.cfg.Name
	}
	return &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID, Annotations: annotations},
		Target:     corev1.ObjectReference{Kind: "Node", Name: args.Node},
	}, nil
}

// post sends the Binding under a deadline of its own (detach).
func (b *Binder) post(ctx context.Context, binding *corev1.Binding) error {
	bctx, cancel := detach(ctx, b.cfg.BindTimeout)
	defer cancel()
	if err := b.cfg.Client.CoreV1().Pods(binding.Namespace).Bind(bctx, binding, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("bind pod %s/%s to node %s: %w", binding.Namespace, binding.Name, binding.Target.Name, err)
	}
	return nil
}

// detach returns a context for a write that must not be cut in half by the
// caller giving up: it ignores ctx's cancellation and ends after timeout, or
// at ctx's own deadline when that is earlier. The app sets that deadline to
// the end of the leader's term, and a bind must not outlive the term it
// started in (another replica may then be placing pods without seeing it).
func detach(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	return context.WithDeadline(context.WithoutCancel(ctx), deadline)
}

// overwriteStale adds to annotations the keys a bind does not normally write
// but the pending pod already carries, written by hand or copied from a
// running pod. A Binding can only add or replace annotations, and a stale
// allocation would take precedence over the index just chosen, a stale record
// would tell the device plugin its containers were served already; so both are
// replaced with the truth: the placement's allocation, and an empty record. A
// split pod's index names no GPU of its own (its allocation does); a stale one
// is replaced by the pod's lowest GPU so it never names a GPU the pod is not on.
func overwriteStale(pod *cache.PodRecord, a cache.Assumption, annotations map[string]string) error {
	if _, stale := pod.Annotations[gpushare.AnnotationGPUIndex]; stale && a.Placement.Split {
		if _, set := annotations[gpushare.AnnotationGPUIndex]; !set {
			gpus := slices.Sorted(maps.Values(a.Placement.Containers))
			annotations[gpushare.AnnotationGPUIndex] = strconv.Itoa(gpus[0])
		}
	}
	if _, stale := pod.Annotations[gpushare.AnnotationAllocation]; stale {
		if _, set := annotations[gpushare.AnnotationAllocation]; !set {
			value := "{}" // no regular container asks for gpu-mem: an empty allocation names no GPU
			if alloc := gpushare.AllocationForGPU(a.Request.Containers, a.Placement.Home); alloc != nil {
				var err error
				if value, err = gpushare.EncodeAllocation(alloc); err != nil {
					return err
				}
			}
			annotations[gpushare.AnnotationAllocation] = value
		}
	}
	if _, stale := pod.Annotations[gpushare.AnnotationContainerEnv]; stale {
		empty, err := gpushare.EncodeContainerEnvs(nil)
		if err != nil {
			return err
		}
		annotations[gpushare.AnnotationContainerEnv] = empty
	}
	return nil
}
