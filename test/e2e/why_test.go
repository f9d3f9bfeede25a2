//go:build e2e

package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"github.com/gpushare/gpushare/inspector/explain"
	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/test/cluster"
)

// TestInspectWhy: on one node of two 8-unit GPUs, c (5) and a (6) bind through kube-scheduler and
// the extender; b (4) then waits although the node has 5 units free: fragmentation, which why
// must name. Once a is deleted, fit says where a pod like b lands, and b binds exactly there.
func TestInspectWhy(t *testing.T) {
	ctx := t.Context()
	c := cluster.StartT(t, cluster.Config{NoScheduler: true})
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "none"))
	admin := c.AdminKubeconfig()
	if err := c.CreateNodes(ctx, []cluster.NodeSpec{{Name: "why-gpu", Resources: map[corev1.ResourceName]int64{
		gpushare.ResourceName: 16, gpushare.ResourceCount: 2,
	}}}); err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + freeLoopbackPort(t)
	ext := startExtender(t, addr, c.Client())
	defer ext.stop(t)
	if err := c.StartScheduler(ctx, cluster.SchedulerConfig{Extenders: []cluster.Extender{ourExtender("http://" + addr)}}); err != nil {
		t.Fatal(err)
	}
	pods := c.Client().CoreV1().Pods("default")
	for _, p := range []struct {
		name  string
		units int64
	}{{"c", 5}, {"a", 6}} {
		if _, err := pods.Create(ctx, gpuPod(p.name, p.units, nil), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.WaitForPod(ctx, "default", p.name, waitLong, "bound", cluster.PodBound); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pods.Create(ctx, gpuPod("b", 4, nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitForPod(ctx, "default", "b", waitLong, "judged unschedulable", func(p *corev1.Pod) bool { return unschedulable(p) != "" }); err != nil {
		t.Fatal(err)
	}

	code, out, errOut := inspect(ctx, "why", "b", "--kubeconfig", admin, "-o", "json")
	var w explain.Why
	if err := json.Unmarshal([]byte(out), &w); err != nil || code != 1 {
		t.Fatalf("why b: exit %d, %v\n%s%s", code, err, out, errOut)
	}
	if len(w.Nodes) != 1 || w.Nodes[0].Kind != explain.KindFragmented ||
		w.Nodes[0].Detail != "fragmentation: 5 GiB free on the node, largest free GPU 3 GiB" || w.Scheduler == nil {
		t.Errorf("why b: %+v", w)
	}
	_, text, _ := inspect(ctx, "why", "b", "--kubeconfig", admin)
	t.Logf("why b:\n%s", text)
	// The extender's gauge names the same kind for the pod the scheduler holds.
	if got := seriesValue(t, addr, pendingSeries(explain.KindFragmented)); got != 1 {
		t.Errorf("%s = %v, want 1", pendingSeries(explain.KindFragmented), got)
	}

	zero := int64(0)
	if err := pods.Delete(ctx, "a", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, waitLong, "a gone", func() bool {
		_, err := pods.Get(ctx, "a", metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	// fit for a pod like b: GPU 1 is the only GPU with 4 free, whether or not b has bound yet
	// (if it has, GPU 1 has exactly 4 left), so the answer does not race the scheduler.
	like := gpuPod("b-like", 4, nil)
	like.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}
	manifest, err := yaml.Marshal(like)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "pod.yaml")
	if err := os.WriteFile(file, manifest, 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = inspect(ctx, "fit", "-f", file, "--kubeconfig", admin, "-o", "json")
	var f explain.Fit
	if err := json.Unmarshal([]byte(out), &f); err != nil || code != 0 || f.Placed != 1 {
		t.Fatalf("fit: exit %d, %v\n%s%s", code, err, out, errOut)
	}
	_, text, _ = inspect(ctx, "fit", "-f", file, "--kubeconfig", admin)
	t.Logf("fit:\n%s", text)
	whyNudge(t, c, "b")
	p, err := c.WaitForPod(ctx, "default", "b", waitLong, "bound", cluster.PodBound)
	if err != nil {
		t.Fatal(err)
	}
	want := f.Placements[0]
	if p.Spec.NodeName != want.Node || p.Annotations[gpushare.AnnotationGPUIndex] != strconv.Itoa(want.GPUs[0]) {
		t.Errorf("b bound to %s GPU %s; fit said %s GPU %v", p.Spec.NodeName, p.Annotations[gpushare.AnnotationGPUIndex], want.Node, want.GPUs)
	}
	code, text, _ = inspect(ctx, "why", "b", "--kubeconfig", admin)
	if code != 0 || !strings.Contains(text, "Bound:      why-gpu, GPU "+strconv.Itoa(want.GPUs[0])) {
		t.Errorf("why b once bound: exit %d\n%s", code, text)
	}
	t.Logf("why b, bound:\n%s", text)
	if got := seriesValue(t, addr, pendingSeries(explain.KindFragmented)); got != 0 {
		t.Errorf("b bound: %s = %v, want 0", pendingSeries(explain.KindFragmented), got)
	}
}

func pendingSeries(reason string) string {
	return `gpushare_extender_pending_pods{reason="` + reason + `"}`
}

// whyNudge updates a pending pod's labels so kube-scheduler tries it again at once (see halfBed.nudge).
func whyNudge(t *testing.T, c *cluster.Cluster, name string) {
	t.Helper()
	patch := []byte(`{"metadata":{"labels":{"gpushare-e2e/nudge":"` + strconv.Itoa(os.Getpid()) + `"}}}`)
	if _, err := c.Client().CoreV1().Pods("default").Patch(t.Context(), name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}
