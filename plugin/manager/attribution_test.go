package manager_test

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/inventory"
	"github.com/gpushare/gpushare/plugin/manager"
)

// podResources is the kubelet's pod-resources API as a gRPC server on a unix socket; the test
// says which container holds which devices, as the kubelet would after an Allocate.
type podResources struct {
	podresourcesv1.UnimplementedPodResourcesListerServer
	mu      sync.Mutex
	holders map[string][]string // "namespace/pod/container" → device IDs
	listed  []string            // "namespace/pod" of pods listed with no devices
}

func (p *podResources) List(context.Context, *podresourcesv1.ListPodResourcesRequest) (*podresourcesv1.ListPodResourcesResponse, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	resp := &podresourcesv1.ListPodResourcesResponse{}
	for _, key := range p.listed {
		ns, name, _ := strings.Cut(key, "/")
		resp.PodResources = append(resp.PodResources, &podresourcesv1.PodResources{Namespace: ns, Name: name})
	}
	for key, ids := range p.holders {
		parts := strings.SplitN(key, "/", 3)
		resp.PodResources = append(resp.PodResources, &podresourcesv1.PodResources{Namespace: parts[0], Name: parts[1], Containers: []*podresourcesv1.ContainerResources{{
			Name: parts[2], Devices: []*podresourcesv1.ContainerDevices{{ResourceName: string(gpushare.ResourceName), DeviceIds: ids}},
		}}})
	}
	return resp, nil
}

// list makes the kubelet list pod ("namespace/pod") with no devices.
func (p *podResources) list(pod string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.listed = append(p.listed, pod)
}

func (p *podResources) hold(key string, ids []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.holders[key] = ids
}

func startPodResources(t *testing.T) (*podResources, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubelet.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	p := &podResources{holders: map[string][]string{}}
	srv := grpc.NewServer()
	podresourcesv1.RegisterPodResourcesListerServer(srv, p)
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	return p, path
}

// The kubelet's Allocate names no pod, and a restarted kubelet also calls for a pod being deleted
// (admitted again, its devices released before). The plugin must record what the kubelet did, as
// its pod-resources API shows it, not the pod it matched: otherwise an in-flight pod is marked
// served before its own call, and later calls are answered one pod off.
func TestAllocateRecordsTheContainerTheKubeletServed(t *testing.T) {
	ctx := t.Context()
	pr, sock := startPodResources(t)
	e := run(t, "simulated:dgxh100", func(c *manager.Config) { c.PodResourcesSocket = sock })
	e.kubelet.waitRegister(t)
	c := e.plugin(t)
	// first and second wait on GPU 2 with the same signature; first is older, so matched first.
	for _, name := range []string{"first", "second"} {
		if _, err := e.client.CoreV1().Pods("default").Create(ctx, gpuPod(name, 8, 2, 79), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	recorded := func(name string) bool {
		p, err := e.client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p.Annotations[gpushare.AnnotationAssigned] == "true"
	}
	waitRecorded := func(name string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !recorded(name) {
			if time.Now().After(deadline) {
				t.Fatalf("pod %s never recorded as served", name)
			}
			time.Sleep(20 * time.Millisecond) // poll pacing
		}
	}

	// 1. The kubelet gives the call to a pod that is not in flight (being deleted, say).
	req := allocReq(8)
	ids := req.ContainerRequests[0].DevicesIds
	if _, err := c.Allocate(ctx, req); err != nil {
		t.Fatal(err)
	}
	pr.hold("default/gone/main", ids)
	// 2. The next call is first's own: it must be matched to first again, not to second.
	req2 := reqOn(1, 8)
	resp, err := c.Allocate(ctx, req2)
	if err != nil || resp.ContainerResponses[0].Envs[gpushare.EnvGPUIndex] != "2" {
		t.Fatalf("Allocate = %v, %v", resp, err)
	}
	if recorded("first") || recorded("second") {
		t.Fatal("a pod was recorded as served for a call the kubelet gave to another pod")
	}
	// The kubelet shows second got this call, though the plugin matched first: second is recorded.
	pr.hold("default/second/main", req2.ContainerRequests[0].DevicesIds)
	waitRecorded("second")
	if recorded("first") {
		t.Fatal("first recorded though the kubelet has not served it")
	}
	// 3. first's call at last: matched to first (still waiting), and confirmed by the kubelet.
	req3 := reqOn(3, 8)
	if _, err := c.Allocate(ctx, req3); err != nil {
		t.Fatalf("first's own call refused: %v", err)
	}
	pr.hold("default/first/main", req3.ContainerRequests[0].DevicesIds)
	waitRecorded("first")
}

// reqOn is a call for n devices of GPU gpu (the kubelet picks any free IDs).
func reqOn(gpu, n int) *pluginapi.AllocateRequest {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = inventory.DeviceID(gpu, uint64(i))
	}
	return &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}}
}

// A kubelet restarted after an Allocate answer but before it kept the devices asks again for the
// same container. Kept as served, that container would be skipped and the call given the next
// waiting container of its size: a pod with two containers of one size on two GPUs ran the first
// on the second's GPU (TestSystemKubeletRestart in CI). Once the restarted kubelet lists the pod
// without those devices, the plugin serves the container again.
func TestRestartedKubeletAsksAgain(t *testing.T) {
	ctx := t.Context()
	pr, sock := startPodResources(t)
	e := run(t, "simulated:dgxh100", func(c *manager.Config) { c.PodResourcesSocket = sock })
	e.kubelet.waitRegister(t)
	split := gpuPod("split", 80, 2, 80)
	split.Spec.Containers = append(split.Spec.Containers, split.Spec.Containers[0])
	split.Spec.Containers[0].Resources.Limits[gpushare.ResourceName] = *resource.NewQuantity(40, resource.DecimalSI)
	split.Spec.Containers[1].Name = "second"
	split.Spec.Containers[1].Resources = corev1.ResourceRequirements{Limits: corev1.ResourceList{gpushare.ResourceName: *resource.NewQuantity(40, resource.DecimalSI)}}
	ann, err := gpushare.PodAssignment{GPUIndex: 2, PodUnits: 80, DevUnits: 80, AssumeTime: time.Now().UnixNano(),
		Allocation: gpushare.Allocation{0: {2: 40}, 1: {3: 40}}}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	split.Annotations = ann
	if _, err := e.client.CoreV1().Pods("default").Create(ctx, split, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if resp, err := e.plugin(t).Allocate(ctx, reqOn(0, 40)); err != nil || resp.ContainerResponses[0].Envs[gpushare.EnvGPUIndex] != "2" {
		t.Fatalf("first call = %v, %v; want the first container's GPU 2", resp, err)
	}
	// The kubelet restarts before it kept the devices, lists the pod again, and asks again.
	restartKubelet(t, e).waitRegister(t)
	pr.list("default/split")
	again := reqOn(1, 40)
	resp, err := e.plugin(t).Allocate(ctx, again)
	if err != nil || resp.ContainerResponses[0].Envs[gpushare.EnvGPUIndex] != "2" {
		t.Fatalf("the restarted kubelet's call for the first container = %v, %v; want GPU 2 again, not the second container's GPU 3", resp, err)
	}
	pr.hold("default/split/main", again.ContainerRequests[0].DevicesIds)
	if resp, err := e.plugin(t).Allocate(ctx, reqOn(4, 40)); err != nil || resp.ContainerResponses[0].Envs[gpushare.EnvGPUIndex] != "3" {
		t.Fatalf("the second container's call = %v, %v; want GPU 3", resp, err)
	}
}

// The kubelet gave a call the plugin matched to first to a pod that is not in flight (a pod being
// deleted, admitted again by a restarted kubelet), and that pod ended before the kubelet's next
// admission, which drops its devices first (UpdateAllocatedDevices): the pod-resources API never
// shows a holder, so the answer settles only after attributeTimeout. first's own call, coming at
// once, must wait for that and be served, not be refused on the stale mark after --allocate-wait:
// the soak's "no pod bound to node gpu-3 waits for a container of 8 GiB units" (seed
// 1796164238172663089).
func TestAllocateOutlastsAnAnswerNobodyHolds(t *testing.T) {
	ctx := t.Context()
	pr, sock := startPodResources(t)
	e := run(t, "simulated:dgxh100", func(c *manager.Config) {
		c.PodResourcesSocket = sock
		c.AllocateWait = manager.DefaultAllocateWait
	})
	e.kubelet.waitRegister(t)
	c := e.plugin(t)
	if _, err := e.client.CoreV1().Pods("default").Create(ctx, gpuPod("first", 8, 2, 79), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The call of the pod that left: the plugin can only match it to first.
	if resp, err := c.Allocate(ctx, allocReq(8)); err != nil || resp.ContainerResponses[0].Envs[gpushare.EnvGPUIndex] != "2" {
		t.Fatalf("the departed pod's call = %v, %v; want first's GPU 2", resp, err)
	}
	own := reqOn(1, 8)
	resp, err := c.Allocate(ctx, own)
	if err != nil || resp.ContainerResponses[0].Envs[gpushare.EnvGPUIndex] != "2" {
		t.Fatalf("first's own call = %v, %v; want GPU 2 once the answer nobody holds has settled", resp, err)
	}
	pr.hold("default/first/main", own.ContainerRequests[0].DevicesIds)
	deadline := time.Now().Add(10 * time.Second)
	for {
		p, err := e.client.CoreV1().Pods("default").Get(ctx, "first", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Annotations[gpushare.AnnotationAssigned] == "true" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("first never recorded as served")
		}
		time.Sleep(20 * time.Millisecond) // poll pacing
	}
}
