//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/gpushare/gpushare/test/cluster"
	"github.com/gpushare/gpushare/test/localcluster/manifests"
)

// haTimings are the leader-election flags of one HA test.
type haTimings struct {
	lease, renew, retry time.Duration
}

func (h haTimings) args() []string {
	return []string{"-leader-elect", "-leader-elect-resource-namespace=kube-system",
		"-leader-elect-lease-duration=" + h.lease.String(), "-leader-elect-renew-deadline=" + h.renew.String(),
		"-leader-elect-retry-period=" + h.retry.String()}
}

// TestExtenderHAKill: two replicas of the real extender binary with leader election behind a
// proxy that, as a Service does, routes to whichever one is ready; the leader is SIGKILLed in the
// middle of a burst of GPU pods. The standby takes over once the Lease expires, exactly one replica
// is ready from then on (the killed one, restarted, comes back as a standby), every pod ends bound
// or pending with a reason, and no GPU is over-committed.
//
// The HA tests run alone, before the tests marked t.Parallel: their probes count a replica that
// is late to serve after the handover, which another test's cluster on the same 2 cores caused
// once (TestExtenderHAGracefulStop: extender-b holding the Lease but not yet serving).
func TestExtenderHAKill(t *testing.T) {
	// A renew deadline under 3s lets a starved machine (the bed, a burst, other builds on 2 cores)
	// delay a renewal past it: the leader then rightly stops serving for a moment, and the
	// "exactly one ready" check fails for the machine's sake, not the extender's.
	h := haTimings{lease: 4 * time.Second, renew: 3 * time.Second, retry: 500 * time.Millisecond}
	takeover := runHA(t, h, 300, func(p *cluster.Program) { p.Kill() })
	t.Logf("takeover after SIGKILL: %v (lease %v, retry %v)", takeover.Round(time.Millisecond), h.lease, h.retry)
	// The standby last saw the Lease renewed at most 2.2 retry periods (client-go's jitter) before
	// the kill, and may take it only a lease duration after that: sooner would mean two leaders.
	if earliest := h.lease - 11*h.retry/5; takeover < earliest {
		t.Errorf("the standby took over %v after the kill, before the Lease could have expired (%v)", takeover, earliest)
	}
	if latest := h.lease + 3*time.Second; takeover > latest {
		t.Errorf("the standby took over %v after the kill; want within %v (lease duration + 3s)", takeover, latest)
	}
}

// TestExtenderHAGracefulStop: as TestExtenderHAKill, but the leader gets SIGTERM: it stops
// serving, lets its running requests finish and releases the Lease, so the standby takes over
// within a retry period or two instead of waiting out the (long) lease duration.
func TestExtenderHAGracefulStop(t *testing.T) {
	h := haTimings{lease: 10 * time.Second, renew: 7 * time.Second, retry: 500 * time.Millisecond}
	takeover := runHA(t, h, 150, func(p *cluster.Program) { p.Stop(20 * time.Second) })
	t.Logf("takeover after SIGTERM: %v (lease %v, retry %v)", takeover.Round(time.Millisecond), h.lease, h.retry)
	if takeover > h.lease/2 {
		t.Errorf("the standby took over %v after SIGTERM; want well under the lease duration %v (the Lease released)", takeover, h.lease)
	}
}

// replica is one extender process.
type replica struct {
	name string
	url  string
	prog *cluster.Program
}

// probeClient's timeout is generous: a probe that times out counts as not ready, and on a loaded
// machine a slow answer is not what the "exactly one ready" check is about.
var probeClient = &http.Client{Timeout: 5 * time.Second}

// readyz returns the replica's /readyz status and body; 0 when it does not answer.
func (r *replica) readyz() (int, string) {
	resp, err := probeClient.Get(r.url + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func (r *replica) ready() bool {
	code, _ := r.readyz()
	return code == http.StatusOK
}

// endpoints stands in for the extender Service: every 50 ms it probes each replica's /readyz and
// routes to the ready one, as kube-proxy routes to a Service's ready endpoints. While checking is
// on it also records every probe round in which not exactly one replica was ready.
type endpoints struct {
	replicas []*replica
	proxies  map[*replica]http.Handler
	current  atomic.Pointer[replica]
	checking atomic.Bool

	mu         sync.Mutex
	rounds     int
	violations []string
}

func newEndpoints(replicas ...*replica) *endpoints {
	e := &endpoints{replicas: replicas, proxies: map[*replica]http.Handler{}}
	for _, r := range replicas {
		u, err := url.Parse(r.url)
		if err != nil {
			panic(err)
		}
		p := httputil.NewSingleHostReverseProxy(u)
		p.ErrorHandler = func(w http.ResponseWriter, _ *http.Request, err error) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadGateway)
			_ = json.NewEncoder(w).Encode(map[string]string{"Error": r.name + ": " + err.Error()})
		}
		e.proxies[r] = p
	}
	return e
}

func (e *endpoints) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r := e.current.Load()
	if r == nil {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, `{"Error":"no ready extender endpoint"}`)
		return
	}
	e.proxies[r].ServeHTTP(w, req)
}

func (e *endpoints) run(ctx context.Context) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		var answers []string
		var pick *replica
		ready := 0
		for _, r := range e.replicas {
			code, body := r.readyz()
			answers = append(answers, fmt.Sprintf("%s: %d %s", r.name, code, strings.TrimSpace(body)))
			if code == http.StatusOK {
				ready++
				pick = r
			}
		}
		if ready != 1 {
			pick = nil
		}
		e.current.Store(pick)
		if e.checking.Load() {
			e.mu.Lock()
			e.rounds++
			if ready != 1 {
				e.violations = append(e.violations, time.Now().Format("15:04:05.000")+" "+strings.Join(answers, "; "))
			}
			e.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// applyShipped applies every object of the shipped manifests (kustomization ".") that keep accepts
// (all when keep is nil) and returns how many it applied.
func applyShipped(t *testing.T, c *cluster.Cluster, keep func(*unstructured.Unstructured) bool) int {
	t.Helper()
	dir, err := manifests.Dir()
	if err != nil {
		t.Fatal(err)
	}
	objs, err := manifests.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	applier, err := manifests.NewApplier(c.RESTConfig(), "gpushare-e2e")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, o := range objs {
		if keep != nil && !keep(o) {
			continue
		}
		if _, err := applier.Apply(t.Context(), o); err != nil {
			t.Fatal(err)
		}
		n++
	}
	return n
}

// applyExtenderRBAC applies the shipped ServiceAccount, roles and bindings of the extender.
func applyExtenderRBAC(t *testing.T, c *cluster.Cluster) {
	t.Helper()
	rbac := map[string]bool{"ServiceAccount": true, "ClusterRole": true, "ClusterRoleBinding": true, "Role": true, "RoleBinding": true}
	if n := applyShipped(t, c, func(o *unstructured.Unstructured) bool {
		return rbac[o.GetKind()] && o.GetName() == "gpushare-scheduler-extender"
	}); n != 5 {
		t.Fatalf("applied %d RBAC objects of the extender, want 5", n)
	}
}

// runHA runs the scenario and returns how long after stop began the standby became ready.
func runHA(t *testing.T, h haTimings, pods int, stop func(*cluster.Program)) time.Duration {
	ctx := t.Context()
	own, err := cluster.OwnBinaries(t.TempDir(), false)
	if err != nil {
		t.Fatal(err)
	}
	c, client, specs, sizes := startBurstBed(t)
	applyExtenderRBAC(t, c)
	kubeconfig, err := c.Kubeconfig("sa-extender-ha", saExtender)
	if err != nil {
		t.Fatal(err)
	}

	startReplica := func(name string) *replica {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		args := append([]string{"-kubeconfig=" + kubeconfig, "-listen=" + addr}, h.args()...)
		p, err := c.StartProgram(name, filepath.Join(own, "gpushare-scheduler-extender"), args, "POD_NAME="+name)
		if err != nil {
			t.Fatal(err)
		}
		return &replica{name: name, url: "http://" + addr, prog: p}
	}
	standby := func(r *replica, leader string) {
		t.Helper()
		pollUntil(t, waitLong, r.name+" up as a standby", func() bool {
			code, body := r.readyz()
			return code == http.StatusServiceUnavailable && strings.Contains(body, "not the leader (the leader is "+leader+"_")
		})
	}
	a := startReplica("extender-a")
	pollUntil(t, waitLong, "extender-a leading", a.ready)
	b := startReplica("extender-b")
	standby(b, a.name)

	ep := newEndpoints(a, b)
	probeCtx, stopProbe := context.WithCancel(ctx)
	var probing sync.WaitGroup
	probing.Go(func() { ep.run(probeCtx) })
	defer func() { stopProbe(); probing.Wait() }()
	proxy := httptest.NewServer(ep)
	defer proxy.Close()
	pollUntil(t, 10*time.Second, "the proxy routing to extender-a", func() bool { return ep.current.Load() == a })
	ep.checking.Store(true)

	if err := c.StartScheduler(ctx, cluster.SchedulerConfig{
		ClientQPS: 500, ClientBurst: 1000, Extenders: []cluster.Extender{ourExtender(proxy.URL)},
	}); err != nil {
		t.Fatal(err)
	}
	fakeAssigner(ctx, t, client)

	start := time.Now()
	createBurstPods(ctx, t, client, pods)
	list := func() []corev1.Pod { return defaultPods(ctx, t, client) }
	bound := boundCount
	pollUntil(t, 3*time.Minute, "a third of the pods bound", func() bool { return bound(list()) >= pods/3 })

	// The handover: no replica or two may be ready only until the standby has taken over.
	ep.checking.Store(false)
	n := bound(list())
	stopped := time.Now()
	stopDone := make(chan struct{})
	go func() { stop(a.prog); close(stopDone) }()
	pollUntil(t, h.lease+30*time.Second, "extender-b leading", b.ready)
	takeover := time.Since(stopped)
	<-stopDone
	ep.checking.Store(true)
	t.Logf("extender-a stopped with %d of %d pods bound; extender-b ready %v later", n, pods, takeover.Round(time.Millisecond))
	for _, line := range strings.Split(b.prog.LogTail(500), "\n") {
		if strings.Contains(line, `"msg":"leading"`) {
			t.Logf("extender-b: %s", line)
		}
	}

	// The stopped replica comes back as a standby and stays one.
	if err := a.prog.Start(); err != nil {
		t.Fatal(err)
	}
	standby(a, b.name)

	items := settleBurst(t, list)
	n = bound(items)
	t.Logf("%d of %d pods bound in %v", n, pods, time.Since(start).Round(time.Millisecond))
	want := charges(t, items, sizes) // fails on any over-committed GPU
	for _, p := range items {
		if p.Spec.NodeName == "" && mustIndex(t, p.Name)%50 != 49 {
			t.Logf("pending %s: %s", p.Name, unschedulable(&p))
		}
	}
	if tooBig := pods / 50; n < pods-tooBig-pods/20 {
		t.Errorf("only %d of %d schedulable pods bound", n, pods-tooBig)
	}
	// Both views, the leader's and the warm standby's, converge on the annotations.
	for _, r := range []*replica{b, a} {
		var diff string
		pollUntil(t, time.Minute, r.name+"'s inspect agrees with the annotations", func() bool {
			want = charges(t, list(), sizes)
			diff = inspectDiff(r.url, want, sizes, len(specs))
			return diff == ""
		})
		if t.Failed() {
			t.Logf("%s: last inspect difference: %s", r.name, diff)
		}
	}

	ep.mu.Lock()
	defer ep.mu.Unlock()
	t.Logf("%d probe rounds outside the handover checked", ep.rounds)
	if ep.rounds == 0 {
		t.Error("no probe round was checked")
	}
	if len(ep.violations) > 0 {
		t.Errorf("%d of %d probe rounds outside the handover had not exactly one ready replica: %q", len(ep.violations), ep.rounds, ep.violations[:min(len(ep.violations), 10)])
	}
	if !b.prog.Running() {
		t.Errorf("extender-b exited after taking over; its log:\n%s", b.prog.LogTail(30))
	}
	if cur := ep.current.Load(); cur != b {
		t.Errorf("the proxy routes to %v at the end, want extender-b", cur)
	}
	return takeover
}
