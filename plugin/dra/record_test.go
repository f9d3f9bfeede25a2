package dra

import (
	"context"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/isolation"
)

// translatedPod is a pod as the webhook makes it: two containers naming requests gpu-0 and gpu-1
// of the claim entry gpushare-gpu-mem, resolved to claim.
func translatedPod(claim *resourceapi.ResourceClaim, node string, uid types.UID) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: claim.Namespace, Name: "web", UID: uid,
		Annotations: map[string]string{"team": "a"}}}
	p.Spec.NodeName = node
	for _, r := range []string{"gpu-0", "gpu-1"} {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "c-" + r,
			Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: gpushare.DRAPodClaimName, Request: r}}}})
	}
	p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "sidecar"})
	p.Status.ResourceClaimStatuses = []corev1.PodResourceClaimStatus{{Name: gpushare.DRAPodClaimName, ResourceClaimName: ptr.To(claim.Name)}}
	claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: p.Name, UID: p.UID}}
	return p
}

// TestPrepareWritesTheRecord: Prepare of a claim the webhook made writes the device-plugin mode's
// record on its pod (IDX, POD, DEV, ASSIGNED and each container's variables by its request), once;
// pods it does not describe are left alone.
func TestPrepareWritesTheRecord(t *testing.T) {
	base := simulated(t, "simulated:dgxh100")
	gpu := deviceOf(t, base[2])
	twoRequests := func(uid types.UID) *resourceapi.ResourceClaim {
		c := allocated(uid, "3Gi", gpu)
		second := allocated(uid, "2Gi", gpu).Status.Allocation.Devices.Results[0]
		second.Request = "gpu-1"
		c.Status.Allocation.Devices.Results[0].Request = "gpu-0"
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results, second)
		return c
	}
	for _, tc := range []struct {
		name  string
		pod   func(c *resourceapi.ResourceClaim) *corev1.Pod
		write bool
	}{
		{"translated", func(c *resourceapi.ResourceClaim) *corev1.Pod { return translatedPod(c, testNode, "pod-uid") }, true},
		{"another node", func(c *resourceapi.ResourceClaim) *corev1.Pod { return translatedPod(c, "node-b", "pod-uid") }, false},
		{"recreated under the name", func(c *resourceapi.ResourceClaim) *corev1.Pod {
			p := translatedPod(c, testNode, "pod-uid")
			p.UID = "another-uid"
			return p
		}, false},
		{"claim named by the pod itself", func(c *resourceapi.ResourceClaim) *corev1.Pod {
			p := translatedPod(c, testNode, "pod-uid")
			p.Status.ResourceClaimStatuses[0].Name = "mine"
			return p
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := twoRequests("uid-r")
			pod := tc.pod(c)
			client := fake.NewClientset(pod)
			drv := newTestDriver(t, base, newDirs(t), isolation.Status{Tier: gpushare.IsolationNone})
			drv.pods = client
			prepareOK(t, drv, c)
			got, err := client.CoreV1().Pods(pod.Namespace).Get(context.Background(), pod.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if !tc.write {
				if len(got.Annotations) != 1 {
					t.Errorf("annotations %v: want the pod's own only", got.Annotations)
				}
				return
			}
			want := map[string]string{"team": "a", gpushare.AnnotationGPUIndex: "2", gpushare.AnnotationPodUnits: "5",
				gpushare.AnnotationDevUnits: strconv.FormatUint(drv.capacity()[gpu], 10), gpushare.AnnotationAssigned: "true"}
			for k, v := range want {
				if got.Annotations[k] != v {
					t.Errorf("annotation %s=%q, want %q", k, got.Annotations[k], v)
				}
			}
			envs, err := gpushare.DecodeContainerEnvs(got.Annotations[gpushare.AnnotationContainerEnv])
			if err != nil || len(envs) != 2 || envs["c-gpu-0"].ContainerUnits != 3 || envs["c-gpu-1"].ContainerUnits != 2 || envs["c-gpu-1"].GPUIndex != 2 {
				t.Errorf("container record %v (%v): want c-gpu-0 3 and c-gpu-1 2 units on GPU 2", envs, err)
			}
			// Prepared again (the kubelet's retry, a restart): nothing left to write.
			before := len(client.Actions())
			prepareOK(t, drv, c)
			for _, a := range client.Actions()[before:] {
				if a.GetVerb() == "patch" {
					t.Errorf("second Prepare patched the pod again: %v", a)
				}
			}
		})
	}
}
