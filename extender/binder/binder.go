package binder

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

// Config holds what a Binder needs.
type Config struct {
	Client kubernetes.Interface
	Cache  *cache.Cache
	Policy allocator.Policy
	Logger *zap.Logger
	// Now returns the time for ALIYUN_COM_GPU_MEM_ASSUME_TIME; nil means time.Now.
	Now func() time.Time
}

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
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	return &Binder{cfg: cfg, log: log}
}

// Bind places the pod of args on args.Node. An *allocator.Unfit error means
// the pod no longer fits there (the scheduler retries it elsewhere).
func (b *Binder) Bind(ctx context.Context, args extenderv1.ExtenderBindingArgs) error {
	key := args.PodNamespace + "/" + args.PodName
	pod, err := b.pod(ctx, args.PodNamespace, args.PodName, args.PodUID)
	if err != nil {
		return err
	}
	r, err := allocator.NewRequest(pod)
	if err != nil {
		return fmt.Errorf("bind pod %s: %w", key, err)
	}
	if pod.Spec.NodeName != "" {
		// A retry of a bind that did succeed (the scheduler's request timed
		// out after we answered): succeed again only if it is the same bind.
		if pod.Spec.NodeName == args.Node {
			if _, ok, err := gpushare.DecodePodAssignment(pod.Annotations); r.Units == 0 || (ok && err == nil) {
				return nil
			}
		}
		return fmt.Errorf("pod %s is already bound to node %s", key, pod.Spec.NodeName)
	}
	if r.Units == 0 {
		// gpu-mem: 0 asks for no GPU memory: nothing to place, charge or
		// record, but the scheduler still hands us its bind.
		err := b.write(ctx, pod, args, nil)
		if err != nil {
			// A retry of a bind that succeeded, before the informer showed it.
			live, gerr := b.cfg.Client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
			if gerr == nil && live.UID == pod.UID && live.Spec.NodeName == args.Node {
				return nil
			}
		}
		return err
	}
	assumed, err := b.cfg.Cache.Assume(pod, args.Node, b.cfg.Policy)
	var bound *cache.BoundError
	if errors.As(err, &bound) && bound.Node == args.Node {
		// A retry of a bind that did succeed, arriving before the informer
		// showed it (so the pod above still looked unbound): the same bind.
		return nil
	}
	if err != nil {
		return fmt.Errorf("bind pod %s to node %s: %w", key, args.Node, err)
	}
	if err := b.write(ctx, pod, args, &assumed); err != nil {
		b.cfg.Cache.Forget(pod.UID)
		return err
	}
	b.cfg.Cache.FinishBinding(pod.UID)
	b.log.Debug("bound", zap.String("pod", key), zap.String("node", args.Node),
		zap.Int("gpu", assumed.Placement.Home), zap.Bool("split", assumed.Placement.Split))
	return nil
}

// pod returns the pod from the informer, or from the API server when the
// informer has not seen it yet or holds an older pod of the same name.
func (b *Binder) pod(ctx context.Context, namespace, name string, uid types.UID) (*corev1.Pod, error) {
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
	return p, nil
}

// write creates the Binding carrying the annotations. The API server merges a
// Binding's annotations into the pod in the same update that sets its node
// (pods/binding), so one request does what the old extender did with a PATCH
// and a POST, and no pod is ever seen annotated but unbound, or bound without
// its GPU. The Binding's UID is a precondition: if the name now belongs to
// another pod, the API server refuses it. A nil a binds without annotations.
func (b *Binder) write(ctx context.Context, pod *corev1.Pod, args extenderv1.ExtenderBindingArgs, a *cache.Assumption) error {
	key := pod.Namespace + "/" + pod.Name
	var annotations map[string]string
	if a != nil {
		var err error
		if annotations, err = a.Placement.Assignment(a.Request, b.cfg.Now().UnixNano()).Encode(); err != nil {
			return fmt.Errorf("encode assignment of pod %s: %w", key, err)
		}
		if err := overwriteStale(pod, *a, annotations); err != nil {
			return fmt.Errorf("encode assignment of pod %s: %w", key, err)
		}
	}
	binding := &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID, Annotations: annotations},
		Target:     corev1.ObjectReference{Kind: "Node", Name: args.Node},
	}
	if err := b.cfg.Client.CoreV1().Pods(pod.Namespace).Bind(ctx, binding, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("bind pod %s to node %s: %w", key, args.Node, err)
	}
	return nil
}

// overwriteStale adds to annotations the keys a bind does not normally write
// but the pending pod already carries, written by hand or copied from a
// running pod. A Binding can only add or replace annotations, and a stale
// allocation would take precedence over the index just chosen, a stale record
// would tell the device plugin its containers were served already; so both are
// replaced with the truth: the placement's allocation, and an empty record. A
// split pod's index names no GPU of its own (its allocation does); a stale one
// is replaced by the pod's lowest GPU so it never names a GPU the pod is not on.
func overwriteStale(pod *corev1.Pod, a cache.Assumption, annotations map[string]string) error {
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
