//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpushare/gpushare/inspector/cmd"
	"github.com/gpushare/gpushare/inspector/collect"
	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/test/cluster"
)

// inspectorPod is a pod of named gpu-mem containers carrying the given annotations.
func inspectorPod(ns, name string, annotations map[string]string, containers map[string]int64) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: annotations}}
	for _, c := range []string{"main", "side"} {
		units, ok := containers[c]
		if !ok {
			continue
		}
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: c, Image: "gpu",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{gpushare.ResourceName: *resource.NewQuantity(units, resource.DecimalSI)}}})
	}
	return p
}

// annotations merges an extender assignment with a device-plugin record (when envs is non-nil).
func annotations(t *testing.T, a *gpushare.PodAssignment, envs gpushare.ContainerEnvs) map[string]string {
	t.Helper()
	m := map[string]string{}
	if a != nil {
		enc, err := a.Encode()
		if err != nil {
			t.Fatal(err)
		}
		m = enc
	}
	if envs != nil {
		raw, err := gpushare.EncodeContainerEnvs(envs)
		if err != nil {
			t.Fatal(err)
		}
		m[gpushare.AnnotationContainerEnv] = raw
	}
	return m
}

// createBound creates pod and binds it to node through the Binding subresource, as the extender does.
func createBound(ctx context.Context, t *testing.T, c *cluster.Cluster, pod *corev1.Pod, node string) *corev1.Pod {
	t.Helper()
	created, err := c.Client().CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s/%s: %v", pod.Namespace, pod.Name, err)
	}
	err = c.Client().CoreV1().Pods(pod.Namespace).Bind(ctx, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: created.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: node},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("bind pod %s/%s: %v", pod.Namespace, pod.Name, err)
	}
	return created
}

// inspect runs the CLI's command in-process and returns its exit code and streams.
func inspect(ctx context.Context, args ...string) (int, string, string) {
	var out, errOut bytes.Buffer
	code := cmd.Execute(ctx, args, cmd.Streams{Out: &out, ErrOut: &errOut}, cmd.NewKubeFlags(), cmd.NewForConfig)
	return code, out.String(), errOut.String()
}

func TestInspector(t *testing.T) {
	c := cluster.StartT(t, cluster.Config{NoScheduler: true})
	ctx := t.Context()
	admin := c.AdminKubeconfig()
	// KUBECONFIG must not leak in from the environment: every run names its config.
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "none"))

	gpus, err := gpushare.EncodeNodeGPUs(gpushare.NodeGPUs{Unit: gpushare.GiB, Simulated: true, GPUs: []gpushare.GPUInfo{
		{Index: 0, UUID: "GPU-0", Model: "sim", Units: 15, Healthy: true},
		{Index: 1, UUID: "GPU-1", Model: "sim", Units: 15, Healthy: false, Reason: "XID 48"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CreateNodes(ctx, []cluster.NodeSpec{
		{Name: "insp-a", Address: "10.0.0.1", Labels: map[string]string{gpushare.LabelGPUShare: gpushare.LabelValueTrue},
			Resources:   map[corev1.ResourceName]int64{gpushare.ResourceName: 30, gpushare.ResourceCount: 2},
			Annotations: map[string]string{gpushare.AnnotationNodeGPUs: gpus}},
		{Name: "insp-b", Address: "10.0.0.2", Resources: map[corev1.ResourceName]int64{gpushare.ResourceName: 15, gpushare.ResourceCount: 1}},
		{Name: "insp-cpu", Address: "10.0.0.3"},
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client().CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ml"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// insp-a, run by our plugin: a served pod, a split pod with one container served, a pending pod.
	createBound(ctx, t, c, inspectorPod("default", "a-0", annotations(t,
		&gpushare.PodAssignment{GPUIndex: 0, PodUnits: 4, DevUnits: 15, Assigned: true, AssumeTime: 1},
		gpushare.ContainerEnvs{"main": {GPUIndex: 0, PodUnits: 4, ContainerUnits: 4, DevUnits: 15}}),
		map[string]int64{"main": 4}), "insp-a")
	createBound(ctx, t, c, inspectorPod("ml", "a-split", annotations(t,
		&gpushare.PodAssignment{GPUIndex: 0, PodUnits: 5, DevUnits: 15, AssumeTime: 2, Allocation: gpushare.Allocation{0: {0: 2}, 1: {1: 3}}},
		gpushare.ContainerEnvs{"main": {GPUIndex: 0, PodUnits: 5, ContainerUnits: 2, DevUnits: 15}}),
		map[string]int64{"main": 2, "side": 3}), "insp-a")
	createBound(ctx, t, c, inspectorPod("default", "a-pending", nil, map[string]int64{"main": 2}), "insp-a")
	// insp-b, an old plugin's node: one pod, one finished pod that must not count.
	createBound(ctx, t, c, inspectorPod("default", "b-0", annotations(t,
		&gpushare.PodAssignment{GPUIndex: 0, PodUnits: 10, DevUnits: 15, Assigned: true, AssumeTime: 3}, nil),
		map[string]int64{"main": 10}), "insp-b")
	done := createBound(ctx, t, c, inspectorPod("default", "b-done", annotations(t,
		&gpushare.PodAssignment{GPUIndex: 0, PodUnits: 5, DevUnits: 15, Assigned: true, AssumeTime: 4}, nil),
		map[string]int64{"main": 5}), "insp-b")
	done, err = c.Client().CoreV1().Pods("default").Get(ctx, done.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	done.Status.Phase = corev1.PodSucceeded
	if _, err := c.Client().CoreV1().Pods("default").UpdateStatus(ctx, done, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	t.Run("summary", func(t *testing.T) {
		code, out, errOut := inspect(ctx, "--kubeconfig", admin)
		// From the annotations above: GPU0 4+2, GPU1 3 (unhealthy), pending 2; b-0 10; b-done finished.
		want := "" +
			"NAME    IPADDRESS  GPU0(Allocated/Total)  GPU1(Allocated/Total)  PENDING(Allocated)  GPU Memory(GiB)\n" +
			"insp-a  10.0.0.1   6/15                   3/15 (unhealthy)       2                   11/30\n" +
			"insp-b  10.0.0.2   10/15                  0/0                                        10/15\n" +
			"------------------------------------------------------------------\n" +
			"Allocated/Total GPU Memory In Cluster:\n" +
			"21/45 (46%)  \n"
		if code != 0 || errOut != "" || out != want {
			t.Errorf("exit %d, stderr %q, stdout:\n%s\nwant:\n%s", code, errOut, out, want)
		}
	})

	t.Run("json", func(t *testing.T) {
		code, out, errOut := inspect(ctx, "--kubeconfig", admin, "-o", "json")
		if code != 0 {
			t.Fatalf("exit %d, stderr %q", code, errOut)
		}
		var r collect.Report
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatal(err)
		}
		if r.Allocated != 21 || r.Total != 45 || len(r.Nodes) != 2 || r.Nodes[0].Pending != 2 {
			t.Fatalf("report %+v", r)
		}
		states := map[string]string{}
		for _, p := range r.Nodes[0].Pods {
			for _, ct := range p.Containers {
				states[p.Namespace+"/"+p.Name+"/"+ct.Name] = ct.State + " " + ct.Env[gpushare.EnvContainerUnits]
			}
		}
		want := map[string]string{
			"default/a-0/main":       collect.StateAllocated + " 4",
			"ml/a-split/main":        collect.StateAllocated + " 2",
			"ml/a-split/side":        collect.StateNotAllocated + " ",
			"default/a-pending/main": collect.StateNotAllocated + " ",
		}
		for k, v := range want {
			if states[k] != v {
				t.Errorf("%s: %q, want %q", k, states[k], v)
			}
		}
	})

	t.Run("one node with details and namespace", func(t *testing.T) {
		code, out, errOut := inspect(ctx, "--kubeconfig", admin, "-d", "-n", "ml", "insp-a")
		if code != 0 || errOut != "" {
			t.Fatalf("exit %d, stderr %q", code, errOut)
		}
		for _, s := range []string{"NAME:       insp-a\n", "UNHEALTHY:  GPU1 (XID 48)\n", "a-split", "ml/a-split  side", "(not allocated yet)", "Allocated :  11 (36%)"} {
			if !strings.Contains(out, s) {
				t.Errorf("details lack %q:\n%s", s, out)
			}
		}
		if strings.Contains(out, "insp-b") || strings.Contains(out, "a-0") {
			t.Errorf("details show another node or namespace:\n%s", out)
		}
	})

	t.Run("context flag", func(t *testing.T) {
		cfg, err := clientcmd.LoadFromFile(admin)
		if err != nil {
			t.Fatal(err)
		}
		good := cfg.CurrentContext
		broken := cfg.Contexts[good].DeepCopy()
		cfg.Clusters["nowhere"] = cfg.Clusters[broken.Cluster].DeepCopy()
		cfg.Clusters["nowhere"].Server = "https://127.0.0.1:1"
		broken.Cluster = "nowhere"
		cfg.Contexts["broken"] = broken
		cfg.CurrentContext = "broken"
		path := filepath.Join(t.TempDir(), "kubeconfig")
		if err := clientcmd.WriteToFile(*cfg, path); err != nil {
			t.Fatal(err)
		}
		if code, _, errOut := inspect(ctx, "--kubeconfig", path, "--request-timeout", "5s"); code != 1 || !strings.HasPrefix(errOut, "error: list nodes: ") {
			t.Errorf("current context unreachable: exit %d, stderr %q", code, errOut)
		}
		if code, out, errOut := inspect(ctx, "--kubeconfig", path, "--context", good); code != 0 || !strings.Contains(out, "21/45 (46%)") {
			t.Errorf("--context %s: exit %d, stderr %q, stdout %q", good, code, errOut, out)
		}
		t.Setenv("KUBECONFIG", path)
		if code, out, errOut := inspect(ctx, "--context", good, "insp-b"); code != 0 || !strings.Contains(out, "10/15 (66%)") {
			t.Errorf("KUBECONFIG and --context: exit %d, stderr %q, stdout %q", code, errOut, out)
		}
	})

	t.Run("missing node", func(t *testing.T) {
		code, out, errOut := inspect(ctx, "--kubeconfig", admin, "no-such-node")
		if code != 1 || out != "" || !strings.HasPrefix(errOut, `error: node "no-such-node" not found: run kubectl inspect gpushare`) {
			t.Errorf("exit %d, stdout %q, stderr %q", code, out, errOut)
		}
		code, _, errOut = inspect(ctx, "--kubeconfig", admin, "insp-cpu")
		if code != 1 || !strings.HasPrefix(errOut, `error: node "insp-cpu" is not a GPU-sharing node`) {
			t.Errorf("cpu node: exit %d, stderr %q", code, errOut)
		}
	})
}
