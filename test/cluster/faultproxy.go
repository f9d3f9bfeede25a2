package cluster

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Kind is what the fault proxy does to one request.
type Kind string

// The kinds of fault, and the two counts that are not faults (Forward, UpstreamError).
const (
	// Forward passes the request and its answer through unchanged.
	Forward Kind = "forward"
	// DropAnswer forwards the request (the API server commits it), then resets the client's
	// connection instead of answering: the client cannot tell whether its request took effect.
	DropAnswer Kind = "drop-answer"
	// DelayAnswer forwards the request, then holds the answer for Fault.Delay (or until the
	// client gives up) before passing it on.
	DelayAnswer Kind = "delay-answer"
	// ErrorAnswer forwards the request, then answers Fault.Code (503 when zero) with a Status
	// body instead of the real answer.
	ErrorAnswer Kind = "error-answer"
	// Reset resets the client's connection without forwarding anything: nothing is committed.
	Reset Kind = "reset"
	// StallWatch passes a watch's response headers, then holds every byte of its stream for
	// Fault.Delay, then resumes it, or ends it when Fault.Close is set. On a request that is not
	// a watch it does nothing (the request is forwarded).
	StallWatch Kind = "stall-watch"
	// LateCommit answers Fault.Code (504 when zero) at once without forwarding, then forwards
	// the request to the API server Fault.Delay later, whatever the client does meanwhile: an API
	// server that answered "request did not complete" and went on with it, or etcd committing a
	// write its client gave up on.
	LateCommit Kind = "late-commit"
	// LateCommitted counts LateCommit requests the API server then answered with a success.
	LateCommitted Kind = "late-committed"
	// UpstreamError counts requests the API server did not answer (the proxy answered 502).
	UpstreamError Kind = "upstream-error"
)

// lateBodyLimit bounds the body LateCommit keeps for its late forward.
const lateBodyLimit = 8 << 20

// Fault is one fault and its parameters.
type Fault struct {
	Kind Kind
	// Delay is how long DelayAnswer holds the answer, StallWatch holds the stream and LateCommit
	// waits before it forwards the request.
	Delay time.Duration
	// Code is ErrorAnswer's status (zero means 503) and LateCommit's (zero means 504).
	Code int
	// Close makes StallWatch end the stream when the stall ends instead of resuming it.
	Close bool
}

// Matcher chooses requests. Matchers run under the proxy's lock: they must be quick and must not
// call the proxy.
type Matcher func(*http.Request) bool

// MatchRequest matches method ("" for any) and a path pattern in path.Match syntax, where *
// stands for one path segment: MatchRequest("GET", "/api/v1/namespaces/*/pods/*").
func MatchRequest(method, pattern string) Matcher {
	return func(r *http.Request) bool {
		if method != "" && r.Method != method {
			return false
		}
		ok, err := path.Match(pattern, r.URL.Path)
		return err == nil && ok
	}
}

// MatchBinding matches the POST of a pod's Binding; an empty namespace or name matches any.
func MatchBinding(namespace, name string) Matcher {
	if namespace == "" {
		namespace = "*"
	}
	if name == "" {
		name = "*"
	}
	return MatchRequest(http.MethodPost, "/api/v1/namespaces/"+namespace+"/pods/"+name+"/binding")
}

// MatchWatch matches watch requests (?watch=true) of resource (its plural, e.g. "pods"), cluster
// wide or in a namespace, in any API group.
func MatchWatch(resource string) Matcher {
	return func(r *http.Request) bool {
		return isWatch(r) && r.Method == http.MethodGet && path.Base(r.URL.Path) == resource
	}
}

func isWatch(r *http.Request) bool {
	w := r.URL.Query().Get("watch")
	return w == "true" || w == "1"
}

// Rule gives matching requests a fault. The proxy applies the first rule, in the order set, that
// matches and is not spent.
type Rule struct {
	Match Matcher
	Fault Fault
	// Times is how many faults the rule injects before it is spent; zero means no limit.
	Times int

	random *randomChoice
}

// randomChoice is a RandomRule's seeded schedule.
type randomChoice struct {
	rng    *rand.Rand
	p      float64
	faults []Fault
}

// RandomRule makes a rule that gives each matching request, with probability p, one of faults
// picked at random. The schedule depends only on seed and the order of the matching requests,
// so a soak that logs its seed can be replayed. The rule owns its random source: set it on one
// proxy only.
func RandomRule(seed uint64, p float64, match Matcher, faults ...Fault) Rule {
	return Rule{Match: match, random: &randomChoice{
		rng: rand.New(rand.NewPCG(seed, 0x6661756c74)), p: p, faults: faults,
	}}
}

// ruleState is a rule and how many faults it injected.
type ruleState struct {
	Rule
	used int
}

// FaultProxy is an HTTPS reverse proxy between one of our programs and the bed's API server,
// injecting faults chosen by rules the test sets and changes at run time. It authenticates to
// the API server with a client certificate of the program's own user and groups, so the program
// keeps exactly its RBAC.
//
// It serves HTTP/1.1 only: every request then has a connection of its own, so Reset and
// DropAnswer reset exactly one request's connection (with HTTP/2 a reset would cut every watch
// multiplexed on it), and the client sees what a network fault shows, a connection reset.
type FaultProxy struct {
	rt         http.RoundTripper
	rp         *httputil.ReverseProxy
	srv        *http.Server
	url        string
	kubeconfig string
	served     chan struct{}      // closed when the server's accept loop has returned
	closing    context.Context    // done once Close began
	closeAll   context.CancelFunc // ends closing: every request, hold and stream ends at once
	handlers   sync.WaitGroup

	mu      sync.Mutex
	closed  bool
	rules   []*ruleState
	stalls  map[*Stall]struct{}
	streams map[*stream]struct{}
	counts  map[Kind]int
}

// StartFaultProxy starts a fault proxy in front of the API server speaking as user and groups,
// and writes a kubeconfig for the program behind it (Kubeconfig). name must be unique within the
// cluster. The caller closes the proxy (Close) when the test ends.
func (c *Cluster) StartFaultProxy(name, user string, groups ...string) (*FaultProxy, error) {
	upstream, err := c.Kubeconfig(name+"-upstream", user, groups...)
	if err != nil {
		return nil, err
	}
	return c.startNamedFaultProxy(name, upstream)
}

// startNamedFaultProxy serves a fault proxy named name that reaches the API server through the
// kubeconfig upstream.
func (c *Cluster) startNamedFaultProxy(name, upstream string) (*FaultProxy, error) {
	serving, err := c.pki.issueServing(name + "-proxy")
	if err != nil {
		return nil, err
	}
	return startFaultProxy(upstream, serving, filepath.Join(c.dir, name+".kubeconfig"))
}

// startFaultProxy serves with the serving certificate a proxy to the server of the upstream
// kubeconfig, with its credentials, and writes a copy of that kubeconfig pointing at the proxy.
func startFaultProxy(upstreamKubeconfig string, serving certPair, kubeconfig string) (*FaultProxy, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", upstreamKubeconfig)
	if err != nil {
		return nil, err
	}
	// Certificates as data: with file names client-go would start goroutines, never stopped, to
	// watch the files for rotation.
	if err := rest.LoadTLSFiles(cfg); err != nil {
		return nil, err
	}
	target, err := url.Parse(cfg.Host)
	if err != nil {
		return nil, err
	}
	rt, err := rest.TransportFor(cfg)
	if err != nil {
		return nil, err
	}
	cert, err := tls.LoadX509KeyPair(serving.Cert, serving.Key)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := newFaultProxy(target, rt)
	p.url = "https://" + ln.Addr().String()
	if err := writeProxiedKubeconfig(upstreamKubeconfig, p.url, kubeconfig); err != nil {
		ln.Close()
		return nil, err
	}
	p.kubeconfig = kubeconfig
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	p.srv = &http.Server{
		Handler:           p,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		Protocols:         &protocols,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          log.New(io.Discard, "", 0),
	}
	go func() {
		defer close(p.served)
		_ = p.srv.ServeTLS(ln, "", "")
	}()
	return p, nil
}

func newFaultProxy(target *url.URL, rt http.RoundTripper) *FaultProxy {
	p := &FaultProxy{
		rt: rt, served: make(chan struct{}),
		stalls: map[*Stall]struct{}{}, streams: map[*stream]struct{}{}, counts: map[Kind]int{},
	}
	p.closing, p.closeAll = context.WithCancel(context.Background())
	p.rp = &httputil.ReverseProxy{
		Rewrite:   func(r *httputil.ProxyRequest) { r.SetURL(target) },
		Transport: rt,
		// Watch events must reach the client as they come, not when a buffer fills.
		FlushInterval:  -1,
		ModifyResponse: p.modifyResponse,
		ErrorHandler:   p.errorHandler,
		ErrorLog:       log.New(io.Discard, "", 0),
	}
	return p
}

// writeProxiedKubeconfig copies the kubeconfig at from, with every cluster's server set to
// server, to the file to.
func writeProxiedKubeconfig(from, server, to string) error {
	cfg, err := clientcmd.LoadFromFile(from)
	if err != nil {
		return err
	}
	for _, cl := range cfg.Clusters {
		cl.Server = server
	}
	if err := clientcmd.WriteToFile(*cfg, to); err != nil {
		return fmt.Errorf("write kubeconfig %s: %w", to, err)
	}
	return nil
}

// Kubeconfig is the path of a kubeconfig for the program behind the proxy.
func (p *FaultProxy) Kubeconfig() string { return p.kubeconfig }

// URL is the proxy's https URL.
func (p *FaultProxy) URL() string { return p.url }

// SetRules replaces the rules; no rules means every request is forwarded.
func (p *FaultProxy) SetRules(rules ...Rule) {
	states := make([]*ruleState, len(rules))
	for i, r := range rules {
		states[i] = &ruleState{Rule: r}
	}
	p.mu.Lock()
	p.rules = states
	p.mu.Unlock()
}

// Count is how many requests got kind so far (Forward: passed through unchanged).
func (p *FaultProxy) Count(kind Kind) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.counts[kind]
}

// Counts returns every count by kind.
func (p *FaultProxy) Counts() map[Kind]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[Kind]int, len(p.counts))
	for k, n := range p.counts {
		out[k] = n
	}
	return out
}

func (p *FaultProxy) count(kind Kind) {
	p.mu.Lock()
	p.counts[kind]++
	p.mu.Unlock()
}

// Close stops the proxy: it ends every held answer and stream, closes every connection and
// returns once every request's handler has returned.
func (p *FaultProxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	streams := make([]*stream, 0, len(p.streams))
	for s := range p.streams {
		streams = append(streams, s)
	}
	stalls := make([]*Stall, 0, len(p.stalls))
	for s := range p.stalls {
		stalls = append(stalls, s)
	}
	p.mu.Unlock()
	p.closeAll()
	for _, s := range stalls {
		s.timer.Stop()
	}
	if p.srv != nil {
		_ = p.srv.Close()
		<-p.served
	}
	// Closing the upstream bodies unblocks reads waiting on an idle watch at once.
	for _, s := range streams {
		s.body.Close()
	}
	p.handlers.Wait()
	utilnet.CloseIdleConnectionsFor(p.rt)
}

// enter registers a request's handler unless the proxy is closed.
func (p *FaultProxy) enter() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.handlers.Add(1)
	return true
}

type faultKey struct{}

// ServeHTTP applies the fault the rules choose for r.
func (p *FaultProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !p.enter() {
		resetConn(w)
		return
	}
	defer p.handlers.Done()
	f := p.pick(r)
	switch f.Kind {
	case Reset:
		p.count(Reset)
		resetConn(w)
		return
	case LateCommit:
		p.lateCommit(w, r, f)
		return
	}
	// Every request ends when its client leaves or the proxy closes, whatever it waits for: the
	// API server's answer, a delay or a stall.
	ctx, cancel := context.WithCancel(context.WithValue(r.Context(), faultKey{}, f))
	defer cancel()
	defer context.AfterFunc(p.closing, cancel)()
	p.rp.ServeHTTP(w, r.WithContext(ctx))
}

// lateCommit answers r with f.Code now and forwards it f.Delay later (LateCommit). The late
// forward runs as a handler of its own, so Close waits for it or cuts it short.
func (p *FaultProxy) lateCommit(w http.ResponseWriter, r *http.Request, f Fault) {
	body, err := io.ReadAll(io.LimitReader(r.Body, lateBodyLimit))
	if err != nil || !p.enter() {
		resetConn(w)
		return
	}
	p.count(LateCommit)
	late := r.Clone(context.WithValue(p.closing, faultKey{}, Fault{Kind: Forward}))
	late.Body, late.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
	go func() {
		defer p.handlers.Done()
		if p.hold(p.closing, f.Delay) != nil {
			return
		}
		answer := httptest.NewRecorder()
		p.rp.ServeHTTP(answer, late)
		if answer.Code < 300 {
			p.count(LateCommitted)
		}
	}()
	code := cmp.Or(f.Code, http.StatusGatewayTimeout)
	writeStatus(w, code, fmt.Sprintf("fault proxy: answered %d; the request reaches the API server %v later", code, f.Delay))
}

// pick returns the fault of the first matching rule that is not spent; Forward when none.
func (p *FaultProxy) pick(r *http.Request) Fault {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, rs := range p.rules {
		if (rs.Times > 0 && rs.used >= rs.Times) || !rs.Match(r) {
			continue
		}
		f := rs.Fault
		if rs.random != nil {
			f = rs.random.draw()
		}
		if f.Kind == "" || f.Kind == StallWatch && !isWatch(r) {
			f.Kind = Forward
		}
		if f.Kind != Forward {
			rs.used++
		}
		return f
	}
	return Fault{Kind: Forward}
}

func (c *randomChoice) draw() Fault {
	if len(c.faults) == 0 || c.rng.Float64() >= c.p {
		return Fault{Kind: Forward}
	}
	return c.faults[c.rng.IntN(len(c.faults))]
}

// injected carries a fault from ModifyResponse, where the answer is known to exist (the request
// was committed), to the ErrorHandler, which answers instead.
type injected struct{ Fault }

func (injected) Error() string { return "fault injected" }

// modifyResponse runs once the API server has answered, so the request has taken effect.
func (p *FaultProxy) modifyResponse(resp *http.Response) error {
	f, _ := resp.Request.Context().Value(faultKey{}).(Fault)
	switch f.Kind {
	case DropAnswer, ErrorAnswer:
		return injected{f}
	case DelayAnswer:
		p.count(DelayAnswer)
		if err := p.hold(resp.Request.Context(), f.Delay); err != nil {
			return err
		}
	case StallWatch:
	default:
		p.count(Forward)
	}
	if isWatch(resp.Request) {
		resp.Body = p.track(resp.Request, resp.Body, f)
	}
	return nil
}

// hold waits d, or less when the request ends (its client went away, the proxy closed).
func (p *FaultProxy) hold(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (p *FaultProxy) errorHandler(w http.ResponseWriter, r *http.Request, err error) {
	var inj injected
	if errors.As(err, &inj) {
		p.count(inj.Kind)
		if inj.Kind == DropAnswer {
			resetConn(w)
			return
		}
		code := inj.Code
		if code == 0 {
			code = http.StatusServiceUnavailable
		}
		writeStatus(w, code, fmt.Sprintf("fault proxy: answer replaced by %d after the request was forwarded", code))
		return
	}
	if r.Context().Err() != nil {
		// The client went away or the proxy is closing: cut the connection. Returning without
		// an answer would make net/http answer an empty 200, a success the API server never gave.
		resetConn(w)
		return
	}
	p.count(UpstreamError)
	writeStatus(w, http.StatusBadGateway, "fault proxy: "+err.Error())
}

// writeStatus answers code with a Status body, as the API server does.
func writeStatus(w http.ResponseWriter, code int, message string) {
	reason := metav1.StatusReasonInternalError
	switch code {
	case http.StatusServiceUnavailable:
		reason = metav1.StatusReasonServiceUnavailable
	case http.StatusGatewayTimeout:
		reason = metav1.StatusReasonTimeout
	}
	status := metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure, Message: message, Reason: reason, Code: int32(code),
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(status)
}

// resetConn closes the client's connection with a TCP reset (SO_LINGER 0, and no TLS
// close_notify), so the client sees "connection reset by peer", not a clean end of stream.
func resetConn(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler) // cannot hijack: abort, which closes the connection too
	}
	raw := conn
	if tc, ok := conn.(*tls.Conn); ok {
		raw = tc.NetConn()
	}
	if tcp, ok := raw.(*net.TCPConn); ok {
		_ = tcp.SetLinger(0)
	}
	_ = raw.Close()
}

// Stall holds watch streams: no byte of a stream it covers reaches the client until it ends.
type Stall struct {
	p     *FaultProxy
	match Matcher // nil: only owner
	owner *stream
	close bool
	done  chan struct{}
	once  sync.Once
	timer *time.Timer
	hit   map[*stream]bool // streams it held back or ended; under the proxy's lock
}

// StallWatches holds, from now until d has passed or Release, every watch stream that match
// accepts, open now or opened meanwhile; then it resumes them, or ends them when close is set.
// Bytes that arrive from the API server meanwhile are held, not lost.
func (p *FaultProxy) StallWatches(match Matcher, d time.Duration, close bool) *Stall {
	return p.addStall(&Stall{p: p, match: match, close: close}, d)
}

func (p *FaultProxy) addStall(s *Stall, d time.Duration) *Stall {
	s.done, s.hit = make(chan struct{}), map[*stream]bool{}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stalls[s] = struct{}{}
	// Under the lock: the timer's Release (which takes it) cannot run before the stall is listed.
	s.timer = time.AfterFunc(d, s.Release)
	return s
}

// Release ends the stall now (it is a no-op after the end).
func (s *Stall) Release() {
	s.once.Do(func() {
		p := s.p
		p.mu.Lock()
		s.timer.Stop()
		delete(p.stalls, s)
		var ends []*stream
		if s.close {
			for st := range p.streams {
				if s.covers(st) {
					s.hitLocked(st)
					ends = append(ends, st)
				}
			}
		}
		p.mu.Unlock()
		close(s.done)
		for _, st := range ends {
			st.body.Close() // its Read returns an error and the proxy cuts the client's stream
		}
	})
}

// Held is how many streams the stall held bytes of, or ended.
func (s *Stall) Held() int {
	s.p.mu.Lock()
	defer s.p.mu.Unlock()
	return len(s.hit)
}

// hitLocked records that the stall held or ended st; each pair counts once as StallWatch.
func (s *Stall) hitLocked(st *stream) {
	if !s.hit[st] {
		s.hit[st] = true
		s.p.counts[StallWatch]++
	}
}

// Done is closed when the stall has ended.
func (s *Stall) Done() <-chan struct{} { return s.done }

func (s *Stall) covers(st *stream) bool {
	return s.owner == st || s.owner == nil && s.match != nil && s.match(st.req)
}

// stream is a watch response's body as the proxy copies it to the client.
type stream struct {
	p      *FaultProxy
	req    *http.Request
	body   io.ReadCloser
	closed atomic.Bool
}

// track registers a watch response's body so stalls can hold it and Close can end it; a
// StallWatch fault starts a stall of this stream alone.
func (p *FaultProxy) track(req *http.Request, body io.ReadCloser, f Fault) io.ReadCloser {
	s := &stream{p: p, req: req, body: body}
	p.mu.Lock()
	closed := p.closed
	if !closed {
		p.streams[s] = struct{}{}
	}
	p.mu.Unlock()
	if closed {
		body.Close()
	}
	if f.Kind == StallWatch {
		p.addStall(&Stall{p: p, owner: s, close: f.Close}, f.Delay)
	}
	return s
}

// Read passes the upstream's bytes on, holding them while a stall covers the stream.
func (s *stream) Read(b []byte) (int, error) {
	n, err := s.body.Read(b)
	for {
		st := s.p.stallOf(s)
		if st == nil {
			return n, err
		}
		select {
		case <-st.done:
			if st.close {
				return 0, errors.New("fault proxy: watch stream ended after a stall")
			}
		case <-s.req.Context().Done(): // the client went away, or the proxy closed
			return 0, s.req.Context().Err()
		}
	}
}

// stallOf returns a running stall covering s, which holds what s just read; nil when none.
func (p *FaultProxy) stallOf(s *stream) *Stall {
	p.mu.Lock()
	defer p.mu.Unlock()
	for st := range p.stalls {
		if st.covers(s) {
			st.hitLocked(s)
			return st
		}
	}
	return nil
}

// Close unregisters the stream and closes the upstream body.
func (s *stream) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	s.p.mu.Lock()
	delete(s.p.streams, s)
	s.p.mu.Unlock()
	return s.body.Close()
}

// String describes the proxy's counts, for test logs.
func (p *FaultProxy) String() string {
	counts := p.Counts()
	parts := make([]string, 0, len(counts))
	for _, k := range []Kind{Forward, DropAnswer, DelayAnswer, ErrorAnswer, Reset, StallWatch, LateCommit, LateCommitted, UpstreamError} {
		if n := counts[k]; n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", k, n))
		}
	}
	return "fault proxy " + p.url + ": " + strings.Join(parts, ", ")
}
