package cache

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpushare/gpushare/extender/allocator"
)

// fakeAPI answers the cache's verification GETs from a map, and counts them.
type fakeAPI struct {
	batch int // the cache's VerifyBatch; zero for its default

	mu    sync.Mutex
	pods  map[string]*corev1.Pod
	err   error            // when set, every GET fails with it
	errs  map[string]error // GETs of these pod names fail
	calls []string
}

func newFakeAPI() *fakeAPI { return &fakeAPI{pods: map[string]*corev1.Pod{}, errs: map[string]error{}} }

func (a *fakeAPI) Get(_ context.Context, namespace, name string) (*corev1.Pod, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.calls = append(a.calls, namespace+"/"+name)
	if a.err != nil {
		return nil, a.err
	}
	if err := a.errs[name]; err != nil {
		return nil, err
	}
	p, ok := a.pods[namespace+"/"+name]
	if !ok {
		return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, name)
	}
	return p.DeepCopy(), nil
}

func (a *fakeAPI) set(p *corev1.Pod) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pods[p.Namespace+"/"+p.Name] = p
}

func (a *fakeAPI) fail(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.err = err
}

// gets returns the number of GETs so far.
func (a *fakeAPI) gets() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.calls)
}

// assumeBound charges pod on node as the binder does for a successful bind
// the informer never shows (the fixture's informer has no such pod).
func (f *fixture) assumeBound(pod *corev1.Pod, node string) {
	f.t.Helper()
	if _, err := f.cache.Assume(RecordOf(pod), node, allocator.BestFit); err != nil {
		f.t.Fatal(err)
	}
	f.cache.FinishBinding(pod.UID)
}

func (f *fixture) verify() { f.cache.verifyDue(context.Background()) }

func TestVerdict(t *testing.T) {
	bound := Pod("p", "n1", 0, false, 4)
	with := func(change func(p *corev1.Pod)) *corev1.Pod { p := bound.DeepCopy(); change(p); return p }
	now := metav1.Now()
	for _, c := range []struct {
		what   string
		pod    *corev1.Pod
		err    error
		result string
	}{
		{"bound there", bound, nil, VerifyBound},
		{"terminating there (its containers may still run)", with(func(p *corev1.Pod) { p.DeletionTimestamp = &now }), nil, VerifyBound},
		{"running there", with(func(p *corev1.Pod) { p.Status.Phase = corev1.PodRunning }), nil, VerifyBound},
		{"deleted", nil, apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, "p"), VerifyReleased},
		{"replaced by another UID", with(func(p *corev1.Pod) { p.UID = "other" }), nil, VerifyReleased},
		{"succeeded", with(func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }), nil, VerifyReleased},
		{"failed", with(func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed }), nil, VerifyReleased},
		{"unbound", with(func(p *corev1.Pod) { p.Spec.NodeName = "" }), nil, VerifyReleased},
		{"bound elsewhere", with(func(p *corev1.Pod) { p.Spec.NodeName = "n2" }), nil, VerifyReleased},
		{"GET timed out", nil, context.DeadlineExceeded, VerifyError},
		{"API server down", nil, apierrors.NewServiceUnavailable("down"), VerifyError},
		{"forbidden", nil, apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "p", errors.New("rbac")), VerifyError},
		{"no pod and no error", nil, nil, VerifyError},
	} {
		if got, _ := verdict(bound.UID, "n1", c.pod, c.err); got != c.result {
			t.Errorf("%s: verdict %q, want %q", c.what, got, c.result)
		}
	}
}

// The informer never shows a pod whose bind succeeded (it lags, or has
// stalled): the pod stays charged however long that lasts, while the API
// server says it is bound, and is asked about less and less often.
func TestBoundPodStaysChargedWithoutInformer(t *testing.T) {
	api := newFakeAPI()
	f := startWith(t, api, Node("n1", 32, 2, nil))
	pod := Pod("p", "", -1, false, 10)
	f.assumeBound(pod, "n1")
	api.set(Pod("p", "n1", 0, false, 10))

	f.clock.Step(testTTL - time.Second)
	f.verify()
	if n := api.gets(); n != 0 {
		t.Fatalf("%d GETs before the TTL", n)
	}
	var times []time.Time
	for range 200 {
		f.clock.Step(testTTL / 2)
		before := api.gets()
		f.verify()
		if api.gets() > before {
			times = append(times, f.clock.Now())
		}
		if got := f.used("n1"); got[0] != 10 {
			t.Fatalf("bound pod released after %d GETs: %v", api.gets(), got)
		}
	}
	// Each verification that keeps the charge schedules the next one.
	for i := 1; i < len(times); i++ {
		if gap, want := times[i].Sub(times[i-1]), verifyInterval(testTTL, i); gap != want {
			t.Fatalf("gap %d between verifications %v, want %v (times %v)", i, gap, want, times)
		}
	}
	if len(times) < 3 {
		t.Fatalf("only %d verifications in %v", len(times), 100*testTTL)
	}
	// A retried bind is answered from the charge: bound, and verified.
	var bound *BoundError
	if _, err := f.cache.Assume(RecordOf(pod), "n1", allocator.BestFit); !errors.As(err, &bound) || bound.Node != "n1" || bound.Unverified {
		t.Fatalf("retry err = %v, want a verified BoundError on n1", err)
	}
}

// A charge the informer has not confirmed goes when, and only when, the API
// server shows the pod does not hold it.
func TestVerifyReleases(t *testing.T) {
	now := metav1.Now()
	for _, c := range []struct {
		what string
		live *corev1.Pod // nil: deleted
	}{
		{"deleted", nil},
		{"replaced by another UID", func() *corev1.Pod { p := Pod("p", "n1", 0, false, 10); p.UID = "new"; return p }()},
		{"succeeded", func() *corev1.Pod { p := Pod("p", "n1", 0, false, 10); p.Status.Phase = corev1.PodSucceeded; return p }()},
		{"failed while terminating", func() *corev1.Pod {
			p := Pod("p", "n1", 0, false, 10)
			p.Status.Phase, p.DeletionTimestamp = corev1.PodFailed, &now
			return p
		}()},
		{"never bound", Pod("p", "", -1, false, 10)},
		{"bound elsewhere", Pod("p", "n2", 0, false, 10)},
	} {
		t.Run(c.what, func(t *testing.T) {
			api := newFakeAPI()
			f := startWith(t, api, Node("n1", 32, 2, nil))
			if c.live != nil {
				api.set(c.live)
			}
			f.assumeBound(Pod("p", "", -1, false, 10), "n1")
			f.clock.Step(testTTL - time.Second)
			f.verify()
			f.waitUsed("n1", 10, 0)
			f.clock.Step(time.Second)
			f.verify()
			f.waitUsed("n1", 0, 0)
			if n := api.gets(); n != 1 {
				t.Fatalf("%d GETs, want 1", n)
			}
		})
	}
}

// A GET that fails says nothing about the pod: the charge stays, and is
// verified again later, until an answer releases it.
func TestVerifyErrorKeepsCharge(t *testing.T) {
	api := newFakeAPI()
	f := startWith(t, api, Node("n1", 32, 2, nil))
	api.fail(apierrors.NewServiceUnavailable("etcd leader election"))
	f.assumeBound(Pod("p", "", -1, false, 10), "n1")
	f.clock.Step(testTTL)
	f.verify()
	f.waitUsed("n1", 10, 0)
	if n := api.gets(); n != 1 {
		t.Fatalf("%d GETs, want 1", n)
	}
	// Not again before the next interval.
	f.clock.Step(testTTL - time.Second)
	f.verify()
	if n := api.gets(); n != 1 {
		t.Fatalf("%d GETs before the next interval, want 1", n)
	}
	f.clock.Step(time.Second)
	api.fail(context.DeadlineExceeded)
	f.verify()
	f.waitUsed("n1", 10, 0)
	// The API server answers again: the pod is gone.
	api.fail(nil)
	f.clock.Step(2 * testTTL)
	f.verify()
	f.waitUsed("n1", 0, 0)
	if n := api.gets(); n != 3 {
		t.Fatalf("%d GETs, want 3", n)
	}
}

// An assumed pod whose bind is still running is the binder's to settle:
// time never touches it.
func TestBindInProgressNeverVerified(t *testing.T) {
	api := newFakeAPI()
	f := startWith(t, api, Node("n1", 32, 2, nil))
	if _, err := f.cache.Assume(RecordOf(Pod("p", "", -1, false, 10)), "n1", allocator.BestFit); err != nil {
		t.Fatal(err)
	}
	f.clock.Step(1000 * testTTL)
	f.verify()
	f.waitUsed("n1", 10, 0)
	if n := api.gets(); n != 0 {
		t.Fatalf("%d GETs for a bind in progress", n)
	}
}

// A bind whose outcome is unknown keeps its charge, says so to a retried
// bind, and is settled by verification like any other.
func TestBindOutcomeUnknown(t *testing.T) {
	api := newFakeAPI()
	f := startWith(t, api, Node("n1", 32, 2, nil))
	pod := Pod("p", "", -1, false, 10)
	if _, err := f.cache.Assume(RecordOf(pod), "n1", allocator.BestFit); err != nil {
		t.Fatal(err)
	}
	f.cache.BindOutcomeUnknown(pod.UID)
	var bound *BoundError
	if _, err := f.cache.Assume(RecordOf(pod), "n1", allocator.BestFit); !errors.As(err, &bound) || !bound.Unverified || bound.Node != "n1" {
		t.Fatalf("retry err = %v, want an unverified BoundError on n1", err)
	}
	api.set(Pod("p", "n1", 0, false, 10))
	f.clock.Step(testTTL)
	f.verify()
	f.waitUsed("n1", 10, 0)
	if _, err := f.cache.Assume(RecordOf(pod), "n1", allocator.BestFit); !errors.As(err, &bound) || bound.Unverified {
		t.Fatalf("retry after verification err = %v, want a verified BoundError", err)
	}
}

// A Binding without a definite answer may still be committed after a read
// shows its pod unbound (the API server goes on after answering 504, etcd
// after its client gave up): such a read keeps the charge until one started
// after the write horizon, by the verifier or by the binder alike.
func TestUnboundBeforeWriteHorizonKeepsCharge(t *testing.T) {
	api := newFakeAPI()
	f := startWith(t, api, Node("n1", 32, 2, nil))
	pod := Pod("p", "", -1, false, 10)
	if _, err := f.cache.Assume(RecordOf(pod), "n1", allocator.BestFit); err != nil {
		t.Fatal(err)
	}
	f.cache.BindOutcomeUnknown(pod.UID)
	landBy := f.cache.LandBy(pod.UID)
	if want := f.clock.Now().Add(DefaultWriteHorizon); !landBy.Equal(want) {
		t.Fatalf("LandBy = %v, want %v", landBy, want)
	}
	early := landBy.Add(-time.Second)
	if f.cache.ForgetUnbound(pod.UID, early) {
		t.Fatal("ForgetUnbound dropped the charge on a read started before the write horizon")
	}
	f.waitUsed("n1", 10, 0)
	f.clock.Step(testTTL)
	due := f.cache.due()
	if len(due) != 1 {
		t.Fatalf("due = %+v", due)
	}
	var results []string
	f.cache.onVerify = func(r string) { results = append(results, r) }
	f.cache.settle(due[0], Pod("p", "", -1, false, 10), nil, early)
	f.waitUsed("n1", 10, 0)
	if len(results) != 1 || results[0] != VerifyPending {
		t.Fatalf("verification results %v, want [%s]", results, VerifyPending)
	}
	if due := f.cache.due(); len(due) != 1 || !due[0].at.Equal(landBy) {
		t.Fatalf("after a pending verification due = %+v, want the charge due again at %v", due, landBy)
	}
	// A read started at the horizon settles it.
	f.cache.settle(f.cache.due()[0], Pod("p", "", -1, false, 10), nil, landBy)
	f.waitUsed("n1", 0, 0)

	// ForgetUnbound at the horizon drops a charge too.
	if _, err := f.cache.Assume(RecordOf(pod), "n1", allocator.BestFit); err != nil {
		t.Fatal(err)
	}
	f.cache.BindOutcomeUnknown(pod.UID)
	if !f.cache.ForgetUnbound(pod.UID, f.cache.LandBy(pod.UID)) {
		t.Fatal("ForgetUnbound kept a charge on a read started at the write horizon")
	}
	f.waitUsed("n1", 0, 0)
}

// Listed pods (a takeover's catch-up) are verified like assumed ones.
func TestVerifyListed(t *testing.T) {
	api := newFakeAPI()
	f := startWith(t, api, Node("n1", 64, 4, nil))
	running, gone, unsure := Pod("running", "n1", 0, true, 4), Pod("gone", "n1", 1, true, 8), Pod("unsure", "n1", 2, true, 2)
	if n := f.cache.CatchUp([]corev1.Pod{*running, *gone, *unsure}); n != 3 {
		t.Fatalf("CatchUp added %d, want 3", n)
	}
	api.set(running)
	api.mu.Lock()
	api.errs["unsure"] = errors.New("connection reset by peer")
	api.mu.Unlock()
	f.clock.Step(testTTL)
	f.verify()
	f.waitUsed("n1", 4, 0, 2, 0)
	f.clock.Step(100 * testTTL)
	f.verify()
	f.waitUsed("n1", 4, 0, 2, 0)
	if !f.listed("running") || !f.listed("unsure") {
		t.Fatal("verification confirmed a listed pod the informer has not shown")
	}
}

// Each round asks about a bounded number of pods, the longest overdue first.
func TestVerifyBatch(t *testing.T) {
	api := newFakeAPI()
	api.batch = 4
	f := startWith(t, api, Node("n1", 640, 8, nil))
	var uids []types.UID
	for i := range 10 {
		p := Pod(fmt.Sprintf("p%d", i), "", -1, false, 1)
		f.assumeBound(p, "n1")
		api.set(Pod(p.Name, "n1", 0, false, 1))
		uids = append(uids, p.UID)
		f.clock.Step(time.Second)
	}
	f.clock.Step(testTTL)
	f.verify()
	if got := api.gets(); got != 4 {
		t.Fatalf("%d GETs in one round, want 4", got)
	}
	if want := []string{"default/p0", "default/p1", "default/p2", "default/p3"}; fmt.Sprint(api.calls) != fmt.Sprint(want) {
		t.Fatalf("GETs %v, want the oldest first %v", api.calls, want)
	}
	f.verify()
	f.verify()
	f.verify()
	if got := api.gets(); got != 10 {
		t.Fatalf("%d GETs after four rounds, want 10 (each pod once)", got)
	}
}

// A verification racing the informer or the binder changes nothing they
// decided meanwhile.
func TestSettleIgnoresChangedCharge(t *testing.T) {
	api := newFakeAPI()
	f := startWith(t, api, Node("n1", 32, 2, nil))
	pod := Pod("p", "", -1, false, 10)
	f.assumeBound(pod, "n1")
	f.clock.Step(testTTL)
	due := f.cache.due()
	if len(due) != 1 {
		t.Fatalf("due = %+v", due)
	}
	// The informer confirms the pod before the GET's answer (deleted) arrives.
	f.cache.upsertPod(Pod("p", "n1", 0, false, 10), false)
	f.cache.settle(due[0], nil, apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, "p"), f.clock.Now())
	f.waitUsed("n1", 10, 0)
}

func TestVerifyInterval(t *testing.T) {
	for _, c := range []struct {
		ttl    time.Duration
		checks int
		want   time.Duration
	}{
		{30 * time.Second, 1, 30 * time.Second},
		{30 * time.Second, 2, time.Minute},
		{30 * time.Second, 4, 4 * time.Minute},
		{30 * time.Second, 5, 5 * time.Minute},
		{30 * time.Second, 1000, 5 * time.Minute},
		{time.Hour, 3, time.Hour}, // a TTL above the cap is its own cap
	} {
		if got := verifyInterval(c.ttl, c.checks); got != c.want {
			t.Errorf("verifyInterval(%v, %d) = %v, want %v", c.ttl, c.checks, got, c.want)
		}
	}
}

func TestNewRefusesBadVerification(t *testing.T) {
	for _, cfg := range []Config{
		{Client: fake.NewClientset(), AssumeTTL: -time.Second},
		{Client: fake.NewClientset(), VerifyBatch: -1},
		{Client: fake.NewClientset(), VerifyTimeout: -time.Second},
		{}, // no client to read pods with
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) accepted", cfg)
		}
	}
}
