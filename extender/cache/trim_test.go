package cache

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

// fullPod is a bound pod as the API server returns it: managed fields,
// kubectl's last-applied annotation, environment, volumes, probes, a
// sidecar and an init container asking for gpu-mem, and a status.
func fullPod(name, node string) *corev1.Pod {
	p := Pod(name, node, -1, false, 4, 0)
	a, err := gpushare.PodAssignment{GPUIndex: 1, PodUnits: 6, DevUnits: 16, AssumeTime: 1}.Encode()
	if err != nil {
		panic(err)
	}
	p.Annotations = a
	always := corev1.ContainerRestartPolicyAlways
	now := metav1.Now()
	p.ResourceVersion = "12345"
	p.Labels = map[string]string{"app": "train", "pod-template-hash": "5d8f7c9b6d"}
	p.Annotations["kubectl.kubernetes.io/last-applied-configuration"] = `{"apiVersion":"v1","kind":"Pod","spec":{"containers":[]}}`
	p.Annotations[gpushare.AnnotationContainerEnv] = "{}"
	p.GenerateName = name[:1] + "-"
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "train-5d8f7c9b6d", UID: "rs"}}
	p.ManagedFields = []metav1.ManagedFieldsEntry{{
		Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", Time: &now,
		FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:metadata":{"f:labels":{".":{},"f:app":{}}}}`)},
	}}
	p.CreationTimestamp = now
	for i := range p.Spec.Containers {
		c := &p.Spec.Containers[i]
		c.Image = "registry.example.com/train:v1"
		c.Command = []string{"python", "train.py"}
		c.Env = []corev1.EnvVar{{Name: "EPOCHS", Value: "10"}}
		c.VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
		c.LivenessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"true"}}}}
		c.Resources.Limits[corev1.ResourceCPU] = resource.MustParse("2")
		c.Resources.Requests = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}
	}
	p.Spec.Containers[1].Resources.Requests[gpushare.ResourceName] = resource.MustParse("0")
	p.Spec.InitContainers = []corev1.Container{
		{Name: "fetch", Image: "busybox", Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{gpushare.ResourceName: resource.MustParse("6")}}},
		{Name: "sidecar", Image: "envoy", RestartPolicy: &always, Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{gpushare.ResourceName: resource.MustParse("1")}}},
	}
	p.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	p.Spec.SchedulerName = "default-scheduler"
	p.Spec.Tolerations = []corev1.Toleration{{Key: "gpu", Operator: corev1.TolerationOpExists}}
	p.DeletionTimestamp = &now
	p.Status.Phase = corev1.PodRunning
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "c0", Ready: true, Image: "registry.example.com/train:v1"}}
	p.Status.PodIP = "10.0.0.7"
	return p
}

func TestTrimPod(t *testing.T) {
	full := fullPod("p", "n1")
	obj, err := trimPod(full.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	got := obj.(*corev1.Pod)

	// What every reader uses is the same on the trimmed pod.
	wantReq, err := allocator.NewRequest(full)
	if err != nil {
		t.Fatal(err)
	}
	if gotReq, err := allocator.NewRequest(got); err != nil || !reflect.DeepEqual(gotReq, wantReq) {
		t.Fatalf("request of the trimmed pod %+v, %v; want %+v", gotReq, err, wantReq)
	}
	if wantReq.Units != 6 || len(wantReq.Containers) != 3 {
		t.Fatalf("the test pod's request %+v: want 6 units (the init peak) in 3 containers", wantReq)
	}
	c := &Cache{}
	wantState, _ := c.podStateOf(full)
	gotState, _ := c.podStateOf(got)
	if wantState == nil || !reflect.DeepEqual(gotState, wantState) {
		t.Fatalf("charge of the trimmed pod %+v, want %+v", gotState, wantState)
	}
	if got.Name != "p" || got.Namespace != "default" || got.UID != full.UID || got.ResourceVersion != "12345" ||
		got.DeletionTimestamp == nil || got.Spec.NodeName != "n1" || got.Status.Phase != corev1.PodRunning {
		t.Fatalf("identity, node or phase lost: %+v", got)
	}
	for _, k := range []string{gpushare.AnnotationGPUIndex, gpushare.AnnotationPodUnits, gpushare.AnnotationDevUnits,
		gpushare.AnnotationAssumeTime, gpushare.AnnotationContainerEnv} {
		if got.Annotations[k] != full.Annotations[k] {
			t.Errorf("annotation %s = %q, want %q", k, got.Annotations[k], full.Annotations[k])
		}
	}
	if len(got.Spec.Containers) != 2 || got.Spec.Containers[1].Name != "c1" || len(got.Spec.InitContainers) != 2 ||
		got.Spec.InitContainers[1].RestartPolicy == nil {
		t.Fatalf("containers not kept in order with their names and restart policies: %+v", got.Spec)
	}

	// What nobody reads is gone.
	if got.ManagedFields != nil || got.Labels != nil || got.OwnerReferences != nil || got.GenerateName != "" {
		t.Errorf("metadata kept: %+v", got.ObjectMeta)
	}
	if _, ok := got.Annotations["kubectl.kubernetes.io/last-applied-configuration"]; ok {
		t.Error("last-applied-configuration kept")
	}
	if got.Spec.Volumes != nil || got.Spec.Tolerations != nil || got.Spec.SchedulerName != "" {
		t.Errorf("spec kept: %+v", got.Spec)
	}
	for _, ctr := range append(got.Spec.InitContainers, got.Spec.Containers...) {
		if ctr.Image != "" || ctr.Command != nil || ctr.Env != nil || ctr.VolumeMounts != nil || ctr.LivenessProbe != nil {
			t.Errorf("container %s kept more than its name, gpu-mem and restart policy: %+v", ctr.Name, ctr)
		}
		if len(ctr.Resources.Limits)+len(ctr.Resources.Requests) > 1 {
			t.Errorf("container %s kept more than the gpu-mem amount that counts: %+v", ctr.Name, ctr.Resources)
		}
	}
	if !reflect.DeepEqual(got.Status, corev1.PodStatus{Phase: corev1.PodRunning}) {
		t.Errorf("status kept: %+v", got.Status)
	}

	// Idempotent, as client-go requires: a tombstone's object may come again.
	again, _ := trimPod(got.DeepCopy())
	if !reflect.DeepEqual(again, got) {
		t.Errorf("trimming twice differs:\n%+v\n%+v", again, got)
	}
	// Anything but a pod passes untouched.
	tomb := toolscache.DeletedFinalStateUnknown{Key: "default/p", Obj: full}
	if out, err := trimPod(tomb); err != nil || !reflect.DeepEqual(out, tomb) {
		t.Errorf("tombstone changed: %+v, %v", out, err)
	}
	bare := &corev1.Pod{}
	if out, err := trimPod(bare); err != nil || !reflect.DeepEqual(out, &corev1.Pod{}) {
		t.Errorf("empty pod: %+v, %v", out, err)
	}
}

// The informer's store holds trimmed pods; the API server's copy (the fake
// clientset's) is untouched, and the binder's reads still work.
func TestInformerTrimsPods(t *testing.T) {
	full := fullPod("p", "n1")
	full.DeletionTimestamp = nil
	f := start(t, Node("n1", 64, 4, nil), full)
	f.waitUsed("n1", 0, 6, 0, 0)
	got, ok := f.cache.Pod("default", "p")
	if !ok || got.ManagedFields != nil || got.Spec.Containers[0].Env != nil || got.Annotations[gpushare.AnnotationGPUIndex] != "1" {
		t.Fatalf("informer pod %+v, %v; want it trimmed, with the assignment", got, ok)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	api, err := f.client.CoreV1().Pods("default").Get(ctx, "p", metav1.GetOptions{})
	if err != nil || api.ManagedFields == nil || api.Spec.Containers[0].Env == nil {
		t.Fatalf("the API server's copy changed: %+v, %v", api, err)
	}
}

// benchPod is a typical pod of a GPU job as the API server returns it: one
// container asking for gpu-mem, a log shipper, an init container, five
// managed-fields entries, kubectl's last-applied annotation and a status.
func benchPod() *corev1.Pod {
	p := fullPod("p", "node-00000")
	p.DeletionTimestamp = nil
	p.Spec.InitContainers = p.Spec.InitContainers[:1]
	p.Spec.InitContainers[0].Resources = corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}}
	delete(p.Spec.Containers[1].Resources.Limits, gpushare.ResourceName)
	delete(p.Spec.Containers[1].Resources.Requests, gpushare.ResourceName)
	p.Spec.Containers[1].Name = "log-shipper"
	last, err := json.Marshal(p.Spec)
	if err != nil {
		panic(err)
	}
	p.Annotations["kubectl.kubernetes.io/last-applied-configuration"] = string(last)
	for _, c := range p.Spec.Containers {
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{
			Name: c.Name, Ready: true, Image: c.Image, ImageID: "registry.example.com/train@sha256:0123456789abcdef0123456789abcdef",
			ContainerID: "containerd://0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
		})
	}
	for i := range 5 { // kube-controller-manager, kubelet, the scheduler, kubectl, an operator
		e := p.ManagedFields[0]
		e.Manager = fmt.Sprintf("manager-%d", i)
		fields := `{"f:spec":{"f:containers":{`
		for j := range 30 { // about 700 bytes, as a real entry
			fields += fmt.Sprintf(`"f:field%02d":{},`, j)
		}
		e.FieldsV1 = &metav1.FieldsV1{Raw: []byte(fields + `".":{}}}}`)}
		p.ManagedFields = append(p.ManagedFields, e)
	}
	return p
}

// BenchmarkPodStoreMemory reports the live heap of 50,000 typical pods
// (benchPod) as decoded from the API server's JSON, kept whole (trim=false)
// or as the pod informer keeps them (trim=true), in MiB-live.
// go test -run '^$' -bench PodStoreMemory -benchtime=1x ./extender/cache
func BenchmarkPodStoreMemory(b *testing.B) {
	const pods = 50000
	raw, err := json.Marshal(benchPod())
	if err != nil {
		b.Fatal(err)
	}
	for _, trim := range []bool{false, true} {
		b.Run(fmt.Sprintf("trim=%v", trim), func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				before := heapInUse()
				store := make([]*corev1.Pod, 0, pods)
				b.StartTimer()
				for range pods {
					p := &corev1.Pod{}
					if err := json.Unmarshal(raw, p); err != nil {
						b.Fatal(err)
					}
					if trim {
						if _, err := trimPod(p); err != nil {
							b.Fatal(err)
						}
					}
					store = append(store, p)
				}
				b.StopTimer()
				live := heapInUse() - before
				b.ReportMetric(float64(live)/(1<<20), "MiB-live")
				b.ReportMetric(float64(len(raw)), "json-bytes/pod")
				b.StartTimer()
				_ = store[len(store)-1]
			}
		})
	}
}
