package cluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// proxyUser is the identity of the program behind the proxy in these tests.
const proxyUser = "system:serviceaccount:kube-system:prog"

// fakeAPI stands in for kube-apiserver: it requires a client certificate of the bed's CA, records
// who asked and which Bindings it committed, and streams pod watches with the events the test
// feeds it.
type fakeAPI struct {
	srv    *httptest.Server
	opened chan chan<- string // each watch, once streaming, hands over its feed of pod names

	mu    sync.Mutex
	binds []string // "namespace/name" of each committed Binding
	users []string // "CN groups" of each request
}

func startFakeAPI(t *testing.T, p *pki) *fakeAPI {
	t.Helper()
	f := &fakeAPI{opened: make(chan chan<- string, 16)}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/v1/namespaces/{ns}/pods/{name}/binding", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.binds = append(f.binds, r.PathValue("ns")+"/"+r.PathValue("name"))
		f.mu.Unlock()
		writeJSON(w, http.StatusCreated, metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusSuccess, Code: 201})
	})
	mux.HandleFunc("GET /api/v1/namespaces/{ns}/pods/{name}", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, podObject(r.PathValue("name")))
	})
	mux.HandleFunc("GET /api/v1/pods", f.watch)
	f.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cert := r.TLS.PeerCertificates[0]
		f.mu.Lock()
		f.users = append(f.users, cert.Subject.CommonName+" "+strings.Join(cert.Subject.Organization, ","))
		f.mu.Unlock()
		mux.ServeHTTP(w, r)
	}))
	serving, err := p.issueServing("fake-apiserver")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.LoadX509KeyPair(serving.Cert, serving.Key)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(p.caCert)
	f.srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool}
	f.srv.StartTLS()
	t.Cleanup(f.srv.Close)
	return f
}

// watch streams an ADDED event for every name fed to its feed until the client goes away.
func (f *fakeAPI) watch(w http.ResponseWriter, r *http.Request) {
	if r.URL.Query().Get("watch") != "true" {
		writeJSON(w, http.StatusOK, corev1.PodList{TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"}})
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	http.NewResponseController(w).Flush()
	feed := make(chan string)
	f.opened <- feed
	for {
		select {
		case <-r.Context().Done():
			return
		case name := <-feed:
			raw, _ := json.Marshal(podObject(name))
			_ = json.NewEncoder(w).Encode(metav1.WatchEvent{Type: string(watch.Added), Object: k8sruntime.RawExtension{Raw: raw}})
			http.NewResponseController(w).Flush()
		}
	}
}

func (f *fakeAPI) committed() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.binds)
}

func podObject(name string) *corev1.Pod {
	return &corev1.Pod{TypeMeta: metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"}, ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// proxyBed is a fake API server, a fault proxy in front of it speaking as proxyUser, and a
// client-go client configured from the proxy's kubeconfig, as a program behind it would be.
type proxyBed struct {
	api    *fakeAPI
	proxy  *FaultProxy
	client kubernetes.Interface
}

func startProxyBed(t *testing.T) *proxyBed {
	t.Helper()
	dir := t.TempDir()
	p, err := newPKI(filepath.Join(dir, "pki"))
	if err != nil {
		t.Fatal(err)
	}
	api := startFakeAPI(t, p)
	pair, err := p.issueClient("prog-upstream", proxyUser, "group-a", "group-b")
	if err != nil {
		t.Fatal(err)
	}
	upstream := filepath.Join(dir, "upstream.kubeconfig")
	if err := clientcmd.WriteToFile(clientcmdapi.Config{
		Clusters:       map[string]*clientcmdapi.Cluster{"bed": {Server: api.srv.URL, CertificateAuthority: p.CAFile()}},
		AuthInfos:      map[string]*clientcmdapi.AuthInfo{"prog": {ClientCertificate: pair.Cert, ClientKey: pair.Key}},
		Contexts:       map[string]*clientcmdapi.Context{"bed": {Cluster: "bed", AuthInfo: "prog"}},
		CurrentContext: "bed",
	}, upstream); err != nil {
		t.Fatal(err)
	}
	serving, err := p.issueServing("prog-proxy")
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := startFaultProxy(upstream, serving, filepath.Join(dir, "prog.kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	cfg, err := clientcmd.BuildConfigFromFlags("", proxy.Kubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host != proxy.URL() {
		t.Fatalf("the program's kubeconfig names %s, want the proxy %s", cfg.Host, proxy.URL())
	}
	// Certificates as data, so client-go starts no goroutines that outlive the test (see
	// startFaultProxy); TestFaultProxyCloseEndsEveryHold counts goroutines.
	if err := rest.LoadTLSFiles(cfg); err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 1000, 1000
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &proxyBed{api: api, proxy: proxy, client: client}
}

func (b *proxyBed) bind(ctx context.Context, name string) error {
	return b.client.CoreV1().Pods("default").Bind(ctx, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Target:     corev1.ObjectReference{Kind: "Node", Name: "n"},
	}, metav1.CreateOptions{})
}

func wantCount(t *testing.T, p *FaultProxy, kind Kind, want int) {
	t.Helper()
	if got := p.Count(kind); got != want {
		t.Errorf("%s counted %d times, want %d (%v)", kind, got, want, p)
	}
}

func TestFaultProxyForwardsAsTheProgramsUser(t *testing.T) {
	b := startProxyBed(t)
	pod, err := b.client.CoreV1().Pods("default").Get(t.Context(), "a", metav1.GetOptions{})
	if err != nil || pod.Name != "a" {
		t.Fatalf("get through the proxy: %v, %v", pod, err)
	}
	if err := b.bind(t.Context(), "a"); err != nil {
		t.Fatal(err)
	}
	if got := b.api.committed(); !slices.Equal(got, []string{"default/a"}) {
		t.Errorf("committed %v", got)
	}
	b.api.mu.Lock()
	users := slices.Clone(b.api.users)
	b.api.mu.Unlock()
	for _, u := range users {
		if u != proxyUser+" group-a,group-b" {
			t.Errorf("the API server saw %q, want the program's user and groups", u)
		}
	}
	wantCount(t, b.proxy, Forward, 2)
}

func TestFaultProxyDropAnswerCommitsThenResets(t *testing.T) {
	b := startProxyBed(t)
	b.proxy.SetRules(Rule{Match: MatchBinding("default", "a"), Fault: Fault{Kind: DropAnswer}, Times: 1})
	err := b.bind(t.Context(), "a")
	if !utilnet.IsConnectionReset(err) {
		t.Errorf("bind with its answer dropped: %v, want a connection reset", err)
	}
	if got := b.api.committed(); !slices.Equal(got, []string{"default/a"}) {
		t.Errorf("committed %v, want the dropped bind committed", got)
	}
	// The rule is spent, and never matched another pod.
	for _, name := range []string{"b", "a"} {
		if err := b.bind(t.Context(), name); err != nil {
			t.Errorf("bind %s: %v", name, err)
		}
	}
	wantCount(t, b.proxy, DropAnswer, 1)
	wantCount(t, b.proxy, Forward, 2)
}

func TestFaultProxyErrorAnswerCommitsThenFails(t *testing.T) {
	b := startProxyBed(t)
	b.proxy.SetRules(
		Rule{Match: MatchBinding("", "a"), Fault: Fault{Kind: ErrorAnswer}},
		Rule{Match: MatchBinding("", "b"), Fault: Fault{Kind: ErrorAnswer, Code: http.StatusInternalServerError}},
	)
	if err := b.bind(t.Context(), "a"); !apierrors.IsServiceUnavailable(err) {
		t.Errorf("bind a: %v, want a 503 Status", err)
	}
	if err := b.bind(t.Context(), "b"); !apierrors.IsInternalError(err) {
		t.Errorf("bind b: %v, want a 500 Status", err)
	}
	if got := b.api.committed(); !slices.Equal(got, []string{"default/a", "default/b"}) {
		t.Errorf("committed %v, want both", got)
	}
	wantCount(t, b.proxy, ErrorAnswer, 2)
}

func TestFaultProxyDelayAnswer(t *testing.T) {
	b := startProxyBed(t)
	b.proxy.SetRules(Rule{Match: MatchBinding("", "a"), Fault: Fault{Kind: DelayAnswer, Delay: time.Hour}, Times: 1})
	// The client gives up while the committed answer is held.
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- b.bind(ctx, "a") }()
	pollT(t, "the bind committed and its answer held", func() bool {
		return len(b.api.committed()) == 1 && b.proxy.Count(DelayAnswer) == 1
	})
	select {
	case err := <-done:
		t.Fatalf("bind answered while held: %v", err)
	default:
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("bind: %v, want the client's cancellation", err)
	}

	const d = 200 * time.Millisecond
	b.proxy.SetRules(Rule{Match: MatchBinding("", "a"), Fault: Fault{Kind: DelayAnswer, Delay: d}})
	start := time.Now()
	if err := b.bind(t.Context(), "a"); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < d {
		t.Errorf("a delayed answer came after %v, want at least %v", took, d)
	}
	wantCount(t, b.proxy, DelayAnswer, 2)
}

func TestFaultProxyResetCommitsNothing(t *testing.T) {
	b := startProxyBed(t)
	b.proxy.SetRules(Rule{Match: MatchBinding("", ""), Fault: Fault{Kind: Reset}})
	if err := b.bind(t.Context(), "a"); !utilnet.IsConnectionReset(err) {
		t.Errorf("bind: %v, want a connection reset", err)
	}
	if got := b.api.committed(); len(got) != 0 {
		t.Errorf("committed %v, want nothing", got)
	}
	wantCount(t, b.proxy, Reset, 1)
}

func TestFaultProxyLateCommit(t *testing.T) {
	b := startProxyBed(t)
	const d = 300 * time.Millisecond
	b.proxy.SetRules(Rule{Match: MatchBinding("", "a"), Fault: Fault{Kind: LateCommit, Delay: d}, Times: 1})
	start := time.Now()
	err := b.bind(t.Context(), "a")
	if !apierrors.IsTimeout(err) {
		t.Errorf("bind: %v, want a 504 Timeout Status", err)
	}
	if got := b.api.committed(); len(got) != 0 {
		t.Fatalf("committed %v when the 504 was answered, want nothing yet", got)
	}
	pollT(t, "the late commit", func() bool { return b.proxy.Count(LateCommitted) == 1 })
	if took := time.Since(start); took < d {
		t.Errorf("committed %v after the request, want at least %v", took, d)
	}
	if got := b.api.committed(); !slices.Equal(got, []string{"default/a"}) {
		t.Errorf("committed %v, want a's Binding once", got)
	}
	wantCount(t, b.proxy, LateCommit, 1)

	// Close cuts a late commit still waiting: nothing reaches the API server after it.
	b.proxy.SetRules(Rule{Match: MatchBinding("", "b"), Fault: Fault{Kind: LateCommit, Delay: time.Hour}})
	if err := b.bind(t.Context(), "b"); !apierrors.IsTimeout(err) {
		t.Errorf("bind b: %v, want a 504 Timeout Status", err)
	}
	b.proxy.Close()
	if got := b.api.committed(); !slices.Equal(got, []string{"default/a"}) {
		t.Errorf("committed %v after Close, want b's late commit cut", got)
	}
}

// watchPods opens a pod watch through the proxy and waits until the fake API streams it; it
// returns the watch and the API server's feed of events for it.
func (b *proxyBed) watchPods(t *testing.T) (watch.Interface, chan<- string) {
	t.Helper()
	w, err := b.client.CoreV1().Pods("").Watch(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	select {
	case feed := <-b.api.opened:
		return w, feed
	case <-time.After(10 * time.Second):
		t.Fatal("the watch did not reach the API server")
		return nil, nil
	}
}

// send makes the API server send an ADDED event of pod name on feed's watch; it returns once the
// API server has taken it.
func send(t *testing.T, feed chan<- string, name string) {
	t.Helper()
	select {
	case feed <- name:
	case <-time.After(10 * time.Second):
		t.Fatalf("the API server's watch did not take event %s", name)
	}
}

// next returns the name of the next pod the watch delivers; "" when the watch ended.
func next(t *testing.T, w watch.Interface) string {
	t.Helper()
	select {
	case ev, ok := <-w.ResultChan():
		if !ok {
			return ""
		}
		if pod, isPod := ev.Object.(*corev1.Pod); ev.Type == watch.Added && isPod {
			return pod.Name
		}
		return fmt.Sprintf("%s event %v", ev.Type, ev.Object)
	case <-time.After(10 * time.Second):
		t.Fatal("no watch event within 10s")
		return ""
	}
}

// nothingYet fails when the watch has delivered something.
func nothingYet(t *testing.T, w watch.Interface) {
	t.Helper()
	select {
	case ev, ok := <-w.ResultChan():
		t.Fatalf("the client got %v (open %v) through a stall", ev, ok)
	default:
	}
}

func TestFaultProxyStallWatchesHoldsThenResumesOrEnds(t *testing.T) {
	b := startProxyBed(t)
	w, feed := b.watchPods(t)
	send(t, feed, "p1")
	if got := next(t, w); got != "p1" {
		t.Fatalf("got %q, want p1 streamed at once", got)
	}

	stall := b.proxy.StallWatches(MatchWatch("pods"), time.Hour, false)
	send(t, feed, "p2")
	pollT(t, "the proxy holding p2", func() bool { return stall.Held() == 1 })
	nothingYet(t, w)
	stall.Release()
	if got := next(t, w); got != "p2" {
		t.Fatalf("got %q after the stall, want p2 (held, not lost)", got)
	}

	// A stall of a short time ends by itself.
	const d = 200 * time.Millisecond
	start := time.Now()
	short := b.proxy.StallWatches(MatchWatch("pods"), d, false)
	send(t, feed, "p3")
	if got := next(t, w); got != "p3" || time.Since(start) < d {
		t.Fatalf("got %q %v after the stall began, want p3 after at least %v", got, time.Since(start), d)
	}
	<-short.Done()

	// A closing stall ends the stream without delivering what it held.
	ending := b.proxy.StallWatches(MatchWatch("pods"), time.Hour, true)
	send(t, feed, "p4")
	pollT(t, "the proxy holding p4", func() bool { return ending.Held() == 1 })
	ending.Release()
	for got := next(t, w); got != ""; got = next(t, w) {
		if got == "p4" {
			t.Fatal("the closing stall delivered p4")
		}
	}
	wantCount(t, b.proxy, StallWatch, 3)
}

func TestFaultProxyStallWatchRule(t *testing.T) {
	b := startProxyBed(t)
	// A quiet stream is ended at the end of its stall, too.
	b.proxy.SetRules(Rule{Match: MatchWatch("pods"), Fault: Fault{Kind: StallWatch, Delay: 100 * time.Millisecond, Close: true}, Times: 1})
	quiet, _ := b.watchPods(t)
	if got := next(t, quiet); got != "" {
		t.Fatalf("got %q, want the stalled stream ended", got)
	}
	wantCount(t, b.proxy, StallWatch, 1)

	// The rule is spent: the client's next watch streams as usual. A stall of one request does
	// not hold another stream.
	b.proxy.SetRules(Rule{Match: MatchWatch("pods"), Fault: Fault{Kind: StallWatch, Delay: time.Hour}, Times: 1})
	stalled, stalledFeed := b.watchPods(t)
	w, feed := b.watchPods(t)
	send(t, stalledFeed, "p1")
	send(t, feed, "p2")
	if got := next(t, w); got != "p2" {
		t.Fatalf("the free stream got %q, want p2", got)
	}
	pollT(t, "p1 held on the stalled stream", func() bool { return b.proxy.Count(StallWatch) == 2 })
	nothingYet(t, stalled)
}

func TestFaultProxyRandomRuleIsReproducible(t *testing.T) {
	faults := []Fault{{Kind: ErrorAnswer}, {Kind: ErrorAnswer, Code: 500}, {Kind: DropAnswer}}
	run := func(seed uint64) []string {
		b := startProxyBed(t)
		b.proxy.SetRules(RandomRule(seed, 0.3, MatchBinding("", ""), faults...))
		var outcomes []string
		for i := range 100 {
			err := b.bind(t.Context(), fmt.Sprintf("p%d", i))
			switch {
			case err == nil:
				outcomes = append(outcomes, "ok")
			case apierrors.IsServiceUnavailable(err):
				outcomes = append(outcomes, "503")
			case apierrors.IsInternalError(err):
				outcomes = append(outcomes, "500")
			case utilnet.IsConnectionReset(err):
				outcomes = append(outcomes, "reset")
			default:
				t.Fatalf("bind %d: %v", i, err)
			}
		}
		if n := len(b.api.committed()); n != 100 {
			t.Errorf("%d of 100 binds committed, want all (every fault here answers after the commit)", n)
		}
		return outcomes
	}
	first, again, other := run(7), run(7), run(8)
	if !slices.Equal(first, again) {
		t.Errorf("seed 7 gave two schedules:\n%v\n%v", first, again)
	}
	if slices.Equal(first, other) {
		t.Error("seeds 7 and 8 gave the same schedule")
	}
	faulted := 100 - strings.Count(strings.Join(first, " "), "ok")
	if faulted < 15 || faulted > 45 {
		t.Errorf("%d of 100 requests faulted with p = 0.3", faulted)
	}
}

// Close ends held answers and stalled streams at once and leaves no goroutine behind.
func TestFaultProxyCloseEndsEveryHold(t *testing.T) {
	before := runtime.NumGoroutine()
	b := startProxyBed(t)
	b.proxy.SetRules(Rule{Match: MatchBinding("", ""), Fault: Fault{Kind: DelayAnswer, Delay: time.Hour}})
	w, feed := b.watchPods(t)
	stall := b.proxy.StallWatches(MatchWatch("pods"), time.Hour, false)
	send(t, feed, "p1")
	bound := make(chan error, 1)
	go func() { bound <- b.bind(t.Context(), "a") }()
	pollT(t, "a held answer and a held stream", func() bool {
		return stall.Held() == 1 && b.proxy.Count(DelayAnswer) == 1
	})

	closed := make(chan struct{})
	go func() { b.proxy.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return within 10s while holding an answer and a stream")
	}
	if err := <-bound; err == nil {
		t.Error("the held bind answered success after Close")
	}
	for next(t, w) != "" {
	}
	b.api.srv.Close()
	err := Poll(t.Context(), 10*time.Second, "the goroutines of the proxy and its clients gone", func(context.Context) (bool, error) {
		return runtime.NumGoroutine() <= before, nil
	})
	if err != nil {
		buf := make([]byte, 1<<20)
		t.Fatalf("%v: %d goroutines, %d before:\n%s", err, runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
	}
}

// pollT polls cond (every 50 ms, Poll's pace) for up to 10 s.
func pollT(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if err := Poll(t.Context(), 10*time.Second, what, func(context.Context) (bool, error) { return cond(), nil }); err != nil {
		t.Fatal(err)
	}
}
