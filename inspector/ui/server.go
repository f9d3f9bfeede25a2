package ui

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/inspector/explain"
	"github.com/gpushare/gpushare/inspector/render"
)

//go:embed assets
var assets embed.FS

// MinRebuild is the shortest time between two rebuilds: a burst of changes
// (a Deployment scaled by hundreds) costs one rebuild per period, and a
// single change still shows within it.
const MinRebuild = 250 * time.Millisecond

// maxManifest bounds a manifest posted to fit.
const maxManifest = 1 << 20

// Server builds the view from a Source and serves the page.
type Server struct {
	src       Source
	policy    allocator.Policy
	namespace string // for manifests that name none

	gen uint64 // the latest view's generation; Run's alone

	mu    sync.Mutex
	view  []byte // the latest View as JSON; nil before the first build
	subs  map[chan []byte]struct{}
	built chan struct{} // closed at the first build
}

// NewServer returns a server of src's cluster under the extender's policy;
// namespace is where fit places a manifest that names none.
func NewServer(src Source, policy allocator.Policy, namespace string) *Server {
	return &Server{src: src, policy: policy, namespace: namespace, subs: map[chan []byte]struct{}{}, built: make(chan struct{})}
}

// Run rebuilds the view at once and after each change, at most every
// MinRebuild, until ctx ends.
func (s *Server) Run(ctx context.Context) {
	for {
		s.rebuild()
		t := time.NewTimer(MinRebuild)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		select {
		case <-ctx.Done():
			return
		case <-s.src.Changed():
		}
	}
}

// rebuild computes the view and sends it to every open page; a page too
// slow to take it keeps the one it has and gets the next. Only Run calls
// it, so gen needs no lock; the encoding (megabytes at 10,000 pods) is done
// before taking mu, which the page handlers wait on.
func (s *Server) rebuild() {
	v := BuildView(s.src.Objects(), s.policy)
	s.gen++
	v.Generation = s.gen
	data, err := json.Marshal(v)
	if err != nil {
		return // unreachable: View holds only marshalable values
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.view = data
	for ch := range s.subs {
		select {
		case <-ch: // drop the stale one it has not taken
		default:
		}
		ch <- data
	}
	select {
	case <-s.built:
	default:
		close(s.built)
	}
}

// Handler serves the page, its assets and its API to hosts naming the
// loopback address the server listens on: a page of another site, or a
// DNS name rebound to 127.0.0.1, gets 403.
func (s *Server) Handler(listen string) http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(assets, "assets") // the directory is embedded: cannot fail
	mux.Handle("GET /", http.FileServerFS(static))
	mux.HandleFunc("GET /api/view", s.serveView)
	mux.HandleFunc("GET /api/events", s.serveEvents)
	mux.HandleFunc("POST /api/fit", s.serveFit)
	return loopbackOnly(listen, securityHeaders(mux))
}

// loopbackOnly refuses requests whose Host is not the address listened on
// (by IP or as localhost), and POSTs from another origin.
func loopbackOnly(listen string, next http.Handler) http.Handler {
	_, port, _ := net.SplitHostPort(listen)
	allowed := map[string]bool{"127.0.0.1:" + port: true, "localhost:" + port: true, "[::1]:" + port: true}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !allowed[r.Host] {
			http.Error(w, "forbidden: this page answers only at http://127.0.0.1:"+port, http.StatusForbidden)
			return
		}
		if origin := r.Header.Get("Origin"); r.Method != http.MethodGet && origin != "" && !allowed[hostOf(origin)] {
			http.Error(w, "forbidden: cross-origin request", http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// hostOf is the host:port of an origin ("http://127.0.0.1:8080").
func hostOf(origin string) string {
	for _, scheme := range []string{"http://", "https://"} {
		if len(origin) > len(scheme) && origin[:len(scheme)] == scheme {
			return origin[len(scheme):]
		}
	}
	return ""
}

// securityHeaders keeps the page from loading anything but its own assets.
func securityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'self'; style-src 'self'; script-src 'self'; connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		next.ServeHTTP(w, r)
	})
}

// latest waits for the first build and returns the view's JSON.
func (s *Server) latest(ctx context.Context) ([]byte, error) {
	select {
	case <-s.built:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.view, nil
}

func (s *Server) serveView(w http.ResponseWriter, r *http.Request) {
	data, err := s.latest(r.Context())
	if err != nil {
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(data)
}

// serveEvents streams each new view as a Server-Sent Event "view", the
// current one first.
func (s *Server) serveEvents(w http.ResponseWriter, r *http.Request) {
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	first, err := s.latest(r.Context())
	if err != nil {
		return
	}
	ch := make(chan []byte, 1)
	s.mu.Lock()
	s.subs[ch] = struct{}{}
	if !bytes.Equal(s.view, first) {
		first = s.view
	}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.subs, ch)
		s.mu.Unlock()
	}()
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	send := func(data []byte) bool {
		_, err := fmt.Fprintf(w, "event: view\ndata: %s\n\n", data)
		flusher.Flush()
		return err == nil
	}
	if !send(first) {
		return
	}
	keepAlive := time.NewTicker(15 * time.Second)
	defer keepAlive.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case data := <-ch:
			if !send(data) {
				return
			}
		case <-keepAlive.C:
			if _, err := io.WriteString(w, ": keep-alive\n\n"); err != nil {
				return
			}
			flusher.Flush()
		}
	}
}

// fitAnswer is what POST /api/fit returns: fit's text and its JSON.
type fitAnswer struct {
	Text string       `json:"text"`
	Fit  *explain.Fit `json:"fit"`
}

// serveFit runs fit on the posted manifest (?replicas=N) against the
// cluster as the latest objects show it.
func (s *Server) serveFit(w http.ResponseWriter, r *http.Request) {
	replicas := 1
	if v := r.URL.Query().Get("replicas"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 10000 {
			http.Error(w, "replicas must be a whole number from 1 to 10000", http.StatusBadRequest)
			return
		}
		replicas = n
	}
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxManifest))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		http.Error(w, "the manifest is larger than 1 MiB", http.StatusRequestEntityTooLarge)
		return
	}
	if err != nil {
		http.Error(w, "read the manifest: "+err.Error(), http.StatusBadRequest)
		return
	}
	pod, err := explain.PodFromManifest(data, s.namespace, "the form")
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	objs := s.src.Objects()
	f, err := explain.ExplainFit(explain.State{Nodes: objs.Nodes, Pods: objs.Pods}, pod, s.policy, replicas)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var text bytes.Buffer
	if err := render.Fit(&text, f); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(fitAnswer{Text: text.String(), Fit: f})
}
