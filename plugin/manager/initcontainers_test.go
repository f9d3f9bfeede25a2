package manager_test

import (
	"context"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/manager"
)

// kubeletPodResources answers List as the kubelet's pod-resources server
// does (pkg/kubelet/apis/podresources/server_v1.go, Kubernetes v1.37.2): per
// pod, its restartable (sidecar) init containers, then its regular
// containers. Plain init containers are left out, though the device manager
// holds devices for them.
type kubeletPodResources struct {
	podresourcesv1.UnimplementedPodResourcesListerServer
	mu   sync.Mutex
	pods []*corev1.Pod
	devs map[string][]string // "namespace/pod/container" → device IDs
}

func (k *kubeletPodResources) List(context.Context, *podresourcesv1.ListPodResourcesRequest) (*podresourcesv1.ListPodResourcesResponse, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	resp := &podresourcesv1.ListPodResourcesResponse{}
	for _, p := range k.pods {
		pr := &podresourcesv1.PodResources{Namespace: p.Namespace, Name: p.Name}
		var listed []corev1.Container
		for _, c := range p.Spec.InitContainers {
			if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
				listed = append(listed, c)
			}
		}
		for _, c := range append(listed, p.Spec.Containers...) {
			cr := &podresourcesv1.ContainerResources{Name: c.Name}
			if ids := k.devs[p.Namespace+"/"+p.Name+"/"+c.Name]; len(ids) > 0 {
				cr.Devices = []*podresourcesv1.ContainerDevices{{ResourceName: string(gpushare.ResourceName), DeviceIds: ids}}
			}
			pr.Containers = append(pr.Containers, cr)
		}
		resp.PodResources = append(resp.PodResources, pr)
	}
	return resp, nil
}

// admit records what the kubelet's device manager holds for pod: devs by container name.
func (k *kubeletPodResources) admit(pod *corev1.Pod, devs map[string][]string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.pods = append(k.pods, pod)
	for c, ids := range devs {
		k.devs[pod.Namespace+"/"+pod.Name+"/"+c] = ids
	}
}

func startKubeletPodResources(t *testing.T) (*kubeletPodResources, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubelet.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	k := &kubeletPodResources{devs: map[string][]string{}}
	srv := grpc.NewServer()
	podresourcesv1.RegisterPodResourcesListerServer(srv, k)
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	return k, path
}

// withInit adds a plain init container of units gpu-mem units before the
// pod's containers and re-annotates it, as the extender would, on gpu.
func withInit(p *corev1.Pod, units int64, mainUnits int64) *corev1.Pod {
	p.Spec.InitContainers = []corev1.Container{{Name: "init", Resources: corev1.ResourceRequirements{
		Limits: corev1.ResourceList{gpushare.ResourceName: *resource.NewQuantity(units, resource.DecimalSI)},
	}}}
	if mainUnits == 0 {
		p.Spec.Containers[0].Resources.Limits = nil
	}
	reqs, err := gpushare.ContainerRequests(p)
	if err != nil {
		panic(err)
	}
	asg, _, err := gpushare.DecodePodAssignment(p.Annotations)
	if err != nil {
		panic(err)
	}
	asg.PodUnits = gpushare.PodUnits(reqs)
	asg.Allocation = gpushare.AllocationForGPU(reqs, asg.GPUIndex)
	ann, err := asg.Encode()
	if err != nil {
		panic(err)
	}
	p.Annotations = ann
	return p
}

func podAnnotations(t *testing.T, client kubernetes.Interface, name string) map[string]string {
	t.Helper()
	p, err := client.CoreV1().Pods("default").Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p.Annotations
}

// waitAssigned polls until pod name is ASSIGNED=true, failing after 15 s.
func waitAssigned(t *testing.T, client kubernetes.Interface, name string) map[string]string {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		ann := podAnnotations(t, client, name)
		if ann[gpushare.AnnotationAssigned] == "true" {
			return ann
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s never ASSIGNED=true; annotations %v", name, ann)
		}
		time.Sleep(20 * time.Millisecond) // poll pacing
	}
}

// A pod whose plain init container and regular container both ask for
// gpu-mem: the kubelet lists only the regular one, holding devices it took
// over from the init container. Both must be recorded, and the pod released.
func TestInitContainerRecordedThroughItsPod(t *testing.T) {
	ctx := t.Context()
	kr, sock := startKubeletPodResources(t)
	e := run(t, "simulated:dgxh100", func(c *manager.Config) { c.PodResourcesSocket = sock })
	e.kubelet.waitRegister(t)
	c := e.plugin(t)
	pod := withInit(gpuPod("warm", 4, 2, 79), 4, 4)
	if _, err := e.client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The kubelet admits the pod: the init container first, then main,
	// which reuses the init container's devices.
	req := reqOn(0, 4)
	ids := req.ContainerRequests[0].DevicesIds
	for _, ctr := range []string{"init", "main"} {
		resp, err := c.Allocate(ctx, req)
		if err != nil || resp.ContainerResponses[0].Envs[gpushare.EnvGPUIndex] != "2" {
			t.Fatalf("Allocate for %s = %v, %v", ctr, resp, err)
		}
		kr.admit(pod, map[string][]string{ctr: ids})
	}
	ann := waitAssigned(t, e.client, "warm")
	rec, err := gpushare.DecodeContainerEnvs(ann[gpushare.AnnotationContainerEnv])
	if err != nil || len(rec) != 2 || rec["init"].GPUIndex != 2 || rec["main"].GPUIndex != 2 {
		t.Errorf("record = %v, %v; want init and main on GPU 2", rec, err)
	}
}

// Only the init container uses the GPU: nothing the kubelet lists holds its
// devices. Once the pod's status shows the init container started, the
// reconciler records it; a pod that has not started is left waiting.
func TestInitOnlyPodRecordedOnceStarted(t *testing.T) {
	ctx := t.Context()
	kr, sock := startKubeletPodResources(t)
	e := run(t, "simulated:dgxh100", func(c *manager.Config) { c.PodResourcesSocket = sock })
	e.kubelet.waitRegister(t)
	c := e.plugin(t)
	warm := withInit(gpuPod("warm", 4, 2, 79), 4, 0)
	waiting := gpuPod("waiting", 8, 3, 79)
	for _, p := range []*corev1.Pod{warm, waiting} {
		if _, err := e.client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	req := reqOn(0, 4)
	if _, err := c.Allocate(ctx, req); err != nil {
		t.Fatal(err)
	}
	kr.admit(warm, map[string][]string{"init": req.ContainerRequests[0].DevicesIds})
	// The init container runs (and will finish before main starts).
	started := warm.DeepCopy()
	started.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: "init",
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}}}
	if _, err := e.client.CoreV1().Pods("default").UpdateStatus(ctx, started, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	ann := waitAssigned(t, e.client, "warm")
	if rec, err := gpushare.DecodeContainerEnvs(ann[gpushare.AnnotationContainerEnv]); err != nil || rec["init"].GPUIndex != 2 || rec["init"].ContainerUnits != 4 {
		t.Errorf("record = %v, %v; want init on GPU 2 with 4 units", rec, err)
	}
	if got := podAnnotations(t, e.client, "waiting"); got[gpushare.AnnotationAssigned] == "true" || got[gpushare.AnnotationContainerEnv] != "" {
		t.Errorf("a pod no container of which has started was recorded: %v", got)
	}
	// Its own call still finds it waiting.
	if resp, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: reqOn(1, 8).ContainerRequests}); err != nil ||
		resp.ContainerResponses[0].Envs[gpushare.EnvGPUIndex] != "3" {
		t.Errorf("Allocate for waiting = %v, %v", resp, err)
	}
}

// A record lost for good (the plugin restarted between its answer and the
// record, say) is repaired from the pod's status: a running pod without any
// record becomes ASSIGNED=true with the environment its annotations name.
func TestReconcilerRepairsLostRecord(t *testing.T) {
	ctx := t.Context()
	_, sock := startKubeletPodResources(t)
	e := run(t, "simulated:dgxh100", func(c *manager.Config) { c.PodResourcesSocket = sock })
	e.kubelet.waitRegister(t)
	p := gpuPod("lost", 8, 5, 79)
	p.Status.Phase = corev1.PodRunning
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "main",
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}}}
	if _, err := e.client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ann := waitAssigned(t, e.client, "lost")
	rec, err := gpushare.DecodeContainerEnvs(ann[gpushare.AnnotationContainerEnv])
	// DevUnits is the GPU's own size, as Allocate answers it (an H100 of 80 GiB);
	// the tier is the node's, none by default.
	want := gpushare.ContainerEnv{GPUIndex: 5, PodUnits: 8, ContainerUnits: 8, DevUnits: 80, Isolation: gpushare.IsolationNone}
	if err != nil || rec["main"] != want {
		t.Errorf("record = %v, %v; want main = %+v", rec, err, want)
	}
}

// A hand-bound pod that would over-commit its GPU is refused with
// ResourceExhausted naming the GPU, and counted; a pod that fits is counted
// as allocated.
func TestAllocateOvercommitRefusedAndCounted(t *testing.T) {
	ctx := t.Context()
	reg := prometheus.NewRegistry()
	metrics, err := manager.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	e := run(t, "simulated:dgxh100", func(c *manager.Config) { c.Metrics = metrics })
	e.kubelet.waitRegister(t)
	c := e.plugin(t)
	running := gpuPod("running", 70, 4, 80)
	running.Annotations[gpushare.AnnotationAssigned] = "true"
	running.Status.Phase = corev1.PodRunning
	for _, p := range []*corev1.Pod{running, gpuPod("byhand", 30, 4, 80), gpuPod("fits", 10, 5, 80)} {
		if _, err := e.client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	_, err = c.Allocate(ctx, reqOn(0, 30))
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "GPU 4") || !strings.Contains(err.Error(), "default/running=70") {
		t.Fatalf("Allocate for byhand = %v; want ResourceExhausted naming GPU 4 and its holders", err)
	}
	if _, err := c.Allocate(ctx, reqOn(1, 10)); err != nil {
		t.Fatalf("Allocate for fits = %v", err)
	}
	want := `
# HELP gpushare_plugin_allocate_total Containers the kubelet asked Allocate for, by outcome: allocated, or refused as nomatch (no pod waits for one of that size), overcommit (its GPU would hold more than it has), invalid (a malformed request) or isolation (the node's isolation tier is down).
# TYPE gpushare_plugin_allocate_total counter
gpushare_plugin_allocate_total{outcome="allocated"} 1
gpushare_plugin_allocate_total{outcome="invalid"} 0
gpushare_plugin_allocate_total{outcome="isolation"} 0
gpushare_plugin_allocate_total{outcome="nomatch"} 0
gpushare_plugin_allocate_total{outcome="overcommit"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "gpushare_plugin_allocate_total"); err != nil {
		t.Error(err)
	}
}

// A pod the reconciler repairs leaves the candidates at once, before its
// record is seen: once the record is in the API, the extender may place a pod
// of the same size on another GPU, and a watch that lags (or a write whose
// answer was lost) must not let the repaired pod take that pod's call. Here
// every write of the repaired pod fails, so the plugin never sees its record.
func TestRepairedPodLeavesCandidatesAtOnce(t *testing.T) {
	ctx := t.Context()
	_, sock := startKubeletPodResources(t)
	e := run(t, "simulated:dgxh100", func(c *manager.Config) { c.PodResourcesSocket = sock })
	e.patchFaults.Set(func(pod string) error {
		if pod == "started" {
			return apierrors.NewServiceUnavailable("answer lost")
		}
		return nil
	})
	e.kubelet.waitRegister(t)
	c := e.plugin(t)
	started := gpuPod("started", 12, 1, 80)
	started.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "main",
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}}}
	if _, err := e.client.CoreV1().Pods("default").Create(ctx, started, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for e.patchFaults.Tries("started") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the reconciler never tried to record the started pod")
		}
		time.Sleep(20 * time.Millisecond) // poll pacing
	}
	// A pod of the same size on another GPU, placed once "started" was recorded.
	if _, err := e.client.CoreV1().Pods("default").Create(ctx, gpuPod("next", 12, 2, 80), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	resp, err := c.Allocate(ctx, reqOn(0, 12))
	if err != nil || resp.ContainerResponses[0].Envs[gpushare.EnvGPUIndex] != "2" {
		t.Fatalf("Allocate for next = %v, %v; want GPU 2 (the repaired pod must not take the call)", resp, err)
	}
}

// A container the pod's status proved served stays served when another
// answer, matched to it, turns out to be some other pod's: otherwise it
// would wait again, and take a later call, though its record may already
// be in the API (here its writes fail, so the plugin never sees the record).
func TestProvenContainerStaysServed(t *testing.T) {
	ctx := t.Context()
	pr, sock := startPodResources(t)
	e := run(t, "simulated:dgxh100", func(c *manager.Config) { c.PodResourcesSocket = sock })
	e.patchFaults.Set(func(pod string) error {
		if pod == "first" {
			return apierrors.NewServiceUnavailable("answer lost")
		}
		return nil
	})
	e.kubelet.waitRegister(t)
	c := e.plugin(t)
	first, second := gpuPod("first", 12, 1, 80), gpuPod("second", 12, 1, 80)
	second.Annotations[gpushare.AnnotationAssumeTime] = strconv.FormatInt(time.Now().Add(time.Hour).UnixNano(), 10)
	for _, p := range []*corev1.Pod{first, second} {
		if _, err := e.client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The kubelet serves second; the plugin matches first, the older.
	req := reqOn(0, 12)
	if _, err := c.Allocate(ctx, req); err != nil {
		t.Fatal(err)
	}
	// first's own call was answered long ago (before a restart, say): its status shows it running.
	running := first.DeepCopy()
	running.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "main",
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}}}
	if _, err := e.client.CoreV1().Pods("default").UpdateStatus(ctx, running, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for e.patchFaults.Tries("first") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the reconciler never tried to record first")
		}
		time.Sleep(20 * time.Millisecond) // poll pacing
	}
	// Now the kubelet shows the call went to second.
	pr.hold("default/second/main", req.ContainerRequests[0].DevicesIds)
	waitAssigned(t, e.client, "second")
	// Both are served: a third call of that size has no candidate.
	if resp, err := c.Allocate(ctx, reqOn(2, 12)); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("a third call = %v, %v; want FailedPrecondition (first was proven served)", resp, err)
	}
}
