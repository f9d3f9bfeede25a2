//go:build e2e

package browser

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpushare/gpushare/inspector/cmd"
	"github.com/gpushare/gpushare/inspector/collect"
	"github.com/gpushare/gpushare/inspector/explain"
	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/test/cluster"
)

var screenshot = flag.String("screenshot", "", "PNG file to write the test's page to once it is drawn")

// TestMapInBrowser opens kubectl inspect gpushare ui, run as the command runs, in headless
// Chromium against the test bed: the page loads with no console error; its figures equal
// kubectl inspect gpushare -o json; a pod created by the test shows within 2 s; a pending pod
// shows the reason why gives.
func TestMapInBrowser(t *testing.T) {
	c := cluster.StartT(t, cluster.Config{NoScheduler: true})
	ctx := t.Context()
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "none"))
	admin := c.AdminKubeconfig()
	makeCluster(t, c)

	addr := freeAddress(t)
	uiCtx, stopUI := context.WithCancel(ctx)
	var out, errOut bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- cmd.Execute(uiCtx, []string{"ui", "--kubeconfig", admin, "--address", addr, "--no-browser"},
			cmd.Streams{Out: &out, ErrOut: &errOut}, cmd.NewKubeFlags(), cmd.NewForConfig)
	}()
	t.Cleanup(func() {
		stopUI()
		if code := <-done; code != 0 {
			t.Errorf("ui exited %d: %s", code, errOut.String())
		}
	})

	browser, stop, err := Start(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	page, closePage, err := openWhenServing(browser, "http://"+addr+"/")
	if err != nil {
		t.Fatalf("%v\nui: %s%s", err, out.String(), errOut.String())
	}
	defer closePage()
	first, err := page.WaitRendered(30*time.Second, 1)
	if err != nil {
		t.Fatal(err)
	}

	checkFigures(t, page, admin)

	// A pod created now shows within 2 s.
	created := time.Now()
	createBound(t, c, boundPod("team-b", "added", "map-a", 1, 4))
	sel := `document.querySelector('[data-pod="team-b/added"]') !== null`
	if err := Poll(page.Ctx, 2*time.Second, sel); err != nil {
		t.Errorf("the created pod was not on the page within 2 s: %v", err)
	} else {
		t.Logf("created pod on the page after %v", time.Since(created).Round(time.Millisecond))
	}

	// And a pod deleted now leaves the page within 2 s.
	deleted := time.Now()
	if err := c.Client().CoreV1().Pods("team-b").Delete(ctx, "added", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	if err := Poll(page.Ctx, 2*time.Second, `document.querySelector('[data-pod="team-b/added"]') === null`); err != nil {
		t.Errorf("the deleted pod was still on the page after 2 s: %v", err)
	} else {
		t.Logf("deleted pod off the page after %v", time.Since(deleted).Round(time.Millisecond))
	}

	// A pod no GPU can hold waits, with why's reason beside it.
	pending := podOf("team-a", "too-big", 200)
	if _, err := c.Client().CoreV1().Pods("team-a").Create(ctx, pending, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	reason := whySummary(t, admin, "team-a", "too-big")
	var shown string
	expr := `(() => { const e = document.querySelector('[data-pending="team-a/too-big"] .reason'); return e ? e.textContent : ""; })()`
	if err := Poll(page.Ctx, 5*time.Second, expr+` !== ""`); err != nil {
		t.Fatalf("the pending pod has no reason on the page: %v", err)
	}
	if shown, err = Eval[string](page, expr); err != nil || shown != reason {
		t.Errorf("pending reason on the page %q (%v); why says %q", shown, err, reason)
	}
	if errs := page.Errors(); len(errs) > 0 {
		t.Errorf("the page raised errors: %v", errs)
	}
	t.Logf("first draw: generation %d in %.1f ms", first.Generation, first.Ms)
	if *screenshot != "" {
		png, err := chromedp.Run(page.Ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(*screenshot, png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// checkFigures compares the page with kubectl inspect gpushare -o json: the cluster's totals,
// each node's and each GPU's allocated and total.
func checkFigures(t *testing.T, page *Page, admin string) {
	t.Helper()
	var report collect.Report
	inspectJSON(t, &report, "--kubeconfig", admin, "-o", "json")
	type pageFigures struct {
		Allocated string `json:"allocated"`
		Total     string `json:"total"`
		Nodes     []struct {
			Name, Allocated, Total string
			GPUs                   [][3]string
		} `json:"nodes"`
	}
	onPage, err := Eval[pageFigures](page, `({
		allocated: document.getElementById("allocated").textContent,
		total: document.getElementById("total").textContent,
		nodes: [...document.querySelectorAll("[data-node]")].map(n => ({
			Name: n.dataset.node, Allocated: n.dataset.allocated, Total: n.dataset.total,
			GPUs: [...n.querySelectorAll("[data-gpu]")].map(g => [g.dataset.gpu, g.dataset.allocated, g.dataset.total]),
		})),
	})`)
	if err != nil {
		t.Fatal(err)
	}
	if onPage.Allocated != strconv.FormatUint(report.Allocated, 10) || onPage.Total != strconv.FormatUint(report.Total, 10) {
		t.Errorf("page totals %s/%s; inspect says %d/%d", onPage.Allocated, onPage.Total, report.Allocated, report.Total)
	}
	if len(onPage.Nodes) != len(report.Nodes) {
		t.Fatalf("%d nodes on the page, %d in inspect", len(onPage.Nodes), len(report.Nodes))
	}
	for i, n := range report.Nodes {
		p := onPage.Nodes[i]
		want := fmt.Sprintf("%s %d/%d %d GPUs", n.Name, n.Allocated, n.Total, len(n.GPUs))
		if got := fmt.Sprintf("%s %s/%s %d GPUs", p.Name, p.Allocated, p.Total, len(p.GPUs)); got != want {
			t.Errorf("page node %s; inspect %s", got, want)
			continue
		}
		for j, g := range n.GPUs {
			if want := [3]string{strconv.Itoa(g.Index), strconv.FormatUint(g.Allocated, 10), strconv.FormatUint(g.Total, 10)}; p.GPUs[j] != want {
				t.Errorf("node %s GPU row %v; inspect %v", n.Name, p.GPUs[j], want)
			}
		}
	}
}

func inspectJSON(t *testing.T, v any, args ...string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := cmd.Execute(t.Context(), args, cmd.Streams{Out: &out, ErrOut: &errOut}, cmd.NewKubeFlags(), cmd.NewForConfig)
	if err := json.Unmarshal(out.Bytes(), v); err != nil {
		t.Fatalf("inspect %v exit %d: %v\n%s%s", args, code, err, out.String(), errOut.String())
	}
}

func whySummary(t *testing.T, admin, ns, name string) string {
	t.Helper()
	var w explain.Why
	inspectJSON(t, &w, "why", name, "-n", ns, "--kubeconfig", admin, "-o", "json")
	return w.Summary
}

// makeCluster: two nodes of our plugin (one with a MIG-skipped GPU and an unhealthy one) and
// pods of two namespaces on them.
func makeCluster(t *testing.T, c *cluster.Cluster) {
	t.Helper()
	ctx := t.Context()
	gpus := func(n int, unhealthy int) string {
		desc := gpushare.NodeGPUs{Unit: gpushare.GiB, Simulated: true}
		for i := range n {
			g := gpushare.GPUInfo{Index: i, UUID: fmt.Sprintf("GPU-%d", i), Model: "H100", Units: 16, Healthy: i != unhealthy}
			if !g.Healthy {
				g.Reason = "XID 79: fallen off the bus"
			}
			desc.GPUs = append(desc.GPUs, g)
		}
		raw, err := gpushare.EncodeNodeGPUs(desc)
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	skipped, err := gpushare.EncodeSkippedGPUs([]gpushare.SkippedGPU{{Index: 2, UUID: "GPU-2", Model: "A100", Reason: "MIG mode is enabled"}})
	if err != nil {
		t.Fatal(err)
	}
	sharing := map[string]string{gpushare.LabelGPUShare: gpushare.LabelValueTrue}
	if err := c.CreateNodes(ctx, []cluster.NodeSpec{
		{Name: "map-a", Labels: sharing, Resources: map[corev1.ResourceName]int64{gpushare.ResourceName: 32, gpushare.ResourceCount: 2},
			Annotations: map[string]string{gpushare.AnnotationNodeGPUs: gpus(2, -1), gpushare.AnnotationSkippedGPUs: skipped}},
		{Name: "map-b", Labels: sharing, Resources: map[corev1.ResourceName]int64{gpushare.ResourceName: 64, gpushare.ResourceCount: 4},
			Annotations: map[string]string{gpushare.AnnotationNodeGPUs: gpus(4, 3)}},
	}); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"team-a", "team-b"} {
		if _, err := c.Client().CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	createBound(t, c, boundPod("team-a", "infer-1", "map-a", 0, 6))
	createBound(t, c, boundPod("team-a", "infer-2", "map-a", 0, 4))
	createBound(t, c, boundPod("team-b", "train", "map-b", 1, 12))
	createBound(t, c, boundPod("team-b", "notebook", "map-b", 0, 2))
}

// podOf is a pod of one container asking units of gpu-mem.
func podOf(ns, name string, units int64) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.PodSpec{Containers: []corev1.Container{{
		Name: "main", Image: "gpu", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
			gpushare.ResourceName: *resource.NewQuantity(units, resource.DecimalSI)}}}}}}
}

// boundPod is podOf placed on node's GPU gpu by the extender's annotations.
func boundPod(ns, name, node string, gpu int, units int64) *corev1.Pod {
	p := podOf(ns, name, units)
	a := gpushare.PodAssignment{GPUIndex: gpu, PodUnits: uint64(units), DevUnits: 16, AssumeTime: time.Now().UnixNano()}
	ann, err := a.Encode()
	if err != nil {
		panic(err)
	}
	p.Annotations = ann
	p.Spec.NodeName = node
	return p
}

// createBound creates p, already bound (spec.nodeName set, as a test may).
func createBound(t *testing.T, c *cluster.Cluster, p *corev1.Pod) {
	t.Helper()
	if _, err := c.Client().CoreV1().Pods(p.Namespace).Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// openWhenServing opens url once the command serves it (it lists the cluster first).
func openWhenServing(browser context.Context, url string) (*Page, context.CancelFunc, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", url[len("http://"):len(url)-1], time.Second)
		if err == nil {
			conn.Close()
			return Open(browser, url)
		}
		if time.Now().After(deadline) {
			return nil, nil, fmt.Errorf("nothing serves %s after 30 s: %w", url, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func freeAddress(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
