package binder

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	k8stesting "k8s.io/client-go/testing"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/extender/cache"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

var podsResource = schema.GroupVersionResource{Version: "v1", Resource: "pods"}

func gpuNode(name string, total, count int64) *corev1.Node {
	res := corev1.ResourceList{
		gpushare.ResourceName:  *resource.NewQuantity(total, resource.DecimalSI),
		gpushare.ResourceCount: *resource.NewQuantity(count, resource.DecimalSI),
	}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Capacity: res, Allocatable: res}}
}

func gpuPod(name string, units int64) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name:      "c",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{gpushare.ResourceName: *resource.NewQuantity(units, resource.DecimalSI)}},
		}}},
		Status: corev1.PodStatus{Phase: corev1.PodPending},
	}
}

// commit does what the API server does for a Binding: the UID must match and
// the pod be unbound; the node is set and the annotations merged.
func commit(client *fake.Clientset, b *corev1.Binding) error {
	obj, err := client.Tracker().Get(podsResource, b.Namespace, b.Name)
	if err != nil {
		return err
	}
	pod := obj.(*corev1.Pod).DeepCopy()
	if b.UID != "" && b.UID != pod.UID {
		return apierrors.NewConflict(podsResource.GroupResource(), b.Name, errors.New("Precondition failed: UID in precondition"))
	}
	if pod.Spec.NodeName != "" {
		return apierrors.NewConflict(podsResource.GroupResource(), b.Name, fmt.Errorf("pod %s is already assigned to node %q", b.Name, pod.Spec.NodeName))
	}
	pod.Spec.NodeName = b.Target.Name
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	for k, v := range b.Annotations {
		pod.Annotations[k] = v
	}
	return client.Tracker().Update(podsResource, pod, b.Namespace)
}

// bindingReaction answers a Binding: committed first when commitIt, then err.
func bindingReaction(client *fake.Clientset, commitIt bool, err error) k8stesting.ReactionFunc {
	return func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "binding" {
			return false, nil, nil
		}
		if commitIt {
			if cerr := commit(client, a.(k8stesting.CreateAction).GetObject().(*corev1.Binding)); cerr != nil {
				return true, nil, cerr
			}
		}
		return true, nil, err
	}
}

// ctxClient makes the fake clientset's pod calls honour their context as a
// real client does (a done context fails the call), and lets a test step in
// when a Binding starts.
type ctxClient struct {
	kubernetes.Interface
	onBind func(ctx context.Context)
}

func (c ctxClient) CoreV1() typedcorev1.CoreV1Interface {
	return ctxCore{CoreV1Interface: c.Interface.CoreV1(), onBind: c.onBind}
}

type ctxCore struct {
	typedcorev1.CoreV1Interface
	onBind func(ctx context.Context)
}

func (c ctxCore) Pods(namespace string) typedcorev1.PodInterface {
	return ctxPods{PodInterface: c.CoreV1Interface.Pods(namespace), onBind: c.onBind}
}

type ctxPods struct {
	typedcorev1.PodInterface
	onBind func(ctx context.Context)
}

func (p ctxPods) Bind(ctx context.Context, b *corev1.Binding, opts metav1.CreateOptions) error {
	if p.onBind != nil {
		p.onBind(ctx)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return p.PodInterface.Bind(ctx, b, opts)
}

func (p ctxPods) Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.Pod, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return p.PodInterface.Get(ctx, name, opts)
}

type env struct {
	t      *testing.T
	client *fake.Clientset
	cache  *cache.Cache
	binder *Binder
	onBind func(ctx context.Context)

	mu        sync.Mutex
	ambiguous []string
	// now is the cache's clock, which decides when a Binding can no longer
	// be committed (the write horizon); tests move it with step.
	now time.Time
}

func (e *env) clock() time.Time { e.mu.Lock(); defer e.mu.Unlock(); return e.now }

func (e *env) step(d time.Duration) { e.mu.Lock(); defer e.mu.Unlock(); e.now = e.now.Add(d) }

// newEnv runs a cache on a fake cluster with node n1 (two 16-unit GPUs) and
// the pending pods p (10 units) and zero (gpu-mem: 0), and a binder through
// ctxClient. The pod informer lists once and then sees no event: the lag of
// a busy cluster made permanent, so only the binder's own reads tell it
// what became of a Binding.
func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{t: t, client: fake.NewClientset(gpuNode("n1", 32, 2), gpuPod("p", 10), gpuPod("zero", 0)), now: time.Unix(1000, 0)}
	e.client.PrependReactor("create", "pods", bindingReaction(e.client, true, nil))
	e.client.PrependWatchReactor("pods", func(k8stesting.Action) (bool, watch.Interface, error) {
		return true, watch.NewFake(), nil
	})
	c, err := cache.New(cache.Config{Client: e.client, Logger: zaptest.NewLogger(t), AssumeTTL: time.Hour, Now: e.clock})
	if err != nil {
		t.Fatal(err)
	}
	e.cache = c
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
	defer scancel()
	if !c.WaitForSync(sctx) {
		t.Fatal("cache did not sync")
	}
	client := ctxClient{Interface: e.client, onBind: func(ctx context.Context) {
		if e.onBind != nil {
			e.onBind(ctx)
		}
	}}
	e.binder = New(Config{Client: client, Cache: c, Logger: zaptest.NewLogger(t), OnAmbiguous: func(r string) {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.ambiguous = append(e.ambiguous, r)
	}})
	return e
}

func (e *env) bind(ctx context.Context, pod string) error {
	return e.binder.Bind(ctx, extenderv1.ExtenderBindingArgs{PodName: pod, PodNamespace: "default", PodUID: types.UID("uid-" + pod), Node: "n1"})
}

// charged returns the units charged on n1's GPU 0, where p goes.
func (e *env) charged() uint64 {
	n, ok := e.cache.Node("n1")
	if !ok {
		e.t.Fatal("node n1 not in the cache")
	}
	return n.GPUs[0].Used
}

// nodeOf returns the node the API server has p bound to.
func (e *env) nodeOf(pod string) string {
	obj, err := e.client.Tracker().Get(podsResource, "default", pod)
	if err != nil {
		e.t.Fatal(err)
	}
	return obj.(*corev1.Pod).Spec.NodeName
}

func (e *env) resolutions() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.ambiguous...)
}

// failGets makes every GET of a pod fail, as when the API server is down.
func (e *env) failGets() {
	e.client.PrependReactor("get", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewServiceUnavailable("apiserver is restarting")
	})
}

func connErr(errno syscall.Errno) error {
	return &url.Error{Op: "Post", URL: "https://apiserver/api/v1/namespaces/default/pods/p/binding",
		Err: &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", errno)}}
}

// definiteErrors are the API server's refusals: nothing was written.
func definiteErrors() map[string]error {
	gr := schema.GroupResource{Resource: "pods/binding"}
	return map[string]error{
		"conflict (already assigned)": apierrors.NewConflict(gr, "p", errors.New(`pod p is already assigned to node "n2"`)),
		// What the API server answers when the Binding's UID is not the pod's.
		"UID precondition": apierrors.NewConflict(schema.GroupResource{Resource: "pods"}, "p", errors.New(
			"StorageError: invalid object, Code: 4, Key: /registry/pods/default/p, ResourceVersion: 0, "+
				"AdditionalErrorMsg: Precondition failed: UID in precondition: uid-p, UID in object meta: uid-other")),
		"not found":      apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, "p"),
		"invalid":        apierrors.NewInvalid(schema.GroupKind{Kind: "Binding"}, "p", field.ErrorList{field.Required(field.NewPath("target", "name"), "")}),
		"forbidden":      apierrors.NewForbidden(gr, "p", errors.New("denied by admission webhook")),
		"bad request":    apierrors.NewBadRequest("not a Binding"),
		"method":         apierrors.NewMethodNotSupported(gr, "create"),
		"unauthorized":   apierrors.NewUnauthorized("token expired"),
		"entity too big": apierrors.NewRequestEntityTooLargeError("limit is 3MB"),
	}
}

// ambiguousErrors leave the Binding's fate open: it may have been committed.
func ambiguousErrors() map[string]error {
	gr := schema.GroupResource{Resource: "pods/binding"}
	return map[string]error{
		"gateway timeout":    apierrors.NewTimeoutError("request did not complete within 60s", 0),
		"server timeout":     apierrors.NewServerTimeout(gr, "create", 1),
		"connection reset":   connErr(syscall.ECONNRESET),
		"connection refused": connErr(syscall.ECONNREFUSED),
		"500":                apierrors.NewInternalError(errors.New("etcdserver: leader changed")),
		"503":                apierrors.NewServiceUnavailable("apiserver is shutting down"),
		"429":                apierrors.NewTooManyRequests("too many requests", 1),
		"408":                apierrors.NewGenericServerResponse(408, "post", gr, "p", "", 0, false),
		"deadline exceeded":  fmt.Errorf("post binding: %w", context.DeadlineExceeded),
		"unexpected EOF":     io.ErrUnexpectedEOF,
	}
}

func TestRejected(t *testing.T) {
	for name, err := range definiteErrors() {
		if !Rejected(err) || !Rejected(fmt.Errorf("bind pod: %w", err)) {
			t.Errorf("%s (%v) is not a definite rejection", name, err)
		}
	}
	for name, err := range ambiguousErrors() {
		if Rejected(err) {
			t.Errorf("%s (%v) is taken for a definite rejection", name, err)
		}
	}
}

// A definite refusal releases the charge at once; nothing is read back.
func TestBindRejectedReleases(t *testing.T) {
	for name, bindErr := range definiteErrors() {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			e.client.PrependReactor("create", "pods", bindingReaction(e.client, false, bindErr))
			gets := 0
			e.client.PrependReactor("get", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
				gets++
				return false, nil, nil
			})
			err := e.bind(context.Background(), "p")
			if err == nil || !errors.Is(err, bindErr) {
				t.Fatalf("Bind = %v, want %v", err, bindErr)
			}
			if got := e.charged(); got != 0 {
				t.Fatalf("%d units still charged after a refused Binding", got)
			}
			if gets != 0 || len(e.resolutions()) != 0 {
				t.Fatalf("a refused Binding was read back (%d GETs, %v)", gets, e.resolutions())
			}
		})
	}
}

// The Binding was committed and then its answer was lost: the pod is bound
// and uses the memory, so the charge stays and the scheduler hears success.
func TestBindLostAnswerAfterCommitKeepsCharge(t *testing.T) {
	for name, bindErr := range ambiguousErrors() {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			e.client.PrependReactor("create", "pods", bindingReaction(e.client, true, bindErr))
			if err := e.bind(context.Background(), "p"); err != nil {
				t.Fatalf("Bind = %v; the pod is bound", err)
			}
			if got := e.charged(); got != 10 {
				t.Fatalf("%d units charged, want 10", got)
			}
			if e.nodeOf("p") != "n1" {
				t.Fatal("pod not bound")
			}
			if r := e.resolutions(); len(r) != 1 || r[0] != AmbiguousBound {
				t.Fatalf("resolutions %v, want [%s]", r, AmbiguousBound)
			}
		})
	}
}

// The Binding got no answer and the API server shows the pod unbound: the
// Binding may still be committed (an API server goes on with a request after
// answering 504, etcd after the client gave up), so the charge stays and the
// scheduler hears the error. A retry before the write horizon finds the
// charge kept; one after it, with the pod still unbound, drops it, and the
// next try binds.
func TestBindLostAnswerUnboundKeepsChargeUntilHorizon(t *testing.T) {
	for name, bindErr := range ambiguousErrors() {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			e.client.PrependReactor("create", "pods", bindingReaction(e.client, false, bindErr))
			if err := e.bind(context.Background(), "p"); !errors.Is(err, bindErr) {
				t.Fatalf("Bind = %v, want %v", err, bindErr)
			}
			if got := e.charged(); got != 10 {
				t.Fatalf("%d units charged, want 10 kept while the Binding may still be committed", got)
			}
			if r := e.resolutions(); len(r) != 1 || r[0] != AmbiguousPending {
				t.Fatalf("resolutions %v, want [%s]", r, AmbiguousPending)
			}
			e.step(cache.DefaultWriteHorizon - time.Second)
			if err := e.bind(context.Background(), "p"); err == nil || e.charged() != 10 {
				t.Fatalf("retry before the write horizon: %v, %d units charged; want an error and 10 kept", err, e.charged())
			}
			e.step(time.Second)
			if err := e.bind(context.Background(), "p"); err == nil || e.charged() != 0 {
				t.Fatalf("retry at the write horizon: %v, %d units charged; want an error and the charge dropped", err, e.charged())
			}
			e.client.PrependReactor("create", "pods", bindingReaction(e.client, true, nil))
			if err := e.bind(context.Background(), "p"); err != nil || e.nodeOf("p") != "n1" || e.charged() != 10 {
				t.Fatalf("bind after the horizon: %v, node %q, %d units", err, e.nodeOf("p"), e.charged())
			}
		})
	}
}

// The Binding answers 504 and is committed after the binder read the pod
// back unbound: the late write finds the memory still charged, so no second
// pod was placed on it meanwhile.
func TestBindingCommittedAfterReadBack(t *testing.T) {
	e := newEnv(t)
	var late *corev1.Binding
	e.client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "binding" {
			return false, nil, nil
		}
		late = a.(k8stesting.CreateAction).GetObject().(*corev1.Binding).DeepCopy()
		return true, nil, apierrors.NewTimeoutError("request did not complete within 60s", 0)
	})
	if err := e.bind(context.Background(), "p"); err == nil {
		t.Fatal("Bind succeeded on a 504")
	}
	if late == nil {
		t.Fatal("no Binding was sent")
	}
	// Pods of 12 and 11 units ask for the node while the write is in flight
	// (sizes apart, so no hold-back decides): with p's 10 units kept on one
	// 16-unit GPU, only the first fits (on the other GPU); with p's charge
	// dropped, both would, one on p's memory.
	q := gpuPod("q", 12)
	if _, err := e.cache.Assume(cache.RecordOf(q), "n1", allocator.BestFit); err != nil {
		t.Fatalf("q does not fit beside p's kept charge: %v", err)
	}
	if _, err := e.cache.Assume(cache.RecordOf(gpuPod("r", 11)), "n1", allocator.BestFit); err == nil {
		t.Fatal("pods of 12 and 11 units fit beside p's 10 units on two 16-unit GPUs: p's charge was dropped while its Binding was in flight")
	}
	// The write lands now.
	if err := commit(e.client, late); err != nil {
		t.Fatal(err)
	}
	if e.nodeOf("p") != "n1" {
		t.Fatal("the late Binding did not land")
	}
	// A retried bind reads it bound and confirms the charge.
	if err := e.bind(context.Background(), "p"); err != nil {
		t.Fatalf("retry after the late commit = %v", err)
	}
	if got := e.charged(); got != 10 {
		t.Fatalf("%d units charged on p's GPU, want 10", got)
	}
}

// The pod went away (or was replaced) while the Binding was unanswered.
func TestBindLostAnswerPodGoneReleases(t *testing.T) {
	for _, replace := range []bool{false, true} {
		t.Run(fmt.Sprintf("replaced=%v", replace), func(t *testing.T) {
			e := newEnv(t)
			e.client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
				if a.GetSubresource() != "binding" {
					return false, nil, nil
				}
				if err := e.client.Tracker().Delete(podsResource, "default", "p"); err != nil {
					return true, nil, err
				}
				if replace {
					other := gpuPod("p", 10)
					other.UID, other.Spec.NodeName = "uid-new", "n1"
					if err := e.client.Tracker().Add(other); err != nil {
						return true, nil, err
					}
				}
				return true, nil, connErr(syscall.ECONNRESET)
			})
			if err := e.bind(context.Background(), "p"); err == nil {
				t.Fatal("Bind succeeded for a pod that is gone")
			}
			if got := e.charged(); got != 0 {
				t.Fatalf("%d units charged for a pod that is gone", got)
			}
		})
	}
}

// Neither the Binding nor the read-back got an answer: the pod may be
// running on the memory, so the charge stays, unverified, and the scheduler
// hears an error. A retry reads the pod again before it answers.
func TestBindOutcomeUnknownKeepsCharge(t *testing.T) {
	for _, landed := range []bool{false, true} {
		t.Run(fmt.Sprintf("landed=%v", landed), func(t *testing.T) {
			e := newEnv(t)
			e.client.PrependReactor("create", "pods", bindingReaction(e.client, landed, apierrors.NewTimeoutError("etcd is slow", 0)))
			var getsDown sync.Mutex // held while GETs fail
			down := true
			e.client.PrependReactor("get", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
				getsDown.Lock()
				defer getsDown.Unlock()
				if down {
					return true, nil, apierrors.NewServiceUnavailable("apiserver is restarting")
				}
				return false, nil, nil
			})
			err := e.bind(context.Background(), "p")
			if err == nil {
				t.Fatal("Bind succeeded without knowing whether the pod is bound")
			}
			if got := e.charged(); got != 10 {
				t.Fatalf("%d units charged, want 10 kept", got)
			}
			if r := e.resolutions(); len(r) != 1 || r[0] != AmbiguousUnknown {
				t.Fatalf("resolutions %v, want [%s]", r, AmbiguousUnknown)
			}
			// The scheduler retries while the API server is still down: no
			// success it cannot vouch for, and the charge stays.
			if err := e.bind(context.Background(), "p"); err == nil {
				t.Fatal("retry succeeded while the outcome is unknown")
			}
			if got := e.charged(); got != 10 {
				t.Fatalf("%d units charged after a retry, want 10", got)
			}
			// The API server answers again.
			getsDown.Lock()
			down = false
			getsDown.Unlock()
			err = e.bind(context.Background(), "p")
			if landed {
				if err != nil {
					t.Fatalf("retry = %v; the first Binding landed", err)
				}
				if got := e.charged(); got != 10 {
					t.Fatalf("%d units charged, want 10", got)
				}
				return
			}
			// It did not land, but it might still: the charge stays until a
			// read after the write horizon.
			if err == nil {
				t.Fatal("retry succeeded for a pod that is not bound")
			}
			if got := e.charged(); got != 10 {
				t.Fatalf("%d units charged before the write horizon, want 10 kept", got)
			}
			e.step(cache.DefaultWriteHorizon)
			if err := e.bind(context.Background(), "p"); err == nil {
				t.Fatal("retry succeeded for a pod that is not bound")
			}
			if got := e.charged(); got != 0 {
				t.Fatalf("%d units charged for a pod that is not bound", got)
			}
			e.client.PrependReactor("create", "pods", bindingReaction(e.client, true, nil))
			if err := e.bind(context.Background(), "p"); err != nil || e.nodeOf("p") != "n1" || e.charged() != 10 {
				t.Fatalf("bind after the outcome was settled: %v, node %q, %d units", err, e.nodeOf("p"), e.charged())
			}
		})
	}
}

// The scheduler gives up on its request (its timeout, or it shuts down)
// while the Binding is on its way: the Binding is not cut in half.
func TestSchedulerCancelDoesNotCancelBinding(t *testing.T) {
	e := newEnv(t)
	entered, cancelled := make(chan struct{}), make(chan struct{})
	var deadline time.Time
	var hasDeadline bool
	e.onBind = func(ctx context.Context) {
		close(entered)
		<-cancelled
		deadline, hasDeadline = ctx.Deadline()
	}
	ctx, cancel := context.WithCancel(context.Background())
	result := make(chan error, 1)
	start := time.Now()
	go func() { result <- e.bind(ctx, "p") }()
	<-entered
	cancel()
	close(cancelled)
	if err := <-result; err != nil {
		t.Fatalf("Bind = %v after the scheduler cancelled; the Binding must go through", err)
	}
	if e.nodeOf("p") != "n1" || e.charged() != 10 {
		t.Fatalf("pod on %q with %d units charged", e.nodeOf("p"), e.charged())
	}
	if !hasDeadline || deadline.Before(start.Add(DefaultBindTimeout)) || deadline.After(time.Now().Add(DefaultBindTimeout)) {
		t.Fatalf("Binding deadline %v (set %v), want about %v from the start", deadline, hasDeadline, DefaultBindTimeout)
	}
}

// A deadline on the request (the leader's term) still bounds the Binding.
func TestBindKeepsRequestDeadline(t *testing.T) {
	e := newEnv(t)
	var deadline time.Time
	e.onBind = func(ctx context.Context) { deadline, _ = ctx.Deadline() }
	term := time.Now().Add(3 * time.Second)
	ctx, cancel := context.WithDeadline(context.Background(), term)
	defer cancel()
	if err := e.bind(ctx, "p"); err != nil {
		t.Fatal(err)
	}
	if !deadline.Equal(term) {
		t.Fatalf("Binding deadline %v, want the request's %v", deadline, term)
	}
}

// gpu-mem: 0 pods: the read-back after an unanswered Binding also runs on a
// deadline of its own, and a committed bind is a success.
func TestBindNoGPULostAnswer(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	e.client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "binding" {
			return false, nil, nil
		}
		if err := commit(e.client, a.(k8stesting.CreateAction).GetObject().(*corev1.Binding)); err != nil {
			return true, nil, err
		}
		cancel() // the scheduler gives up meanwhile
		return true, nil, connErr(syscall.ECONNRESET)
	})
	if err := e.bind(ctx, "zero"); err != nil {
		t.Fatalf("Bind = %v; the pod is bound", err)
	}
	if e.nodeOf("zero") != "n1" {
		t.Fatal("pod not bound")
	}
}

// A retried bind of a pod whose Binding succeeded answers success from the
// charge, without another Binding.
func TestRetryAfterSuccess(t *testing.T) {
	e := newEnv(t)
	if err := e.bind(context.Background(), "p"); err != nil {
		t.Fatal(err)
	}
	bindings := 0
	e.client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() == "binding" {
			bindings++
		}
		return false, nil, nil
	})
	if err := e.bind(context.Background(), "p"); err != nil || bindings != 0 {
		t.Fatalf("retry = %v with %d Bindings", err, bindings)
	}
}

// TestBindRefusals: a pod that names no gpu-mem in any container (in the informer's view or read
// from the API server) and a node unknown to the cache or without GPUs are refused with
// ErrRefused before any write; a gpu-mem: 0 pod, and one naming gpu-mem only in an init
// container's requests, are still bound.
func TestBindRefusals(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	var writes atomic.Int32
	e.client.PrependReactor("*", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if v := a.GetVerb(); v != "get" && v != "list" && v != "watch" {
			writes.Add(1)
		}
		return false, nil, nil
	})
	plain := gpuPod("plain", 0)
	plain.Spec.Containers[0].Resources = corev1.ResourceRequirements{}
	plain.Spec.InitContainers = []corev1.Container{{Name: "init"}}
	initZero := gpuPod("init-zero", 0)
	initZero.Spec.Containers[0].Resources = corev1.ResourceRequirements{}
	initZero.Spec.InitContainers = []corev1.Container{{Name: "init", Resources: corev1.ResourceRequirements{
		Requests: corev1.ResourceList{gpushare.ResourceName: *resource.NewQuantity(0, resource.DecimalSI)}}}}
	for _, p := range []*corev1.Pod{plain, initZero} {
		if err := e.client.Tracker().Add(p); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.client.CoreV1().Nodes().Create(ctx, gpuNode("cpu", 0, 0), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	writes.Store(0)
	waitFor(t, func() bool { _, ok := e.cache.Node("cpu"); return ok })
	args := func(pod, node string) extenderv1.ExtenderBindingArgs {
		return extenderv1.ExtenderBindingArgs{PodName: pod, PodNamespace: "default", PodUID: types.UID("uid-" + pod), Node: node}
	}
	for _, tc := range []struct{ pod, node, want string }{
		{"plain", "n1", "does not request aliyun.com/gpu-mem"},
		{"p", "ghost", "not in the extender's cache"},
		{"p", "cpu", "has no GPU"},
		{"zero", "ghost", "not in the extender's cache"},
		{"zero", "cpu", "has no GPU"},
	} {
		err := e.binder.Bind(ctx, args(tc.pod, tc.node))
		if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("bind %s to %s: %v; want ErrRefused saying %q", tc.pod, tc.node, err, tc.want)
		}
	}
	if n := writes.Load(); n != 0 {
		t.Fatalf("refused binds made %d API writes", n)
	}
	if e.charged() != 0 {
		t.Fatalf("refused binds charged %d units", e.charged())
	}
	for _, pod := range []string{"zero", "init-zero", "p"} {
		if err := e.binder.Bind(ctx, args(pod, "n1")); err != nil {
			t.Fatalf("bind %s: %v", pod, err)
		}
		if e.nodeOf(pod) != "n1" {
			t.Fatalf("pod %s not bound", pod)
		}
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
