package cache

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
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
	p.Annotations[gpushare.AnnotationIsolation] = "mps"
	p.Annotations[gpushare.AnnotationComputePercent] = "40"
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

func TestPodRecord(t *testing.T) {
	full := fullPod("p", "n1")
	obj, err := compactPod(full.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	got := obj.(*PodRecord)

	// What every reader uses is the same as on the pod.
	wantReq, err := allocator.NewRequest(full)
	if err != nil {
		t.Fatal(err)
	}
	if gotReq, err := got.Request(); err != nil || !reflect.DeepEqual(gotReq, wantReq) {
		t.Fatalf("request of the record %+v, %v; want %+v", gotReq, err, wantReq)
	}
	if wantReq.Units != 6 || len(wantReq.Containers) != 3 || wantReq.Isolation.Tier() != gpushare.IsolationMPS || wantReq.Isolation.ComputePercent() != 40 {
		t.Fatalf("the test pod's request %+v: want 6 units (the init peak) in 3 containers, mps at 40%%", wantReq)
	}
	c := &Cache{}
	wantState, _ := c.podStateOf(RecordOf(full))
	gotState, _ := c.podStateOf(got)
	if wantState == nil || !reflect.DeepEqual(gotState, wantState) || wantState.node != "n1" || wantState.placement.Home != 1 {
		t.Fatalf("charge of the record %+v, want %+v on n1 GPU 1", gotState, wantState)
	}
	want := &PodRecord{
		Namespace: "default", Name: "p", UID: full.UID, ResourceVersion: "12345", NodeName: "n1",
		Phase: corev1.PodRunning, Terminating: true, Requests: wantReq.Containers, NamesGPUMem: true,
		Isolation: wantReq.Isolation, Annotations: map[string]string{},
	}
	for _, k := range []string{gpushare.AnnotationGPUIndex, gpushare.AnnotationPodUnits, gpushare.AnnotationDevUnits,
		gpushare.AnnotationAssigned, gpushare.AnnotationAssumeTime, gpushare.AnnotationContainerEnv} {
		want.Annotations[k] = full.Annotations[k]
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("record\n%+v\nwant\n%+v", got, want)
	}

	// Idempotent, as client-go requires: a tombstone's object may come again.
	if again, err := compactPod(got); err != nil || again != any(got) {
		t.Errorf("compacting a record gave %+v, %v", again, err)
	}
	// Anything but a pod passes untouched.
	tomb := toolscache.DeletedFinalStateUnknown{Key: "default/p", Obj: got}
	if out, err := compactPod(tomb); err != nil || !reflect.DeepEqual(out, tomb) {
		t.Errorf("tombstone changed: %+v, %v", out, err)
	}
	// A pod that requests nothing could have been evicted for GPU memory alone.
	if out, err := compactPod(&corev1.Pod{}); err != nil || !reflect.DeepEqual(out, &PodRecord{GPUMemOnly: true}) {
		t.Errorf("empty pod: %+v, %v", out, err)
	}
}

// The informer's machinery keys records, compares their versions and may
// deep-copy them (the mutation detector).
func TestPodRecordObject(t *testing.T) {
	rec := RecordOf(fullPod("p", "n1"))
	for _, key := range []toolscache.KeyFunc{toolscache.MetaNamespaceKeyFunc, toolscache.DeletionHandlingMetaNamespaceKeyFunc} {
		if k, err := key(rec); err != nil || k != "default/p" {
			t.Errorf("key = %q, %v", k, err)
		}
	}
	if k, err := toolscache.DeletionHandlingMetaNamespaceKeyFunc(toolscache.DeletedFinalStateUnknown{Key: "default/p", Obj: rec}); err != nil || k != "default/p" {
		t.Errorf("tombstone key = %q, %v", k, err)
	}
	m, err := meta.Accessor(rec)
	if err != nil || m.GetResourceVersion() != "12345" || m.GetUID() != rec.UID || m.GetDeletionTimestamp() == nil {
		t.Fatalf("accessor %+v, %v", m, err)
	}
	var _ runtime.Object = rec
	cp := rec.DeepCopyObject().(*PodRecord)
	if !reflect.DeepEqual(cp, rec) {
		t.Fatalf("copy %+v, want %+v", cp, rec)
	}
	cp.Annotations[gpushare.AnnotationGPUIndex] = "7"
	cp.Requests[0].Units = 99
	if rec.Annotations[gpushare.AnnotationGPUIndex] != "1" || rec.Requests[0].Units == 99 {
		t.Fatal("the copy shares maps or slices with the original")
	}
	store := toolscache.NewStore(toolscache.DeletionHandlingMetaNamespaceKeyFunc)
	if err := store.Add(rec); err != nil {
		t.Fatal(err)
	}
	if obj, ok, err := store.GetByKey("default/p"); err != nil || !ok || obj != any(rec) {
		t.Fatalf("store lookup %v, %v, %v", obj, ok, err)
	}
}

// A sidecar (an init container with restartPolicy Always) runs beside the
// regular containers; the record keeps that, and the request is the pod's.
func TestPodRecordSidecar(t *testing.T) {
	always := corev1.ContainerRestartPolicyAlways
	pod := Pod("p", "n1", 0, true, 4)
	pod.Spec.InitContainers = []corev1.Container{
		{Name: "init", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{gpushare.ResourceName: resource.MustParse("5")}}},
		{Name: "proxy", RestartPolicy: &always, Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{gpushare.ResourceName: resource.MustParse("2")}}},
		{Name: "cpu-only"},
	}
	rec := RecordOf(pod)
	want := []gpushare.ContainerRequest{
		{Name: "init", Index: 0, Init: true, Units: 5},
		{Name: "proxy", Index: 1, Init: true, Sidecar: true, Units: 2},
		{Name: "c0", Index: 0, Units: 4},
	}
	if !reflect.DeepEqual(rec.Requests, want) {
		t.Fatalf("requests %+v, want %+v", rec.Requests, want)
	}
	r, err := rec.Request()
	wantReq, _ := allocator.NewRequest(pod)
	if err != nil || r.Units != 6 || !reflect.DeepEqual(r, wantReq) {
		t.Fatalf("request %+v, %v; want 6 units (4 + the sidecar's 2), as %+v", r, err, wantReq)
	}
}

// An invalid request is kept as its error: the pod is still not charged, for
// the same reason, and the binder reports the same error.
func TestPodRecordInvalidRequest(t *testing.T) {
	pod := Pod("p", "n1", 0, true, 4)
	pod.Spec.Containers[0].Resources.Limits[gpushare.ResourceName] = resource.MustParse("1500m")
	_, want := allocator.NewRequest(pod)
	if want == nil {
		t.Fatal("the test pod's request is valid")
	}
	rec := RecordOf(pod)
	if _, err := rec.Request(); err == nil || err.Error() != want.Error() || !errors.Is(err, gpushare.ErrInvalidRequest) {
		t.Fatalf("Request() error %v, want %v", err, want)
	}
	if ps, reason := (&Cache{}).podStateOf(rec); ps != nil || reason != want.Error() {
		t.Fatalf("podStateOf = %+v, %q; want no charge for %q", ps, reason, want)
	}
	// Unbound, it is not read at all, as before.
	pod.Spec.NodeName = ""
	if ps, reason := (&Cache{}).podStateOf(RecordOf(pod)); ps != nil || reason != "" {
		t.Fatalf("unbound podStateOf = %+v, %q", ps, reason)
	}
}

// Isolation annotations that cannot be read keep a pod from being placed
// (Request fails, as for an invalid request), but a bound pod stays charged
// (they may have been edited after it started) and, in flight, holds back
// every pod of its sizes: its signature is unknown.
func TestPodRecordUnreadableIsolation(t *testing.T) {
	pod := Pod("p", "n1", 1, false, 4)
	pod.Annotations[gpushare.AnnotationComputePercent] = "thirty"
	_, want := allocator.NewRequest(pod)
	if !errors.Is(want, gpushare.ErrInvalidIsolation) {
		t.Fatalf("the test pod reads as %v; want ErrInvalidIsolation", want)
	}
	rec := RecordOf(pod)
	if _, err := rec.Request(); err == nil || err.Error() != want.Error() {
		t.Fatalf("Request() error %v, want %v", err, want)
	}
	if rec.Isolation.Readable() || len(rec.Requests) != 1 {
		t.Fatalf("record keeps isolation %v and requests %+v; want unreadable, and the request", rec.Isolation, rec.Requests)
	}
	ps, reason := (&Cache{}).podStateOf(rec)
	if ps == nil || reason != "" || ps.charges[1] != 4 || !ps.inFlight || ps.req.Isolation.Readable() {
		t.Fatalf("podStateOf = %+v, %q; want 4 units charged on GPU 1, in flight, isolation unreadable", ps, reason)
	}
	// An invalid request as well: the request's error, and no charge, as before tiers.
	pod.Spec.Containers[0].Resources.Limits[gpushare.ResourceName] = resource.MustParse("1500m")
	rec = RecordOf(pod)
	if _, err := rec.Request(); !errors.Is(err, gpushare.ErrInvalidRequest) {
		t.Fatalf("Request() error %v, want the request's", err)
	}
	if ps, reason := (&Cache{}).podStateOf(rec); ps != nil || reason == "" {
		t.Fatalf("podStateOf = %+v, %q; want no charge, with the request's reason", ps, reason)
	}
}

// The record is kept for every unfinished pod of the cluster: the isolation
// annotations went into padding, and it must not grow without a reason.
func TestPodRecordSize(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("sizes are for 64-bit platforms")
	}
	if got := unsafe.Sizeof(PodRecord{}); got > 160 {
		t.Fatalf("PodRecord is %d bytes, was 160: keep it compact (BenchmarkPodStoreMemory) or update this bound with the reason", got)
	}
}

// Deleting through a tombstone works whether it holds the record the store
// had or a whole pod.
func TestPodRecordTombstone(t *testing.T) {
	f := start(t, Node("n1", 32, 2, nil))
	for _, obj := range []any{RecordOf(Pod("p", "n1", 1, true, 3)), Pod("p", "n1", 1, true, 3)} {
		f.cache.upsertPod(obj, false)
		f.waitUsed("n1", 0, 3)
		f.cache.deletePod(toolscache.DeletedFinalStateUnknown{Key: "default/p", Obj: obj})
		f.waitUsed("n1", 0, 0)
	}
}

// The informer's store holds records; the API server's copy (the fake
// clientset's) is untouched, and the binder's reads still work.
func TestInformerStoresRecords(t *testing.T) {
	full := fullPod("p", "n1")
	full.DeletionTimestamp = nil
	f := start(t, Node("n1", 64, 4, nil), full)
	f.waitUsed("n1", 0, 6, 0, 0)
	got, ok := f.cache.Pod("default", "p")
	if !ok || got.UID != full.UID || got.NodeName != "n1" || got.Annotations[gpushare.AnnotationGPUIndex] != "1" || len(got.Requests) != 3 {
		t.Fatalf("informer pod %+v, %v; want its record, with the assignment", got, ok)
	}
	if _, ok := f.cache.Pod("default", "nope"); ok {
		t.Fatal("unknown pod found")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	api, err := f.client.CoreV1().Pods("default").Get(ctx, "p", metav1.GetOptions{})
	if err != nil || api.ManagedFields == nil || api.Spec.Containers[0].Env == nil {
		t.Fatalf("the API server's copy changed: %+v, %v", api, err)
	}
	// An update reaches the cache through the record.
	api.Status.Phase = corev1.PodSucceeded
	if _, err := f.client.CoreV1().Pods("default").UpdateStatus(ctx, api, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitUsed("n1", 0, 0, 0, 0)
}

// trimmedPod is the pod informer's transform before PodRecord: the pod kept,
// trimmed to what the extender reads. Kept here only to measure against.
func trimmedPod(pod *corev1.Pod) {
	pod.ObjectMeta = metav1.ObjectMeta{
		Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID, ResourceVersion: pod.ResourceVersion,
		DeletionTimestamp: pod.DeletionTimestamp, Annotations: keptAnnotations(pod.Annotations),
	}
	trim := func(in []corev1.Container) []corev1.Container {
		out := make([]corev1.Container, len(in))
		for i, c := range in {
			out[i] = corev1.Container{Name: c.Name, RestartPolicy: c.RestartPolicy}
			if q, ok := c.Resources.Limits[gpushare.ResourceName]; ok {
				out[i].Resources.Limits = corev1.ResourceList{gpushare.ResourceName: q}
			} else if q, ok := c.Resources.Requests[gpushare.ResourceName]; ok {
				out[i].Resources.Requests = corev1.ResourceList{gpushare.ResourceName: q}
			}
		}
		return out
	}
	pod.Spec = corev1.PodSpec{NodeName: pod.Spec.NodeName, InitContainers: trim(pod.Spec.InitContainers), Containers: trim(pod.Spec.Containers)}
	pod.Status = corev1.PodStatus{Phase: pod.Status.Phase}
}

// BenchmarkPodStoreMemory reports the live heap of 50,000 typical pods
// (benchPod) as decoded from the API server's JSON and kept as the store
// would: whole, trimmed (the transform before PodRecord), or as the
// PodRecord the pod informer keeps now; in MiB-live and bytes/pod.
// go test -run '^$' -bench PodStoreMemory -benchtime=1x ./extender/cache
func BenchmarkPodStoreMemory(b *testing.B) {
	const pods = 50000
	raw, err := json.Marshal(benchPod())
	if err != nil {
		b.Fatal(err)
	}
	keep := map[string]func(*corev1.Pod) any{
		"whole":   func(p *corev1.Pod) any { return p },
		"trimmed": func(p *corev1.Pod) any { trimmedPod(p); return p },
		"record":  func(p *corev1.Pod) any { return RecordOf(p) },
	}
	for _, name := range []string{"whole", "trimmed", "record"} {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				before := heapInUse()
				store := make([]any, 0, pods)
				b.StartTimer()
				for range pods {
					p := &corev1.Pod{}
					if err := json.Unmarshal(raw, p); err != nil {
						b.Fatal(err)
					}
					store = append(store, keep[name](p))
				}
				b.StopTimer()
				live := heapInUse() - before
				b.ReportMetric(float64(live)/(1<<20), "MiB-live")
				b.ReportMetric(float64(live)/pods, "bytes/pod")
				b.ReportMetric(float64(len(raw)), "json-bytes/pod")
				b.StartTimer()
				_ = store[len(store)-1]
			}
		})
	}
}
