//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/manager"
	"github.com/gpushare/gpushare/plugin/nvml"
	"github.com/gpushare/gpushare/plugin/podsource"
	"github.com/gpushare/gpushare/plugin/usage"
	"github.com/gpushare/gpushare/plugin/usage/cgroup"
	"github.com/gpushare/gpushare/test/cluster"
)

// TestDRAUsage runs the usage loop as the DRA driver of a node, with exactly the rights of
// manifests/dra/usage: its pod watch, its summary on its Node and its over-use Event on a pod of
// another namespace all pass RBAC and admission; the node policy refuses any other write to the
// Node, and any write to another Node.
func TestDRAUsage(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	c := cluster.StartT(t, cluster.Config{NoScheduler: true})
	applyDRAObjectsOf(t, c, "dra/usage")
	if err := c.CreateNodes(ctx, []cluster.NodeSpec{{Name: "dra-u"}, {Name: "dra-v"}}); err != nil {
		t.Fatal(err)
	}
	admin := c.Client()
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ml"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	driver := driverClient(t, c, "dra-u")
	sim := simulator(t, "simulated:dgxh100")

	// A webhook-translated pod as the driver records it: 4 GiB on GPU 3; its container uses 6.
	pod := translatedPod(t, admin, "ml", "infer", "dra-u", 3, 4)
	const gib = 1 << 30
	if err := sim.SetProcesses(3, []nvml.Process{{PID: 4242, UsedBytes: 6 * gib, UsedKnown: true}}); err != nil {
		t.Fatal(err)
	}
	owner := cgroup.Owner{PodUID: string(pod.UID), ContainerID: strings.Repeat("d", 64)}

	pods := podsource.New(driver, "dra-u", zaptest.NewLogger(t))
	if err := pods.Start(ctx); err != nil {
		t.Fatalf("the driver's pod watch under manifests/dra/usage: %v", err)
	}
	t.Cleanup(pods.Shutdown)
	events, stop := manager.StartEventRecorder(ctx, driver)
	t.Cleanup(stop)
	loop, err := usage.New(usage.Config{GPUs: sim, Pods: pods.Pods, Unit: gpushare.GiB, Interval: time.Second, Grace: time.Second,
		Owner:  func(pid uint32) (cgroup.Owner, bool, error) { return owner, pid == 4242, nil },
		Events: events, Publish: usage.NodePublisher(driver, "dra-u", "gpushare-dra-driver"), Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	go loop.Run(ctx)

	pollUntil(t, waitLong, "the driver's summary on dra-u", func() bool {
		n, err := admin.CoreV1().Nodes().Get(ctx, "dra-u", metav1.GetOptions{})
		if err != nil {
			return false
		}
		u, err := gpushare.DecodeNodeUsage(n.Annotations[gpushare.AnnotationNodeUsage])
		return err == nil && len(u.Containers) == 1 && u.Containers[0].Over() && u.Containers[0].UsedMiB == 6144
	})
	ev := waitEvent(t, admin, "ml", pod.UID, gpushare.EventReasonOverUse)
	if !strings.Contains(ev.Note, "container main uses 6.0 GiB of GPU 3") {
		t.Errorf("over-use event %q", ev.Note)
	}
	checkDriverNodePolicy(t, driver, admin)
}

// translatedPod creates a pod bound to node whose container "main" has units on gpu in its
// gpushare record, running with a 64-hex container ID (the status a kubelet would write).
func translatedPod(t *testing.T, admin kubernetes.Interface, ns, name, node string, gpu int, units uint64) *corev1.Pod {
	t.Helper()
	ctx := t.Context()
	env, err := gpushare.EncodeContainerEnvs(gpushare.ContainerEnvs{"main": {GPUIndex: gpu, PodUnits: units, ContainerUnits: units, DevUnits: 80}})
	if err != nil {
		t.Fatal(err)
	}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: map[string]string{gpushare.AnnotationContainerEnv: env}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "main", Image: "gpu"}}}}
	p, err = admin.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{Name: "main", Image: "gpu",
		ContainerID: "containerd://" + strings.Repeat("d", 64), Ready: true, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}}
	if p, err = admin.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	return p
}

// checkDriverNodePolicy: the driver of dra-u may write gpushare.io/usage on dra-u only.
func checkDriverNodePolicy(t *testing.T, driver, admin kubernetes.Interface) {
	t.Helper()
	patch := func(node, body string) func(kubernetes.Interface) error {
		return func(c kubernetes.Interface) error {
			_, err := c.CoreV1().Nodes().Patch(context.Background(), node, types.MergePatchType, []byte(body), metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		}
	}
	refused := func(err error) bool {
		return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "ValidatingAdmissionPolicy 'gpushare-dra-driver-nodes'")
	}
	usageValue := fmt.Sprintf(`{"metadata":{"annotations":{%q:"x"}}}`, gpushare.AnnotationNodeUsage)
	writes := []struct {
		name string
		do   func(kubernetes.Interface) error
		want string
	}{
		{"another annotation", patch("dra-u", `{"metadata":{"annotations":{"gpushare.io/gpus":"{}"}}}`), "metadata.annotations[gpushare.io/gpus]"},
		{"a label", patch("dra-u", `{"metadata":{"labels":{"gpushare":"true"}}}`), "metadata.labels"},
		{"a taint", patch("dra-u", `{"spec":{"unschedulable":true}}`), "spec"},
		{"another node", patch("dra-v", usageValue), "may only update its own Node (dra-u)"},
	}
	waitFor(t, waitLong, "the DRA node policy to be in force", func() (bool, string) {
		err := writes[0].do(driver)
		return refused(err), fmt.Sprint(err)
	})
	for _, w := range writes {
		if err := w.do(driver); !refused(err) || !strings.Contains(err.Error(), w.want) {
			t.Errorf("driver of dra-u, %s: %v; want refused by gpushare-dra-driver-nodes with %q", w.name, err, w.want)
		}
		if err := w.do(admin); err != nil {
			t.Errorf("%s as the admin (dry run): %v; the write itself must be valid", w.name, err)
		}
	}
	if err := patch("dra-u", usageValue)(driver); err != nil {
		t.Errorf("the driver of dra-u writing its own usage summary: %v; want allowed", err)
	}
}
