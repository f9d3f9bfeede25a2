package ui_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/inspector/collect"
	"github.com/gpushare/gpushare/inspector/explain"
	"github.com/gpushare/gpushare/inspector/internal/fixture"
	"github.com/gpushare/gpushare/inspector/ui"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

// fixedSource is a Source whose objects the test sets.
type fixedSource struct {
	mu      sync.Mutex
	objs    collect.Objects
	changed chan struct{}
}

func newSource(objs collect.Objects) *fixedSource {
	return &fixedSource{objs: objs, changed: make(chan struct{}, 1)}
}

func (f *fixedSource) Objects() collect.Objects {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.objs
}

func (f *fixedSource) Changed() <-chan struct{} { return f.changed }

func (f *fixedSource) set(objs collect.Objects) {
	f.mu.Lock()
	f.objs = objs
	f.mu.Unlock()
	f.changed <- struct{}{}
}

// cluster: one node of two 16-unit GPUs, GPU 1 in MIG mode and skipped, a
// pod of 6 on GPU 0, and two pending pods: one of 8, one of 40 (too big).
func cluster() collect.Objects {
	node := fixture.WithGPUs(fixture.Node("n1", "10.0.0.1", 16, 1), gpushare.NodeGPUs{Unit: gpushare.GiB,
		GPUs: []gpushare.GPUInfo{{Index: 0, UUID: "GPU-0", Model: "H100", Units: 16, Healthy: true}}})
	node.Labels = map[string]string{gpushare.LabelGPUShare: gpushare.LabelValueTrue}
	skipped, err := gpushare.EncodeSkippedGPUs([]gpushare.SkippedGPU{{Index: 1, UUID: "GPU-1", Model: "A100", Reason: "MIG mode is enabled"}})
	if err != nil {
		panic(err)
	}
	node = fixture.WithAnnotation(node, gpushare.AnnotationSkippedGPUs, skipped)
	placed := fixture.Record(fixture.SimplePod("ml", "infer", "n1", 6, 0, 16, true),
		gpushare.ContainerEnvs{"main": {GPUIndex: 0, PodUnits: 6, ContainerUnits: 6, DevUnits: 16}})
	small := fixture.Pod("ml", "small", "", fixture.Container("main", 8))
	small.Status.Phase = corev1.PodPending
	huge := fixture.Pod("ml", "huge", "", fixture.Container("main", 40))
	huge.Status.Phase = corev1.PodPending
	return collect.Objects{Nodes: []corev1.Node{node}, Pods: []corev1.Pod{placed, small, huge}}
}

func TestBuildView(t *testing.T) {
	objs := cluster()
	v := ui.BuildView(objs, allocator.BestFit)
	if got := v.Report.Nodes[0].Pods[0].Containers[0].Env; got != nil {
		t.Errorf("container env %v sent to the page", got)
	}
	if want := collect.BuildObjects(objs); v.Report.Allocated != want.Allocated || v.Report.Total != want.Total {
		t.Errorf("report %d/%d, want the inspector's %d/%d", v.Report.Allocated, v.Report.Total, want.Allocated, want.Total)
	}
	if s := v.SkippedGPUs["n1"]; len(s) != 1 || s[0].Index != 1 {
		t.Errorf("skipped GPUs %+v, want n1's GPU 1", v.SkippedGPUs)
	}
	if len(v.Pending) != 2 {
		t.Fatalf("pending %+v, want small and huge", v.Pending)
	}
	for _, p := range v.Pending {
		pod := &objs.Pods[1]
		if p.Name == "huge" {
			pod = &objs.Pods[2]
		}
		w, err := explain.ExplainWhy(explain.State{Nodes: objs.Nodes, Pods: objs.Pods}, pod, allocator.BestFit)
		if err != nil {
			t.Fatal(err)
		}
		if p.Reason != w.Summary || p.Fitting != w.Fitting || p.Reason == "" {
			t.Errorf("pending %s: reason %q fitting %d; want why's %q, %d", p.Name, p.Reason, p.Fitting, w.Summary, w.Fitting)
		}
	}
}

// serve runs a server of src behind an httptest listener on 127.0.0.1.
func serve(t *testing.T, src ui.Source) *httptest.Server {
	t.Helper()
	s := ui.NewServer(src, allocator.BestFit, "default")
	ctx, cancel := context.WithCancel(context.Background())
	go s.Run(ctx)
	hs := httptest.NewUnstartedServer(nil)
	hs.Config.Handler = s.Handler(hs.Listener.Addr().String())
	hs.Start()
	t.Cleanup(func() {
		cancel()
		hs.CloseClientConnections()
		hs.Close()
	})
	return hs
}

func get(t *testing.T, url, host string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

func TestServerPageAndGuards(t *testing.T) {
	hs := serve(t, newSource(cluster()))
	resp, body := get(t, hs.URL+"/", "")
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `src="app.js"`) {
		t.Fatalf("GET / = %d %q", resp.StatusCode, body)
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") {
		t.Errorf("CSP %q", csp)
	}
	if resp, _ := get(t, hs.URL+"/app.js", ""); resp.StatusCode != http.StatusOK || !strings.Contains(resp.Header.Get("Content-Type"), "javascript") {
		t.Errorf("GET /app.js = %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	// A name rebound to 127.0.0.1 reaches the socket but not the page.
	if resp, _ := get(t, hs.URL+"/api/view", "evil.example:80"); resp.StatusCode != http.StatusForbidden {
		t.Errorf("foreign Host: %d, want 403", resp.StatusCode)
	}
	port := hs.Listener.Addr().String()[strings.LastIndex(hs.Listener.Addr().String(), ":"):]
	if resp, _ := get(t, hs.URL+"/api/view", "localhost"+port); resp.StatusCode != http.StatusOK {
		t.Errorf("localhost Host: %d, want 200", resp.StatusCode)
	}
	resp, body = get(t, hs.URL+"/api/view", "")
	var v ui.View
	if err := json.Unmarshal([]byte(body), &v); err != nil || v.Generation < 1 || len(v.Report.Nodes) != 1 {
		t.Errorf("GET /api/view = %d %v %+v", resp.StatusCode, err, v)
	}
}

func post(t *testing.T, url, origin, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(out)
}

func TestFit(t *testing.T) {
	hs := serve(t, newSource(cluster()))
	manifest := "apiVersion: v1\nkind: Pod\nmetadata: {name: try}\nspec:\n  containers:\n  - name: main\n    image: x\n    resources: {limits: {aliyun.com/gpu-mem: 4}}\n"
	code, body := post(t, hs.URL+"/api/fit?replicas=3", "", manifest)
	var answer struct {
		Text string       `json:"text"`
		Fit  *explain.Fit `json:"fit"`
	}
	if err := json.Unmarshal([]byte(body), &answer); code != http.StatusOK || err != nil {
		t.Fatalf("fit = %d %q (%v)", code, body, err)
	}
	// GPU 0 has 10 units free: two copies of 4 fit, the third does not.
	if answer.Fit.Placed != 2 || answer.Fit.Replicas != 3 || !strings.Contains(answer.Text, "n1") {
		t.Errorf("fit placed %d of %d:\n%s", answer.Fit.Placed, answer.Fit.Replicas, answer.Text)
	}
	for _, tc := range []struct {
		query, origin, body string
		want                int
	}{
		{"?replicas=0", "", manifest, http.StatusBadRequest},
		{"", "", "kind: Pod\nspec: [", http.StatusBadRequest},
		{"", "", strings.Repeat("#", 2<<20), http.StatusRequestEntityTooLarge},
		{"", "http://evil.example", manifest, http.StatusForbidden},
		{"", hs.URL, manifest, http.StatusOK},
	} {
		if code, body := post(t, hs.URL+"/api/fit"+tc.query, tc.origin, tc.body); code != tc.want {
			t.Errorf("fit%s from %q: %d %q, want %d", tc.query, tc.origin, code, body, tc.want)
		}
	}
}

// TestEventsPushChanges: the stream sends the current view, then a new one
// after the source changes, with the new pod in it.
func TestEventsPushChanges(t *testing.T) {
	src := newSource(cluster())
	hs := serve(t, src)
	resp, err := http.Get(hs.URL + "/api/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	events := bufio.NewReader(resp.Body)
	first := nextView(t, events)
	objs := cluster()
	objs.Pods = append(objs.Pods, fixture.SimplePod("ml", "added", "n1", 2, 0, 16, false))
	started := time.Now()
	src.set(objs)
	second := nextView(t, events)
	if second.Generation <= first.Generation || second.Report.Allocated != first.Report.Allocated+2 {
		t.Errorf("second view generation %d allocated %d; first %d, %d", second.Generation, second.Report.Allocated, first.Generation, first.Report.Allocated)
	}
	if late := time.Since(started); late > 2*time.Second {
		t.Errorf("the change reached the stream after %v", late)
	}
}

// nextView reads the next "view" event.
func nextView(t *testing.T, r *bufio.Reader) ui.View {
	t.Helper()
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("read the stream: %v", err)
		}
		if data, ok := strings.CutPrefix(line, "data: "); ok {
			var v ui.View
			if err := json.Unmarshal([]byte(data), &v); err != nil {
				t.Fatal(err)
			}
			return v
		}
	}
}

// TestAssetsSelfContained: the page names no other site, so nothing is
// fetched at run time (the CSP would block it too).
func TestAssetsSelfContained(t *testing.T) {
	external := regexp.MustCompile(`(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}|@import|<script[^>]*>[^<]`)
	err := filepath.WalkDir("assets", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if m := external.Find(data); m != nil {
			t.Errorf("%s refers outside the page: %q", path, m)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
