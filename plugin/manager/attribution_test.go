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
}

func (p *podResources) List(context.Context, *podresourcesv1.ListPodResourcesRequest) (*podresourcesv1.ListPodResourcesResponse, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	resp := &podresourcesv1.ListPodResourcesResponse{}
	for key, ids := range p.holders {
		parts := strings.SplitN(key, "/", 3)
		resp.PodResources = append(resp.PodResources, &podresourcesv1.PodResources{Namespace: parts[0], Name: parts[1], Containers: []*podresourcesv1.ContainerResources{{
			Name: parts[2], Devices: []*podresourcesv1.ContainerDevices{{ResourceName: string(gpushare.ResourceName), DeviceIds: ids}},
		}}})
	}
	return resp, nil
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
