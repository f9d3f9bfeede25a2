package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/extender/binder"
	"github.com/gpushare/gpushare/extender/cache"
	"github.com/gpushare/gpushare/extender/preempt"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

// Cache is what the server reads from the cluster view.
type Cache interface {
	HasSynced() bool
	Nodes(names []string) []*allocator.Node
	All() []*allocator.Node
	Inspect(node string) (cache.Inspect, bool)
	Holders(node string) (*allocator.Node, []preempt.Holder, bool)
	// Pod is the informer's record of a pod, for the pending-pods gauge.
	Pod(namespace, name string) (*cache.PodRecord, bool)
}

// Binder carries out the bind verb.
type Binder interface {
	Bind(ctx context.Context, args extenderv1.ExtenderBindingArgs) error
}

// Config holds what a Server needs.
type Config struct {
	Cache    Cache
	Binder   Binder
	Policy   allocator.Policy
	Logger   *zap.Logger
	Registry *prometheus.Registry // where the extender's series go; /metrics serves it
	Version  string
	// MaxBodyBytes bounds filter and prioritize bodies (full Node objects when
	// nodeCacheCapable is false); zero means DefaultMaxBodyBytes. Bind bodies
	// are bounded to 64 KiB. Buffers grow with what arrives, never
	// allocated from Content-Length beyond 64 KiB.
	MaxBodyBytes int64
	// GPUMetrics is how finely GPU memory is reported beside the cluster
	// totals; the zero value is per GPU.
	GPUMetrics GPUMetrics
}

// Server answers the scheduler's extender calls.
type Server struct {
	cfg     Config
	log     *zap.Logger
	metrics *metrics
	pending *pendingPods
	mux     *http.ServeMux
}

const maxBindBody = 64 << 10

// DefaultMaxBodyBytes is the filter and prioritize body limit when none is
// set: 8 MiB, room for a nodeCacheCapable: true body (a pod and the
// candidates' names: about 0.3 MiB for 5,000 nodes) many times over.
// Full Node lists (nodeCacheCapable: false) of a large cluster need more.
const DefaultMaxBodyBytes = 8 << 20

// New builds the server and registers its metrics.
func New(cfg Config) (*Server, error) {
	if cfg.Cache == nil || cfg.Binder == nil || cfg.Registry == nil {
		return nil, errors.New("server: Cache, Binder and Registry are required")
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	s := &Server{cfg: cfg, log: cfg.Logger, mux: http.NewServeMux()}
	if s.log == nil {
		s.log = zap.NewNop()
	}
	m, err := newMetrics(cfg.Registry, cfg.Cache.All, cfg.GPUMetrics)
	if err != nil {
		return nil, fmt.Errorf("register metrics: %w", err)
	}
	s.metrics = m
	s.pending = newPendingPods(cfg.Cache.Pod, time.Now)
	if err := cfg.Registry.Register(s.pending); err != nil {
		return nil, fmt.Errorf("register metrics: %w", err)
	}
	p := gpushare.ExtenderURLPrefix
	s.mux.HandleFunc("POST "+p+"/filter", s.timed("filter", s.filter))
	s.mux.HandleFunc("POST "+p+"/prioritize", s.timed("prioritize", s.prioritize))
	s.mux.HandleFunc("POST "+p+"/bind", s.timed("bind", s.bind))
	s.mux.HandleFunc("POST "+p+"/preempt", s.timed("preempt", s.preempt))
	s.mux.HandleFunc("GET "+p+"/inspect", s.timed("inspect", s.inspect))
	s.mux.HandleFunc("GET "+p+"/inspect/{node}", s.timed("inspect", s.inspect))
	s.mux.HandleFunc("GET /version", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"version": cfg.Version})
	})
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("ok\n"))
	})
	s.mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !cfg.Cache.HasSynced() {
			http.Error(w, "informers not synced", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ok\n"))
	})
	s.mux.Handle("GET /metrics", promhttp.HandlerFor(cfg.Registry, promhttp.HandlerOpts{}))
	return s, nil
}

// Handler returns the server's routes.
func (s *Server) Handler() http.Handler { return s.mux }

// errorBody is the seed's error shape, also the Error field of the extender results.
type errorBody struct {
	Error string `json:"Error"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	// The status is sent; an encode error here means the client went away.
	_ = json.NewEncoder(w).Encode(v)
}

func (s *Server) timed(verb string, h http.HandlerFunc) http.HandlerFunc {
	hist := s.metrics.latency.WithLabelValues(verb)
	return func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		h(w, r)
		hist.Observe(time.Since(start).Seconds())
	}
}

// decode reads a bounded JSON body into v, answering the 4xx itself on failure.
func decode(w http.ResponseWriter, r *http.Request, limit int64, v any) bool {
	body, ok := readJSON(w, r, limit)
	if !ok {
		return false
	}
	if err := json.Unmarshal(body, v); err != nil {
		writeJSON(w, http.StatusBadRequest, errorBody{Error: "malformed request body: " + err.Error()})
		return false
	}
	return true
}

// readJSON reads a bounded body and refuses one holding a quantity no decoder
// should see, answering the 4xx itself on failure.
func readJSON(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, bool) {
	tooLarge := func() {
		writeJSON(w, http.StatusRequestEntityTooLarge, errorBody{Error: fmt.Sprintf("request body larger than %d bytes", limit)})
	}
	if r.ContentLength > limit {
		// Announced too large: refused before reading (or buffering) any of it.
		tooLarge()
		return nil, false
	}
	body, err := readBody(http.MaxBytesReader(w, r.Body, limit), r.ContentLength, limit)
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			tooLarge()
			return nil, false
		}
		writeJSON(w, http.StatusBadRequest, errorBody{Error: "reading request body: " + err.Error()})
		return nil, false
	}
	if q, bad := findHugeExponent(body); bad {
		writeJSON(w, http.StatusBadRequest, errorBody{Error: fmt.Sprintf("malformed request body: quantity %.40q has an exponent no Kubernetes quantity needs", q)})
		return nil, false
	}
	return body, true
}

// quantityWithHugeExponent is a string that resource.ParseQuantity reads as a
// number with a decimal exponent of four digits or more.
var quantityWithHugeExponent = regexp.MustCompile(`^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)[eE][+-]?0*[1-9][0-9]{3,}$`)

// findHugeExponent finds a string in body that is a quantity with an exponent of
// four digits or more. Decoding one makes apimachinery's ParseQuantity build a
// number of that many digits ("5e-999999999" never finishes), so a 100-byte
// request could pin a CPU. Real quantities stay far below (1e18 is exa). A
// byte scan keeps the common case cheap; only a hit walks the JSON tokens.
func findHugeExponent(body []byte) (string, bool) {
	if !hasLongExponent(body) {
		return "", false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber() // a quantity may also be written as a bare JSON number
	for {
		tok, err := dec.Token()
		if err != nil {
			return "", false // malformed JSON: the real decode says why
		}
		var s string
		switch t := tok.(type) {
		case string:
			s = t
		case json.Number:
			s = string(t)
		}
		if quantityWithHugeExponent.MatchString(s) {
			return s, true
		}
	}
}

// hasLongExponent reports whether body has a digit or '.', an 'e' or 'E', an
// optional sign and four digits, which every huge exponent contains.
func hasLongExponent(body []byte) bool {
	for i := 1; i < len(body); i++ {
		if c := body[i]; c != 'e' && c != 'E' {
			continue
		}
		if p := body[i-1]; (p < '0' || p > '9') && p != '.' {
			continue
		}
		j := i + 1
		if j < len(body) && (body[j] == '+' || body[j] == '-') {
			j++
		}
		n := 0
		for ; j < len(body) && body[j] >= '0' && body[j] <= '9'; j++ {
			n++
		}
		if n >= 4 {
			return true
		}
	}
	return false
}

// ready answers 503 until the cache has synced: before that a bind could be
// assumed against a half-built view and over-commit a GPU.
func (s *Server) ready(w http.ResponseWriter) bool {
	if s.cfg.Cache.HasSynced() {
		return true
	}
	writeJSON(w, http.StatusServiceUnavailable, errorBody{Error: "extender cache not synced yet"})
	return false
}

// candidates reads the node names of a filter or prioritize call.
func candidates(w http.ResponseWriter, args *extenderv1.ExtenderArgs) ([]string, bool) {
	if args.Pod == nil {
		writeJSON(w, http.StatusBadRequest, errorBody{Error: "request has no Pod"})
		return nil, false
	}
	switch {
	case args.NodeNames != nil:
		return *args.NodeNames, true
	case args.Nodes != nil:
		names := make([]string, len(args.Nodes.Items))
		for i := range args.Nodes.Items {
			names[i] = args.Nodes.Items[i].Name
		}
		return names, true
	}
	writeJSON(w, http.StatusBadRequest, errorBody{Error: "request has neither NodeNames nor Nodes"})
	return nil, false
}

// extenderArgs is what filter and prioritize share: readiness, the bounded
// body, and the candidate node names; on false the error is already written.
func (s *Server) extenderArgs(w http.ResponseWriter, r *http.Request) (*extenderv1.ExtenderArgs, []string, bool) {
	if !s.ready(w) {
		return nil, nil, false
	}
	body, ok := readJSON(w, r, s.cfg.MaxBodyBytes)
	if !ok {
		return nil, nil, false
	}
	args, err := unmarshalExtenderArgs(body)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, errorBody{Error: "malformed request body: " + err.Error()})
		return nil, nil, false
	}
	names, ok := candidates(w, args)
	return args, names, ok
}

func (s *Server) filter(w http.ResponseWriter, r *http.Request) {
	args, names, ok := s.extenderArgs(w, r)
	if !ok {
		return
	}
	res := Filter(s.cfg.Cache, s.cfg.Policy, args, names)
	// Counted before the answer, so whoever sees the scheduler's verdict sees the gauge too.
	s.pending.set(args.Pod, s.pendingReason(args, res, names))
	writeJSON(w, http.StatusOK, res)
}

// pendingReason is why the pod fits none of names, or "" when some passed
// (or the request is not one the allocator can place at all).
func (s *Server) pendingReason(args *extenderv1.ExtenderArgs, res *extenderv1.ExtenderFilterResult, names []string) string {
	if (res.NodeNames != nil && len(*res.NodeNames) > 0) || (res.Nodes != nil && len(res.Nodes.Items) > 0) {
		return ""
	}
	req, err := allocator.NewRequest(args.Pod)
	if err != nil || req.Units == 0 {
		return ""
	}
	return PendingReason(s.cfg.Cache, s.cfg.Policy, req, names)
}

// Filter is the filter verb without HTTP: which of names (from args) fit
// args.Pod, with a reason for each that does not. In names mode the result
// carries names only; with full Node objects it carries the passing objects.
func Filter(c Cache, policy allocator.Policy, args *extenderv1.ExtenderArgs, names []string) *extenderv1.ExtenderFilterResult {
	res := &extenderv1.ExtenderFilterResult{FailedNodes: extenderv1.FailedNodesMap{}, FailedAndUnresolvableNodes: extenderv1.FailedNodesMap{}}
	pass := make([]bool, len(names))
	req, err := allocator.NewRequest(args.Pod)
	switch {
	case err != nil:
		for _, n := range names {
			res.FailedAndUnresolvableNodes[n] = err.Error()
		}
	case req.Units == 0:
		// gpu-mem: 0 asks for no GPU memory, but bind only binds to GPU
		// nodes in the cache: fail the others here, so the scheduler never
		// picks a node whose bind would be refused.
		for i, v := range c.Nodes(names) {
			switch {
			case v == nil:
				res.FailedNodes[names[i]] = "node " + names[i] + " is not in the gpushare extender's cache"
			case len(v.GPUs) == 0:
				res.FailedAndUnresolvableNodes[names[i]] = allocator.NotGPUShareReason(names[i])
			default:
				pass[i] = true
			}
		}
	default:
		for i, v := range c.Nodes(names) {
			if v == nil {
				res.FailedNodes[names[i]] = "node " + names[i] + " is not in the gpushare extender's cache"
				continue
			}
			if _, unfit := allocator.Place(v, req, policy); unfit != nil {
				if unfit.Unresolvable {
					res.FailedAndUnresolvableNodes[names[i]] = unfit.Reason
				} else {
					res.FailedNodes[names[i]] = unfit.Reason
				}
				continue
			}
			pass[i] = true
		}
	}
	if args.NodeNames != nil {
		out := make([]string, 0, len(names))
		for i, n := range names {
			if pass[i] {
				out = append(out, n)
			}
		}
		res.NodeNames = &out
		return res
	}
	out := &corev1.NodeList{Items: make([]corev1.Node, 0, len(names))}
	for i := range args.Nodes.Items {
		if pass[i] {
			out.Items = append(out.Items, args.Nodes.Items[i])
		}
	}
	res.Nodes = out
	return res
}

func (s *Server) prioritize(w http.ResponseWriter, r *http.Request) {
	if args, names, ok := s.extenderArgs(w, r); ok {
		writeJSON(w, http.StatusOK, Prioritize(s.cfg.Cache, s.cfg.Policy, args.Pod, names))
	}
}

// Prioritize is the prioritize verb without HTTP: a score per node, zero for
// nodes unknown or unfit.
func Prioritize(c Cache, policy allocator.Policy, pod *corev1.Pod, names []string) extenderv1.HostPriorityList {
	out := make(extenderv1.HostPriorityList, len(names))
	req, err := allocator.NewRequest(pod)
	views := c.Nodes(names)
	for i, n := range names {
		out[i] = extenderv1.HostPriority{Host: n}
		if err == nil && views[i] != nil {
			out[i].Score = allocator.Score(views[i], req, policy)
		}
	}
	return out
}

func (s *Server) bind(w http.ResponseWriter, r *http.Request) {
	if !s.ready(w) {
		return
	}
	var args extenderv1.ExtenderBindingArgs
	if !decode(w, r, maxBindBody, &args) {
		return
	}
	if args.PodName == "" || args.PodNamespace == "" || args.Node == "" || args.PodUID == "" {
		writeJSON(w, http.StatusBadRequest, errorBody{Error: "bind request needs PodName, PodNamespace, PodUID and Node"})
		return
	}
	err := s.cfg.Binder.Bind(r.Context(), args)
	if err == nil {
		s.pending.forget(types.UID(args.PodUID))
		s.metrics.binds.WithLabelValues(outcomeBound).Inc()
		writeJSON(w, http.StatusOK, extenderv1.ExtenderBindingResult{})
		return
	}
	outcome := outcomeError
	var unfit *allocator.Unfit
	if errors.As(err, &unfit) {
		outcome = outcomeUnfit
	}
	s.metrics.binds.WithLabelValues(outcome).Inc()
	s.log.Info("bind failed", zap.String("pod", args.PodNamespace+"/"+args.PodName), zap.String("node", args.Node), zap.Error(err))
	status := http.StatusInternalServerError
	if errors.Is(err, binder.ErrRefused) {
		// Not ours to bind (no gpu-mem, or not a GPU node we know): a 400,
		// written before any API call changed anything.
		status = http.StatusBadRequest
	}
	// The seed answers 500 with the error; the scheduler then retries the pod.
	writeJSON(w, status, extenderv1.ExtenderBindingResult{Error: err.Error()})
}

func (s *Server) inspect(w http.ResponseWriter, r *http.Request) {
	node := strings.TrimSpace(r.PathValue("node"))
	res, ok := s.cfg.Cache.Inspect(node)
	if !ok {
		res.Error = "node " + node + " is not a GPU-sharing node known to the extender"
		writeJSON(w, http.StatusNotFound, res)
		return
	}
	writeJSON(w, http.StatusOK, res)
}
