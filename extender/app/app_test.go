package app

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

func gpuNode(name string, total, count int64) *corev1.Node {
	res := corev1.ResourceList{
		gpushare.ResourceName:  *resource.NewQuantity(total, resource.DecimalSI),
		gpushare.ResourceCount: *resource.NewQuantity(count, resource.DecimalSI),
	}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Capacity: res, Allocatable: res}}
}

// gpuPod is a one-container pod of units, bound to node on GPU 0 when node is set.
func gpuPod(name, node string, units int64) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)}}
	p.Spec.Containers = []corev1.Container{{
		Name:      "c",
		Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{gpushare.ResourceName: *resource.NewQuantity(units, resource.DecimalSI)}},
	}}
	p.Status.Phase = corev1.PodPending
	if node != "" {
		p.Spec.NodeName = node
		a, err := gpushare.PodAssignment{GPUIndex: 0, PodUnits: uint64(units), DevUnits: 16, Assigned: true, AssumeTime: 1}.Encode()
		if err != nil {
			panic(err)
		}
		p.Annotations = a
	}
	return p
}

// election is short enough for unit tests (a lost Lease shows within about
// a second) and long enough for a loaded machine not to lose it by itself.
func election(id string) *LeaderElection {
	return &LeaderElection{Namespace: "kube-system", Name: "ext", Identity: id,
		LeaseDuration: 2 * time.Second, RenewDeadline: time.Second, RetryPeriod: 100 * time.Millisecond}
}

// instance is one app.Run on a loopback listener.
type instance struct {
	t      *testing.T
	url    string
	client *http.Client
	cancel context.CancelFunc
	done   chan error
}

func start(t *testing.T, cfg Config) *instance {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Logger == nil {
		cfg.Logger = zaptest.NewLogger(t)
	}
	ctx, cancel := context.WithCancel(context.Background())
	in := &instance{t: t, url: "http://" + ln.Addr().String(), client: &http.Client{Timeout: 10 * time.Second}, cancel: cancel, done: make(chan error, 1)}
	go func() { in.done <- Run(ctx, ln, cfg) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-in.done:
		case <-time.After(20 * time.Second):
			t.Error("Run did not return within 20s of its context ending")
		}
	})
	return in
}

// wait returns Run's error, failing the test when it does not return in time.
func (in *instance) wait(timeout time.Duration) error {
	in.t.Helper()
	select {
	case err := <-in.done:
		in.done <- err // for the cleanup
		return err
	case <-time.After(timeout):
		in.t.Fatalf("Run did not return within %v", timeout)
		return nil
	}
}

func (in *instance) do(method, path string, body any) (int, string) {
	in.t.Helper()
	var r io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			in.t.Fatal(err)
		}
		r = bytes.NewReader(data)
	}
	req, err := http.NewRequest(method, in.url+path, r)
	if err != nil {
		in.t.Fatal(err)
	}
	resp, err := in.client.Do(req)
	if err != nil {
		in.t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		in.t.Fatal(err)
	}
	return resp.StatusCode, string(out)
}

func (in *instance) eventually(what string, cond func() bool) {
	in.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			in.t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}

func (in *instance) ready() bool {
	code, _ := in.do("GET", "/readyz", nil)
	return code == http.StatusOK
}

func (in *instance) metric(name string) string {
	in.t.Helper()
	_, body := in.do("GET", "/metrics", nil)
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return v
		}
	}
	return ""
}

var filterArgs = extenderv1.ExtenderArgs{Pod: gpuPod("new", "", 10), NodeNames: &[]string{"n1"}}

func TestPublicPortServesNoPprof(t *testing.T) {
	for _, le := range []*LeaderElection{nil, election("a")} {
		t.Run(fmt.Sprintf("election=%v", le != nil), func(t *testing.T) {
			dbg, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			in := start(t, Config{Client: fake.NewClientset(gpuNode("n1", 32, 2)), LeaderElection: le, DebugListener: dbg})
			in.eventually("ready", in.ready)
			for _, path := range []string{"/debug/pprof/", "/debug/pprof/cmdline", "/debug/pprof/goroutine?debug=1"} {
				if code, _ := in.do("GET", path, nil); code != http.StatusNotFound {
					t.Errorf("public port: GET %s = %d, want 404", path, code)
				}
			}
			debug := &instance{t: t, url: "http://" + dbg.Addr().String(), client: in.client}
			if code, body := debug.do("GET", "/debug/pprof/", nil); code != http.StatusOK || !strings.Contains(body, "goroutine") {
				t.Errorf("debug port: GET /debug/pprof/ = %d %.80q", code, body)
			}
			// The debug port serves profiles only.
			if code, _ := debug.do("GET", "/readyz", nil); code != http.StatusNotFound {
				t.Errorf("debug port: GET /readyz = %d, want 404", code)
			}
		})
	}
}

func TestWithoutElectionAlwaysLeader(t *testing.T) {
	in := start(t, Config{Client: fake.NewClientset(gpuNode("n1", 32, 2))})
	in.eventually("ready", in.ready)
	if v := in.metric("gpushare_extender_leader"); v != "1" {
		t.Errorf("gpushare_extender_leader = %q, want 1", v)
	}
	if code, body := in.do("POST", "/gpushare-scheduler/filter", filterArgs); code != http.StatusOK {
		t.Errorf("filter = %d %s", code, body)
	}
}

// TestStandbyThenLeader: a replica that does not hold the Lease answers the
// verbs and /readyz with 503 and everything else normally; once it takes the
// Lease over it first charges what a quorum LIST shows and its informer does
// not, then serves; when renewals fail it stops serving within the renew
// deadline and Run returns ErrLeaderElectionLost.
func TestStandbyThenLeader(t *testing.T) {
	other := "other"
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "ext"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &other, LeaseDurationSeconds: new(int32(3600)),
			RenewTime: &metav1.MicroTime{Time: time.Now()}},
	}
	// "late" was bound by the previous leader just now: only the catch-up's
	// LIST has it, the lagging informer has not seen it.
	late := gpuPod("late", "n1", 12)
	client := fake.NewClientset(gpuNode("n1", 16, 1), lease)
	var quorumLists sync.Map
	client.PrependReactor("list", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		la := a.(k8stesting.ListActionImpl)
		if !strings.Contains(la.GetListRestrictions().Fields.String(), "spec.nodeName") {
			return false, nil, nil // the informer's
		}
		quorumLists.Store(la.ListOptions.ResourceVersion, true)
		return true, &corev1.PodList{Items: []corev1.Pod{*late}}, nil
	})
	in := start(t, Config{Client: client, LeaderElection: election("me")})

	in.eventually("standby reports it is not the leader", func() bool {
		code, body := in.do("GET", "/readyz", nil)
		return code == http.StatusServiceUnavailable && strings.Contains(body, "not the leader (the leader is other)")
	})
	code, body := in.do("POST", "/gpushare-scheduler/filter", filterArgs)
	var res struct{ Error string }
	if code != http.StatusServiceUnavailable || json.Unmarshal([]byte(body), &res) != nil || !strings.Contains(res.Error, "not the leader") {
		t.Errorf("standby filter = %d %q, want 503 with a JSON error", code, body)
	}
	for _, verb := range []string{"prioritize", "bind"} {
		if code, _ := in.do("POST", "/gpushare-scheduler/"+verb, filterArgs); code != http.StatusServiceUnavailable {
			t.Errorf("standby %s = %d, want 503", verb, code)
		}
	}
	for _, path := range []string{"/healthz", "/version", "/gpushare-scheduler/inspect"} {
		if code, body := in.do("GET", path, nil); code != http.StatusOK {
			t.Errorf("standby GET %s = %d %s", path, code, body)
		}
	}
	if v := in.metric("gpushare_extender_leader"); v != "0" {
		t.Errorf("standby gpushare_extender_leader = %q, want 0", v)
	}
	// The standby's warm cache does not know "late".
	if _, body := in.do("GET", "/gpushare-scheduler/inspect/n1", nil); !strings.Contains(body, `"usedGPU":0`) || strings.Contains(body, "late") {
		t.Fatalf("standby inspect %s; the test needs the informer to miss the pod", body)
	}

	// The holder releases the Lease.
	released := lease.DeepCopy()
	released.Spec.HolderIdentity = new("")
	if _, err := client.CoordinationV1().Leases("kube-system").Update(context.Background(), released, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	in.eventually("leader ready", in.ready)
	if _, ok := quorumLists.Load(""); !ok {
		t.Error("no LIST with resourceVersion \"\" (a quorum read) before serving")
	}
	if _, body := in.do("GET", "/gpushare-scheduler/inspect/n1", nil); !strings.Contains(body, `"name":"late"`) {
		t.Errorf("leader inspect %s: the catch-up did not charge late", body)
	}
	// With late charged, the node's only GPU has 4 of 16 units free: a
	// 10-unit pod, which the informer's view alone would let in, fails.
	if code, body := in.do("POST", "/gpushare-scheduler/filter", filterArgs); code != http.StatusOK || !strings.Contains(body, "Insufficient GPU Memory") {
		t.Errorf("leader filter = %d %s, want n1 to fail for lack of memory", code, body)
	}
	if v := in.metric("gpushare_extender_leader"); v != "1" {
		t.Errorf("leader gpushare_extender_leader = %q, want 1", v)
	}
	l, err := client.CoordinationV1().Leases("kube-system").Get(context.Background(), "ext", metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != "me" {
		t.Fatalf("lease = %+v, %v; want held by me", l, err)
	}

	// Renewals start failing: serving stops within the renew deadline,
	// before client-go gives up, and Run ends with ErrLeaderElectionLost.
	client.PrependReactor("update", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewServiceUnavailable("etcd is away")
	})
	failing := time.Now()
	in.eventually("not ready after renewals fail", func() bool { return !in.ready() })
	if d := time.Since(failing); d > 2*time.Second {
		t.Errorf("served %v after renewals started failing; renew deadline 1s", d)
	}
	if err := in.wait(10 * time.Second); !errors.Is(err, ErrLeaderElectionLost) {
		t.Fatalf("Run = %v, want ErrLeaderElectionLost", err)
	}
}

// TestGracefulStopReleasesAfterDraining: on a graceful stop the leader lets
// its running bind finish before it releases the Lease, and releases it.
func TestGracefulStopReleasesAfterDraining(t *testing.T) {
	client := fake.NewClientset(gpuNode("n1", 32, 2), gpuPod("p", "", 4))
	var mu sync.Mutex
	var events []string
	record := func(e string) { mu.Lock(); events = append(events, e); mu.Unlock() }
	bindEntered, releaseSeen := make(chan struct{}), make(chan struct{})
	client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "binding" {
			return false, nil, nil
		}
		close(bindEntered)
		// A release while this bind runs is the bug; give it a second to happen.
		select {
		case <-releaseSeen:
		case <-time.After(time.Second):
		}
		record("bind done")
		return true, nil, nil
	})
	// The Lease on a clientset of its own: a fake clientset runs one reaction
	// at a time, and the bind's is blocked.
	leases := fake.NewClientset()
	leases.PrependReactor("update", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		l := a.(k8stesting.UpdateAction).GetObject().(*coordinationv1.Lease)
		if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
			record("release")
			select {
			case <-releaseSeen:
			default:
				close(releaseSeen)
			}
		}
		return false, nil, nil
	})
	le := election("me")
	le.Client = leases
	in := start(t, Config{Client: client, LeaderElection: le, ShutdownGrace: 5 * time.Second})
	in.eventually("leader ready", in.ready)

	bound := make(chan int, 1)
	go func() {
		code, _ := in.do("POST", "/gpushare-scheduler/bind", extenderv1.ExtenderBindingArgs{PodName: "p", PodNamespace: "default", PodUID: "uid-p", Node: "n1"})
		bound <- code
	}()
	select {
	case <-bindEntered:
	case <-time.After(10 * time.Second):
		t.Fatal("the bind did not reach the API within 10s")
	}
	in.cancel()
	if err := in.wait(10 * time.Second); err != nil {
		t.Fatalf("Run = %v, want nil after a graceful stop", err)
	}
	if code := <-bound; code != http.StatusOK {
		t.Errorf("the bind running at the stop answered %d, want 200", code)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(events) != 2 || events[0] != "bind done" || events[1] != "release" {
		t.Errorf("events %q, want the bind to finish before the release", events)
	}
	l, err := leases.CoordinationV1().Leases("kube-system").Get(context.Background(), "ext", metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != "" {
		t.Errorf("lease after the stop = %+v, %v; want released", l, err)
	}
}

func TestRunRefusesBadConfig(t *testing.T) {
	bad := election("me")
	bad.LeaseDuration = 1500 * time.Millisecond
	for name, cfg := range map[string]Config{
		"cert without key":   {TLSCertFile: "/nonexistent.crt"},
		"missing TLS files":  {TLSCertFile: "/nonexistent.crt", TLSKeyFile: "/nonexistent.key"},
		"client CA on HTTP":  {TLSClientCAFile: "/nonexistent.pem"},
		"names without CA":   {TLSClientNames: []string{"kube-scheduler"}},
		"fractional lease":   {LeaderElection: bad},
		"renew beyond lease": {LeaderElection: &LeaderElection{Namespace: "ns", Name: "n", Identity: "i", LeaseDuration: time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 100 * time.Millisecond}},
	} {
		t.Run(name, func(t *testing.T) {
			cfg.Client = fake.NewClientset()
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			if err := Run(context.Background(), ln, cfg); err == nil {
				t.Fatal("Run accepted it")
			} else {
				t.Log(err)
			}
			// Refused before serving, Run closed the listener.
			if _, err := ln.Accept(); err == nil {
				t.Error("listener still open")
			}
		})
	}
}

// TestLeadershipFence: serving ends RenewDeadline after the last successful
// renewal was sent, whatever the elector believes, and at once on a release.
func TestLeadershipFence(t *testing.T) {
	now := time.Unix(1000, 0)
	l := newLeadership(election("me"))
	l.now = func() time.Time { return now }
	if l.serving() {
		t.Fatal("serving before any term")
	}
	l.wrote(true, now, nil)
	if !l.start(context.Background()) || !l.serving() {
		t.Fatal("not serving after acquiring")
	}
	now = now.Add(900 * time.Millisecond)
	l.wrote(true, now, errors.New("timeout")) // a failed renewal extends nothing
	now = now.Add(99 * time.Millisecond)
	if !l.serving() {
		t.Error("stopped serving before the renew deadline")
	}
	now = now.Add(time.Millisecond)
	if l.serving() {
		t.Error("still serving at the renew deadline after the last successful renewal")
	}
	l.wrote(true, now, nil)
	if !l.serving() {
		t.Error("a successful renewal did not extend the term")
	}
	l.wrote(false, now, nil) // a release is being sent
	if l.serving() {
		t.Error("serving while releasing")
	}
	// A term that already ended cannot start serving again.
	l.wrote(true, now, nil)
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	l.stop()
	if l.start(ended) || l.serving() {
		t.Error("a late start of an ended term resumed serving")
	}
	// Nor does a term that finishes its takeover while the process stops.
	l.retire()
	if l.start(context.Background()) || l.serving() {
		t.Error("a takeover finishing after retire resumed serving")
	}
}

// A Binding whose answer is lost after it was committed: the bind succeeds
// and the series of ambiguous binds says how it was resolved.
func TestAmbiguousBindMetric(t *testing.T) {
	client := fake.NewClientset(gpuNode("n1", 32, 2), gpuPod("p", "", 4))
	gvr := corev1.SchemeGroupVersion.WithResource("pods")
	client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "binding" {
			return false, nil, nil
		}
		b := a.(k8stesting.CreateAction).GetObject().(*corev1.Binding)
		obj, err := client.Tracker().Get(gvr, b.Namespace, b.Name)
		if err != nil {
			return true, nil, err
		}
		pod := obj.(*corev1.Pod).DeepCopy()
		pod.Spec.NodeName, pod.Annotations = b.Target.Name, b.Annotations
		if err := client.Tracker().Update(gvr, pod, b.Namespace); err != nil {
			return true, nil, err
		}
		return true, nil, apierrors.NewTimeoutError("the answer was lost", 0)
	})
	in := start(t, Config{Client: client})
	in.eventually("ready", in.ready)
	if got := in.metric(`gpushare_extender_binds_ambiguous_total{resolution="bound"}`); got != "0" {
		t.Fatalf("ambiguous binds before any bind: %q", got)
	}
	code, body := in.do("POST", "/gpushare-scheduler/bind", extenderv1.ExtenderBindingArgs{PodName: "p", PodNamespace: "default", PodUID: "uid-p", Node: "n1"})
	if code != http.StatusOK {
		t.Fatalf("bind: %d %s", code, body)
	}
	if got := in.metric(`gpushare_extender_binds_ambiguous_total{resolution="bound"}`); got != "1" {
		t.Fatalf("ambiguous binds resolved as bound: %q, want 1", got)
	}
	if got := in.metric(`gpushare_extender_charge_verifications_total{result="error"}`); got != "0" {
		t.Fatalf("verification errors: %q, want 0", got)
	}
}
