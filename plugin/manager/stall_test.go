package manager_test

import (
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/manager"
)

// watchGate holds the pod watch events of the fake clientset while closed,
// as a stalled watch would, and lets them through in order when opened.
type watchGate struct {
	mu   sync.Mutex
	open chan struct{} // closed while the gate is open
}

func newWatchGate() *watchGate {
	g := &watchGate{open: make(chan struct{})}
	close(g.open)
	return g
}

// hold stalls every pod watch from now on.
func (g *watchGate) hold() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
		g.open = make(chan struct{})
	default:
	}
}

// release lets the held events through.
func (g *watchGate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
	default:
		close(g.open)
	}
}

func (g *watchGate) opened() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.open
}

// gatePodWatches routes the fake clientset's pod watches through g.
func gatePodWatches(client *fake.Clientset, g *watchGate) {
	client.PrependWatchReactor("pods", func(action k8stesting.Action) (bool, watch.Interface, error) {
		inner, err := client.Tracker().Watch(action.GetResource(), action.GetNamespace())
		if err != nil {
			return true, nil, err
		}
		w := &gatedPodWatch{inner: inner, out: make(chan watch.Event), stop: make(chan struct{})}
		go w.forward(g)
		return true, w, nil
	})
}

// gatedPodWatch passes inner's events on while its gate is open.
type gatedPodWatch struct {
	inner watch.Interface
	out   chan watch.Event
	stop  chan struct{}
	once  sync.Once
}

func (w *gatedPodWatch) ResultChan() <-chan watch.Event { return w.out }

func (w *gatedPodWatch) Stop() {
	w.once.Do(func() {
		close(w.stop)
		w.inner.Stop()
	})
}

func (w *gatedPodWatch) forward(g *watchGate) {
	defer close(w.out)
	for ev := range w.inner.ResultChan() {
		select {
		case <-g.opened():
		case <-w.stop:
			return
		}
		select {
		case w.out <- ev:
		case <-w.stop:
			return
		}
	}
}

// A watch that lags behind a pod that left must not let that pod take
// another pod's call: the plugin's cache holds "left" in flight on GPU 1
// while the API server has it Failed, and "next", of the same size on
// GPU 2, exists only in the API server. The call is next's: it must get
// GPU 2, found by a fresh read and a fresh list, not left's GPU 1.
func TestStaleCacheNeverAnswersForAPodThatLeft(t *testing.T) {
	ctx := t.Context()
	_, sock := startPodResources(t)
	e := run(t, "simulated:dgxh100", func(c *manager.Config) {
		c.PodResourcesSocket = sock
		c.AllocateWait = 5 * time.Second
		if _, err := c.Client.CoreV1().Pods("default").Create(ctx, gpuPod("left", 12, 1, 80), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	})
	e.kubelet.waitRegister(t)
	c := e.plugin(t)
	e.podWatches.hold()
	defer e.podWatches.release()
	// left is refused at admission (as the soak saw: its call came while the watch was stalled).
	refused, err := e.client.CoreV1().Pods("default").Get(ctx, "left", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	refused.Status.Phase, refused.Status.Reason = corev1.PodFailed, "UnexpectedAdmissionError"
	if _, err := e.client.CoreV1().Pods("default").UpdateStatus(ctx, refused, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.CoreV1().Pods("default").Create(ctx, gpuPod("next", 12, 2, 80), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	resp, err := c.Allocate(ctx, reqOn(0, 12))
	if err != nil || resp.ContainerResponses[0].Envs[gpushare.EnvGPUIndex] != "2" {
		t.Fatalf("Allocate for next = %v, %v; want GPU 2 from the API server, not the deleted pod's GPU 1", resp, err)
	}
}

// podListFaults fails lists of pods as lost answers would, once armed.
// Its reactor is installed before the plugin starts: the fake clientset's
// reactor chain is not safe to change while the plugin uses it.
type podListFaults struct {
	armed         atomic.Bool
	failing, seen atomic.Int64
}

func installPodListFaults(client *fake.Clientset) *podListFaults {
	f := &podListFaults{}
	client.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		if !f.armed.Load() {
			return false, nil, nil
		}
		f.seen.Add(1)
		if f.failing.Add(-1) >= 0 {
			return true, nil, apierrors.NewServiceUnavailable("the answer was lost")
		}
		f.armed.Store(false)
		return false, nil, nil
	})
	return f
}

// arm fails the next n lists and counts lists from now until the first that answers.
func (f *podListFaults) arm(n int64) {
	f.seen.Store(0)
	f.failing.Store(n)
	f.armed.Store(true)
}

// A call whose pod the stalled watch has not delivered must not be refused
// because the lists that would find it lost their answers (the soak saw
// such a pod fail at admission): the plugin lists again until one answers.
func TestAllocateOutlastsListsThatFail(t *testing.T) {
	ctx := t.Context()
	var faults *podListFaults
	e := run(t, "simulated:dgxh100", func(c *manager.Config) {
		c.AllocateWait = 1500 * time.Millisecond
		faults = installPodListFaults(c.Client.(*fake.Clientset))
	})
	e.kubelet.waitRegister(t)
	c := e.plugin(t)
	e.podWatches.hold()
	defer e.podWatches.release()
	faults.arm(3)
	if _, err := e.client.CoreV1().Pods("default").Create(ctx, gpuPod("late", 12, 2, 80), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	resp, err := c.Allocate(ctx, reqOn(0, 12))
	if err != nil || resp.ContainerResponses[0].Envs[gpushare.EnvGPUIndex] != "2" {
		t.Fatalf("Allocate = %v, %v; want late's GPU 2 from the first list that answered", resp, err)
	}
	if n := faults.seen.Load(); n != 4 {
		t.Errorf("the call listed the node's pods %d times; want 3 lost answers and one that answered", n)
	}
}

// When no list answers at all, the call is still refused, after retrying,
// so the kubelet's admission of the node's other pods does not hang.
func TestAllocateRefusedWhenNoListAnswers(t *testing.T) {
	ctx := t.Context()
	var faults *podListFaults
	e := run(t, "simulated:dgxh100", func(c *manager.Config) {
		c.AllocateWait = 1500 * time.Millisecond
		faults = installPodListFaults(c.Client.(*fake.Clientset))
	})
	e.kubelet.waitRegister(t)
	c := e.plugin(t)
	e.podWatches.hold()
	defer e.podWatches.release()
	faults.arm(math.MaxInt64)
	_, err := c.Allocate(ctx, reqOn(0, 12))
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Allocate with no pod and no list answering = %v; want FailedPrecondition", err)
	}
	if n := faults.seen.Load(); n <= 2 {
		t.Errorf("the call listed the node's pods %d times; want retries after the lost answers", n)
	}
}
