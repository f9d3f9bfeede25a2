//go:build e2e

package e2e

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpushare/gpushare/plugin/dra/slice"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

// TestDRAHealthReachesPods: a fatal Xid on the GPU a running claim holds reaches the pod's status
// through the kubelet's real DRA manager (the driver's WatchHealthStatus stream): the container's
// allocatedResourcesStatus for its claim turns Unhealthy with the fault, while a pod on another GPU
// stays Healthy.
func TestDRAHealthReachesPods(t *testing.T) {
	t.Parallel()
	b := startDRABed(t)
	sim := simulator(t, "simulated:dgxh100")
	b.addNodeOn(t, "dra-health", sim, nil)
	b.createTemplates(t, claimTemplate("mem-70", 70, 0))
	b.createPods(t, claimPod("sick", "mem-70", ""), claimPod("well", "mem-70", ""))
	b.waitPodsRunning(t, waitLong, "sick", "well")
	sick, well := b.podAllocation(t, "sick"), b.podAllocation(t, "well")
	if sick.devices[0] == well.devices[0] {
		t.Fatalf("two 70 GiB claims on one GPU %s", sick.devices[0])
	}
	idx := -1
	for i, g := range b.nodes["dra-health"].gpus {
		if name, _ := slice.DeviceName(g.UUID); name == sick.devices[0] {
			idx = i
		}
	}
	if idx < 0 {
		t.Fatalf("device %s is none of the node's GPUs", sick.devices[0])
	}
	if err := sim.InjectXid(idx, 48); err != nil {
		t.Fatal(err)
	}
	health := func(pod string) (string, string) {
		p, err := b.client.CoreV1().Pods(b.claimNS).Get(t.Context(), pod, metav1.GetOptions{})
		if err != nil || len(p.Status.ContainerStatuses) == 0 {
			return "", fmt.Sprint(err)
		}
		for _, st := range p.Status.ContainerStatuses[0].AllocatedResourcesStatus {
			if st.Name == "claim:gpu" && len(st.Resources) > 0 {
				r := st.Resources[0]
				msg := ""
				if r.Message != nil {
					msg = *r.Message
				}
				return string(r.Health), msg
			}
		}
		return "", "no claim:gpu entry"
	}
	waitFor(t, waitLong, "the fault in pod sick's allocatedResourcesStatus", func() (bool, string) {
		h, msg := health("sick")
		return h == string(corev1.ResourceHealthStatusUnhealthy), h + " " + msg
	})
	if h, msg := health("sick"); msg != gpushare.DRATaintValueFatal+"-xid-48" {
		t.Errorf("pod sick: %s with message %q; want the fault's %q", h, msg, gpushare.DRATaintValueFatal+"-xid-48")
	}
	if h, msg := health("well"); h != string(corev1.ResourceHealthStatusHealthy) {
		t.Errorf("pod well on a healthy GPU: %q %s; want Healthy", h, msg)
	}
}
