//go:build e2e

package e2e

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/test/cluster"
)

// TestEvents checks the story `kubectl describe` tells on the bed: the extender's
// GPUShareScheduled event on a pod it bound, naming the node, the GPU and its use; the plugin's
// GPUShareAllocateRefused on its Node for a hand-bound pod it cannot place; and GPUUnhealthy on
// its Node when a simulated GPU reports an Xid.
func TestEvents(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := startSystem(t)
	sim := simulator(t, "simulated:dgxh100")
	n := b.addNodeWith(t, "ev-node", sim, nil)

	pod, err := b.client.CoreV1().Pods("default").Create(ctx, sysPod{name: "ev-pod", sizes: []int64{24}}.object(), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod, err = b.c.WaitForPod(ctx, "default", pod.Name, waitLong, "running", cluster.PodRunning); err != nil {
		t.Fatal(err)
	}
	a, ok, err := gpushare.DecodePodAssignment(pod.Annotations)
	if !ok || err != nil {
		t.Fatalf("pod %s has no assignment: %v", pod.Name, err)
	}
	gpu := n.gpus.GPUs[a.GPUIndex]
	want := fmt.Sprintf("placed on node ev-node GPU %d: 24 of %d units used", a.GPUIndex, gpu.Units)
	ev := waitEvent(t, b.client, "default", pod.UID, gpushare.EventReasonScheduled)
	if ev.Note != want || ev.Type != corev1.EventTypeNormal || ev.ReportingController != gpushare.EventControllerExtender {
		t.Errorf("scheduled event %s %q by %s; want Normal %q by %s", ev.Type, ev.Note, ev.ReportingController, want, gpushare.EventControllerExtender)
	}
	describe(t, b, "pod", "ev-pod")

	// A pod bound by hand to a node of eight GPUs, without the extender's placement: the plugin
	// cannot tell which GPU it may have, and refuses its Allocate after the wait.
	hand := sysPod{name: "ev-hand", sizes: []int64{8}}.object()
	hand.Spec.NodeName = "ev-node"
	if _, err := b.client.CoreV1().Pods("default").Create(ctx, hand, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	refused := waitEvent(t, b.client, metav1.NamespaceDefault, "ev-node", gpushare.EventReasonAllocateRefused)
	if refused.Type != corev1.EventTypeWarning || !strings.Contains(refused.Note, "Allocate of [8] units refused") ||
		refused.Regarding.Kind != "Node" || refused.ReportingController != gpushare.EventControllerDevicePlugin {
		t.Errorf("refusal event %s %q on %s by %s", refused.Type, refused.Note, refused.Regarding.Kind, refused.ReportingController)
	}

	// Xid 62 is transient, but the bed's quiet period is minutes: only the fault shows here.
	if err := sim.InjectXid(a.GPUIndex, 62); err != nil {
		t.Fatal(err)
	}
	sick := waitEvent(t, b.client, metav1.NamespaceDefault, "ev-node", gpushare.EventReasonGPUUnhealthy)
	if wantPrefix := fmt.Sprintf("GPU %d (%s) is unhealthy: ", a.GPUIndex, gpu.UUID); sick.Type != corev1.EventTypeWarning || !strings.HasPrefix(sick.Note, wantPrefix) {
		t.Errorf("health event %s %q; want Warning starting %q", sick.Type, sick.Note, wantPrefix)
	}
	describe(t, b, "node", "ev-node")
}

// waitEvent polls the events.k8s.io API until an event of reason about the object with uid is in
// namespace, and returns it. Node events carry the node's name as their UID, as the kubelet's do.
func waitEvent(t *testing.T, client kubernetes.Interface, namespace string, uid types.UID, reason string) eventsv1.Event {
	t.Helper()
	var found eventsv1.Event
	pollUntil(t, waitLong, "event "+reason+" on "+string(uid), func() bool {
		list, err := client.EventsV1().Events(namespace).List(t.Context(), metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, ev := range list.Items {
			if ev.Regarding.UID == uid && ev.Reason == reason {
				found = ev
				return true
			}
		}
		return false
	})
	return found
}

// describe logs `kubectl describe` of an object when kubectl is installed: the sample that
// docs/operations.md shows.
func describe(t *testing.T, b *systemBed, kind, name string) {
	t.Helper()
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		return
	}
	kubeconfig, err := b.c.Kubeconfig("events-describe-"+kind, "e2e-admin", "system:masters")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(t.Context(), kubectl, "--kubeconfig", kubeconfig, "describe", kind, name).CombinedOutput()
	if err != nil {
		t.Logf("kubectl describe %s %s: %v", kind, name, err)
	}
	t.Logf("kubectl describe %s %s:\n%s", kind, name, out)
}
