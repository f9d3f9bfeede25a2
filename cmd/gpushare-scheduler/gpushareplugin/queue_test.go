package gpushareplugin

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

func gpuPod(uid string, units int64, assigned string, phase corev1.PodPhase) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: uid, Namespace: "default", UID: types.UID(uid)}, Status: corev1.PodStatus{Phase: phase}}
	p.Spec.Containers = []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{}}}}
	if units > 0 {
		p.Spec.Containers[0].Resources.Limits[gpushare.ResourceName] = *resource.NewQuantity(units, resource.DecimalSI)
	}
	if assigned != "" {
		p.Annotations = map[string]string{gpushare.AnnotationAssigned: assigned}
	}
	return p
}

// The hint queues a held pod exactly on the changes that can let it fit.
func TestGPUMemoryFreed(t *testing.T) {
	held := gpuPod("held", 8, "", corev1.PodPending)
	running := gpuPod("other", 8, "false", corev1.PodRunning)
	cases := []struct {
		name     string
		old, new *corev1.Pod
		want     fwk.QueueingHint
	}{
		{"allocated by the plugin: heard through the cache", running, gpuPod("other", 8, "true", corev1.PodRunning), fwk.QueueSkip},
		{"finished", running, gpuPod("other", 8, "false", corev1.PodSucceeded), fwk.Queue},
		{"deleted", running, nil, fwk.Queue},
		{"the held pod itself changed", held, gpuPod("held", 8, "", corev1.PodPending), fwk.Queue},
		{"a status change of a GPU pod", running, gpuPod("other", 8, "false", corev1.PodRunning), fwk.QueueSkip},
		{"a pod without gpu-mem finished", gpuPod("cpu", 0, "", corev1.PodRunning), gpuPod("cpu", 0, "", corev1.PodSucceeded), fwk.QueueSkip},
		{"a pod without gpu-mem deleted", gpuPod("cpu", 0, "", corev1.PodRunning), nil, fwk.QueueSkip},
	}
	for _, c := range cases {
		var oldObj, newObj any
		if c.old != nil {
			oldObj = c.old
		}
		if c.new != nil {
			newObj = c.new
		}
		if got, err := gpuMemoryFreed(klog.Background(), held, oldObj, newObj); err != nil || got != c.want {
			t.Errorf("%s: hint %v, %v; want %v", c.name, got, err, c.want)
		}
	}
}
