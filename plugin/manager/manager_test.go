package manager_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/internal/fakeapi"
	"github.com/gpushare/gpushare/plugin/inventory"
	"github.com/gpushare/gpushare/plugin/manager"
	"github.com/gpushare/gpushare/plugin/nvml"
	"github.com/gpushare/gpushare/plugin/server"
)

const nodeName = "gpu-node"

// fakeKubelet is the registration peer (the real kubelet is in the e2e tests).
type fakeKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	got chan *pluginapi.RegisterRequest
	srv *grpc.Server
}

func (k *fakeKubelet) Register(_ context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.got <- r
	return &pluginapi.Empty{}, nil
}

func startFakeKubelet(t *testing.T, dir string) *fakeKubelet {
	t.Helper()
	l, err := net.Listen("unix", filepath.Join(dir, server.KubeletSocket))
	if err != nil {
		t.Fatal(err)
	}
	k := &fakeKubelet{got: make(chan *pluginapi.RegisterRequest, 10), srv: grpc.NewServer()}
	pluginapi.RegisterRegistrationServer(k.srv, k)
	go k.srv.Serve(l)
	t.Cleanup(k.srv.Stop)
	return k
}

func (k *fakeKubelet) waitRegister(t *testing.T) *pluginapi.RegisterRequest {
	t.Helper()
	select {
	case r := <-k.got:
		return r
	case <-time.After(20 * time.Second):
		t.Fatal("the plugin did not register")
		return nil
	}
}

// countingLibrary records WatchHealth calls.
type countingLibrary struct {
	nvml.Library
	watches atomic.Int32
}

func (c *countingLibrary) WatchHealth(ctx context.Context, o nvml.HealthOptions, ev chan<- nvml.HealthEvent) error {
	c.watches.Add(1)
	return c.Library.WatchHealth(ctx, o, ev)
}

type env struct {
	dir     string
	client  *fake.Clientset
	sim     *nvml.Simulator
	lib     *countingLibrary
	kubelet *fakeKubelet
	restart chan struct{}
	// registered receives after each registration the manager saw succeed.
	registered chan struct{}
	errc       chan error
	cancel     context.CancelFunc
	// patchFaults, when set, answers pod patches in its place (see enforceResourceVersion).
	patchFaults fakeapi.PatchFaults
	// podWatches holds the plugin's pod watch events while closed (a stalled watch).
	podWatches *watchGate
}

func run(t *testing.T, backend string, mutate func(*manager.Config)) *env {
	t.Helper()
	log := zaptest.NewLogger(t)
	sim, err := nvml.NewSimulator(log, backend)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Shutdown() })
	e := &env{
		dir:        t.TempDir(),
		client:     fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}),
		sim:        sim,
		lib:        &countingLibrary{Library: sim},
		restart:    make(chan struct{}),
		registered: make(chan struct{}, 100),
		errc:       make(chan error, 1),
	}
	// Before Run: reactors must not change under a running client.
	fakeapi.KeepResourceVersions(e.client, &e.patchFaults)
	e.podWatches = newWatchGate()
	gatePodWatches(e.client, e.podWatches)
	e.kubelet = startFakeKubelet(t, e.dir)
	cfg := manager.Config{
		Node: nodeName, Client: e.client, Library: e.lib, DevicePluginDir: e.dir,
		HealthCheck: true, HealthQuietPeriod: 500 * time.Millisecond, AllocateWait: 300 * time.Millisecond,
		Health: nvml.HealthOptions{WaitTimeout: 50 * time.Millisecond}, OnRegistered: func() { e.registered <- struct{}{} },
		Restart: e.restart, MinBackoff: 10 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, Logger: log,
	}
	if mutate != nil {
		mutate(&cfg)
	}
	m, err := manager.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.cancel = cancel
	go func() { e.errc <- m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-e.errc:
			if err != nil {
				t.Errorf("Run = %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Error("Run did not return after cancel")
		}
	})
	return e
}

// waitRegistered waits until the manager saw a registration succeed.
func (e *env) waitRegistered(t *testing.T) {
	t.Helper()
	select {
	case <-e.registered:
	case <-time.After(20 * time.Second):
		t.Fatal("the manager did not register")
	}
}

func (e *env) plugin(t *testing.T) pluginapi.DevicePluginClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+filepath.Join(e.dir, gpushare.DevicePluginSocket), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pluginapi.NewDevicePluginClient(conn)
}

func gpuPod(name string, units int64, gpu int, devUnits uint64) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name), CreationTimestamp: metav1.Now()},
		Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "main", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{gpushare.ResourceName: *resource.NewQuantity(units, resource.DecimalSI)},
		}}}},
		Status: corev1.PodStatus{Phase: corev1.PodPending},
	}
	ann, err := gpushare.PodAssignment{GPUIndex: gpu, PodUnits: uint64(units), DevUnits: devUnits, AssumeTime: time.Now().UnixNano(),
		Allocation: gpushare.Allocation{0: {gpu: uint64(units)}}}.Encode()
	if err != nil {
		panic(err)
	}
	p.Annotations = ann
	return p
}

func allocReq(n int) *pluginapi.AllocateRequest {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = inventory.DeviceID(0, uint64(i))
	}
	return &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}}
}

func TestRunPublishesRegistersAndAllocates(t *testing.T) {
	ctx := t.Context()
	e := run(t, "simulated:mixed", nil) // 2 × 80 GB and 2 × 40 GB
	r := e.kubelet.waitRegister(t)
	if r.ResourceName != string(gpushare.ResourceName) || r.Endpoint != gpushare.DevicePluginSocket || r.Version != pluginapi.Version {
		t.Errorf("RegisterRequest = %v", r)
	}
	node, err := e.client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if q := node.Status.Capacity[gpushare.ResourceCount]; q.Value() != 4 {
		t.Errorf("capacity gpu-count = %v; want 4", q.String())
	}
	if q := node.Status.Allocatable[gpushare.ResourceCount]; q.Value() != 4 {
		t.Errorf("allocatable gpu-count = %v; want 4", q.String())
	}
	desc, err := gpushare.DecodeNodeGPUs(node.Annotations[gpushare.AnnotationNodeGPUs])
	if err != nil {
		t.Fatal(err)
	}
	gpus, _ := e.sim.Devices()
	if !desc.Simulated || desc.Unit != gpushare.GiB || len(desc.GPUs) != 4 || desc.GPUs[2].UUID != gpus[2].UUID ||
		desc.GPUs[0].Units != gpus[0].MemoryMiB/1024 || desc.GPUs[2].Units != gpus[2].MemoryMiB/1024 || desc.GPUs[0].Units == desc.GPUs[2].Units {
		t.Errorf("node GPU description = %+v", desc)
	}
	for _, g := range desc.GPUs {
		if g.Isolation != gpushare.IsolationNone || g.IsolationReason != "" {
			t.Errorf("GPU %d published with tier %q (%q); want none, the default", g.Index, g.Isolation, g.IsolationReason)
		}
	}

	c := e.plugin(t)
	stream, err := c.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	list, err := stream.Recv()
	if err != nil || uint64(len(list.Devices)) != desc.TotalUnits() {
		t.Fatalf("ListAndWatch = %d devices, %v; want %d", len(list.GetDevices()), err, desc.TotalUnits())
	}

	// A pod the extender placed on GPU 2 gets GPU 2, whatever IDs the kubelet picked.
	if _, err := e.client.CoreV1().Pods("default").Create(ctx, gpuPod("p", 4, 2, desc.GPUs[2].Units), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	resp, err := c.Allocate(ctx, allocReq(4))
	if err != nil {
		t.Fatal(err)
	}
	got, err := gpushare.ParseContainerEnv(resp.ContainerResponses[0].Envs)
	want := gpushare.ContainerEnv{GPUIndex: 2, PodUnits: 4, ContainerUnits: 4, DevUnits: desc.GPUs[2].Units, Isolation: gpushare.IsolationNone}
	if err != nil || got != want {
		t.Errorf("env = %+v, %v; want %+v", got, err, want)
	}
	pod, err := e.client.CoreV1().Pods("default").Get(ctx, "p", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := gpushare.DecodeContainerEnvs(pod.Annotations[gpushare.AnnotationContainerEnv])
	if err != nil || rec["main"] != want || pod.Annotations[gpushare.AnnotationAssigned] != "true" {
		t.Errorf("pod annotations after Allocate = %v (%v)", pod.Annotations, err)
	}

	// The same size again: that pod is served, nobody else waits. A clear refusal after the wait.
	began := time.Now()
	_, err = c.Allocate(ctx, allocReq(4))
	if st, _ := status.FromError(err); st.Code() != codes.FailedPrecondition || !strings.Contains(st.Message(), "no pod bound to node") {
		t.Errorf("second Allocate = %v; want FailedPrecondition naming the problem", err)
	}
	if waited := time.Since(began); waited < 300*time.Millisecond {
		t.Errorf("refused after %v, before the allocate wait", waited)
	}
	if _, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"9-0"}}}}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("Allocate with a foreign device ID = %v; want InvalidArgument", err)
	}
	dup := &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"0-1", "0-1"}}}}
	if _, err := c.Allocate(ctx, dup); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "appears twice") {
		t.Errorf("Allocate with a repeated device ID = %v; want InvalidArgument", err)
	}
}

// A pod bound a moment before the kubelet's call is waited for.
func TestAllocateWaitsForJustBoundPod(t *testing.T) {
	ctx := t.Context()
	e := run(t, "simulated:dgxh100", func(c *manager.Config) { c.AllocateWait = 10 * time.Second })
	e.kubelet.waitRegister(t)
	c := e.plugin(t)
	type result struct {
		resp *pluginapi.AllocateResponse
		err  error
	}
	res := make(chan result, 1)
	go func() {
		r, err := c.Allocate(ctx, allocReq(8))
		res <- result{r, err}
	}()
	select {
	case r := <-res:
		t.Fatalf("Allocate answered before any pod existed: %v, %v", r.resp, r.err)
	case <-time.After(200 * time.Millisecond):
		// Not synchronisation: the call must still be waiting; it is what is asserted.
	}
	if _, err := e.client.CoreV1().Pods("default").Create(ctx, gpuPod("late", 8, 5, 79), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r := <-res
	if r.err != nil || r.resp.ContainerResponses[0].Envs[gpushare.EnvGPUIndex] != "5" {
		t.Fatalf("Allocate = %v, %v; want GPU 5", r.resp, r.err)
	}
}

func TestReRegistersWhenKubeletRestartsOrOnRequest(t *testing.T) {
	e := run(t, "simulated:dgxa100", nil)
	e.kubelet.waitRegister(t)
	e.waitRegistered(t)

	// A kubelet restart: it stops, wipes plugin sockets, and serves kubelet.sock anew.
	e.kubelet.srv.Stop()
	for _, f := range []string{server.KubeletSocket, gpushare.DevicePluginSocket} {
		if err := os.Remove(filepath.Join(e.dir, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
	}
	began := time.Now()
	second := startFakeKubelet(t, e.dir)
	second.waitRegister(t)
	e.waitRegistered(t)
	t.Logf("re-registered %v after kubelet.sock was re-created", time.Since(began))
	if _, err := e.plugin(t).GetDevicePluginOptions(t.Context(), &pluginapi.Empty{}); err != nil {
		t.Errorf("plugin socket after re-registering: %v", err)
	}

	e.restart <- struct{}{}
	second.waitRegister(t)
	e.waitRegistered(t)
}

func TestHealthEventsAndQuietPeriod(t *testing.T) {
	ctx := t.Context()
	const quiet = 500 * time.Millisecond
	e := run(t, "simulated:dgxh100", func(c *manager.Config) { c.HealthQuietPeriod = quiet })
	e.kubelet.waitRegister(t)
	stream, err := e.plugin(t).ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	unhealthyGPUs := func(l *pluginapi.ListAndWatchResponse) string {
		seen := map[string]bool{}
		var out []string
		for _, d := range l.Devices {
			g, _, _ := strings.Cut(d.ID, "-")
			if d.Health == pluginapi.Unhealthy && !seen[g] {
				seen[g] = true
				out = append(out, g)
			}
		}
		return strings.Join(out, ",")
	}
	if u := unhealthyGPUs(first); u != "" {
		t.Fatalf("unhealthy at start: %s", u)
	}
	// The watcher registers its event set after the server starts; the
	// simulator queues injected events, so none is lost meanwhile.
	// Xid 62 is transient: it heals after the quiet period (fatal ones do
	// not: healthpolicy_test.go).
	if err := e.sim.InjectXid(3, 62); err != nil {
		t.Fatal(err)
	}
	injected := time.Now()
	var sick *pluginapi.ListAndWatchResponse
	for sick == nil {
		l, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if unhealthyGPUs(l) == "3" {
			sick = l
		} else if unhealthyGPUs(l) != "" {
			t.Fatalf("unhealthy GPUs %s; want 3", unhealthyGPUs(l))
		}
	}
	// The device list goes to the kubelet before the node is patched.
	node := waitNode(t, e, "showed GPU 3 unhealthy", func(n *corev1.Node) bool {
		d, ok := nodeGPUs(n)
		return ok && !d.GPUs[3].Healthy
	})
	desc, err := gpushare.DecodeNodeGPUs(node.Annotations[gpushare.AnnotationNodeGPUs])
	if err != nil || desc.GPUs[3].Healthy || !strings.Contains(desc.GPUs[3].Reason, "62") || desc.GPUs[3].Permanent || !desc.GPUs[2].Healthy {
		t.Errorf("node description after Xid 62 = %+v, %v", desc, err)
	}
	healed, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if u := unhealthyGPUs(healed); u != "" {
		t.Errorf("after the quiet period unhealthy GPUs are %s", u)
	}
	if took := time.Since(injected); took < quiet {
		t.Errorf("GPU healthy again %v after the event, before the %v quiet period", took, quiet)
	}
}

func TestHealthCheckOff(t *testing.T) {
	e := run(t, "simulated:dgxh100", func(c *manager.Config) { c.HealthCheck = false })
	e.kubelet.waitRegister(t)
	if n := e.lib.watches.Load(); n != 0 {
		t.Errorf("WatchHealth called %d times with health checks off", n)
	}
}

func TestRefusesUnitTooSmallForTheKubelet(t *testing.T) {
	log := zaptest.NewLogger(t)
	sim, err := nvml.NewSimulator(log, "simulated:dgxh200")
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Shutdown()
	dir := t.TempDir()
	k := startFakeKubelet(t, dir)
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}})
	m, err := manager.New(manager.Config{Node: nodeName, Client: client, Library: sim, Unit: gpushare.MiB, DevicePluginDir: dir, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	err = m.Run(t.Context())
	var tooLarge *inventory.MessageTooLargeError
	if !errors.As(err, &tooLarge) || tooLarge.Suggest == 0 || !strings.Contains(err.Error(), fmt.Sprintf("--memory-unit=%s", tooLarge.Suggest)) {
		t.Fatalf("Run with MiB on 8 × H200 = %v; want a refusal naming a workable unit", err)
	}
	t.Log(err)
	select {
	case r := <-k.got:
		t.Errorf("registered despite the refusal: %v", r)
	default:
	}
	if len(client.Actions()) != 0 {
		t.Errorf("API calls despite the refusal: %v", client.Actions())
	}
}

func TestNewValidates(t *testing.T) {
	sim, err := nvml.NewSimulator(nil, "simulated:dgxa100")
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Shutdown()
	client := fake.NewClientset()
	for name, cfg := range map[string]manager.Config{
		"no node":    {Client: client, Library: sim},
		"no client":  {Node: "n", Library: sim},
		"no library": {Node: "n", Client: client},
		"bad unit":   {Node: "n", Client: client, Library: sim, Unit: 3},
	} {
		if _, err := manager.New(cfg); err == nil {
			t.Errorf("%s: New succeeded", name)
		}
	}
}

// The API server refuses the record write during Allocate and the first
// retry; the answer is right at once and the record lands in the background.
func TestRecordRetriedAfterFailedWrite(t *testing.T) {
	ctx := t.Context()
	var patches, failed atomic.Int32
	e := run(t, "simulated:dgxh100", func(c *manager.Config) {
		c.RecordRetry = wait.Backoff{Duration: 5 * time.Millisecond, Factor: 2, Steps: 5}
		// Installed before Run: the fake's reactor chain is not safe to
		// change while the manager calls it.
		c.Client.(*fake.Clientset).PrependReactor("patch", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
			if patches.Add(1) <= 2 {
				failed.Add(1)
				return true, nil, apierrors.NewServiceUnavailable("apiserver restarting")
			}
			return false, nil, nil
		})
	})
	e.kubelet.waitRegister(t)
	// Opened before the pod exists, so every change of it is seen.
	w, err := e.client.CoreV1().Pods("default").Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if _, err := e.client.CoreV1().Pods("default").Create(ctx, gpuPod("p", 8, 3, 79), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	resp, err := e.plugin(t).Allocate(ctx, allocReq(8))
	if err != nil || resp.ContainerResponses[0].Envs[gpushare.EnvGPUIndex] != "3" {
		t.Fatalf("Allocate = %v, %v; want GPU 3", resp, err)
	}
	want, err := gpushare.ParseContainerEnv(resp.ContainerResponses[0].Envs)
	if err != nil {
		t.Fatal(err)
	}
	if failed.Load() == 0 {
		t.Fatal("the write during Allocate did not fail; the test proves nothing")
	}
	timeout := time.After(20 * time.Second)
	for {
		select {
		case ev := <-w.ResultChan():
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok || pod.Name != "p" || pod.Annotations[gpushare.AnnotationAssigned] != "true" {
				continue
			}
			rec, err := gpushare.DecodeContainerEnvs(pod.Annotations[gpushare.AnnotationContainerEnv])
			if err != nil || rec["main"] != want {
				t.Errorf("record = %v, %v; want main: %+v (the answer)", rec, err, want)
			}
			if n := patches.Load(); n != 3 {
				t.Errorf("%d patches; want 3 (two refused, one landed)", n)
			}
			return
		case <-timeout:
			t.Fatalf("the record never landed after %d patches", patches.Load())
		}
	}
}
