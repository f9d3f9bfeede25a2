package dra

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/nvml"
)

// TestRunServesTheKubeletOverGRPC runs the driver as the program does, on a
// fake API server and a simulated node: it registers in the registrar
// directory, publishes the node's slice, and prepares and unprepares a
// claim over the DRA gRPC API the kubelet calls (dra/v1).
func TestRunServesTheKubeletOverGRPC(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode, UID: "node-uid"}})
	slices, err := client.ResourceV1().ResourceSlices().Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer slices.Stop()
	lib, err := nvml.NewSimulator(zaptest.NewLogger(t), "simulated:dgxh100")
	if err != nil {
		t.Fatal(err)
	}
	defer lib.Shutdown()
	root := t.TempDir()
	cfg := Config{Node: testNode, Client: client, Library: lib, PluginDir: filepath.Join(root, "plugin"), RegistrarDir: filepath.Join(root, "registry"),
		CDIDir: filepath.Join(root, "cdi"), Logger: zaptest.NewLogger(t)}
	if err := os.MkdirAll(cfg.RegistrarDir, 0o755); err != nil {
		t.Fatal(err)
	}
	started := make(chan *Driver, 1)
	cfg.Started = func(d *Driver) { started <- d }
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg) }()
	var drv *Driver
	select {
	case drv = <-started:
	case err := <-done:
		t.Fatalf("Run ended before serving: %v", err)
	}
	if _, err := os.Stat(filepath.Join(cfg.RegistrarDir, gpushare.DRADriverName+"-reg.sock")); err != nil {
		t.Errorf("registration socket: %v", err)
	}

	published := (<-slices.ResultChan()).Object.(*resourceapi.ResourceSlice)
	if published.Spec.Driver != gpushare.DRADriverName || published.Spec.Pool.Name != testNode || len(published.Spec.Devices) != 8 {
		t.Fatalf("slice: driver %s pool %s with %d devices; want %s, %s, 8", published.Spec.Driver, published.Spec.Pool.Name,
			len(published.Spec.Devices), gpushare.DRADriverName, testNode)
	}

	dev := published.Spec.Devices[2].Name
	claim := allocated("6f0c7a3e-1d2b-4c5d-8e9f-0a1b2c3d4e5f", "8Gi", dev)
	if _, err := client.ResourceV1().ResourceClaims("default").Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("unix://"+filepath.Join(cfg.PluginDir, "dra.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	kubelet := drapb.NewDRAPluginClient(conn)
	ref := &drapb.Claim{Namespace: "default", Name: claim.Name, Uid: string(claim.UID)}
	resp, err := kubelet.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{ref}})
	if err != nil {
		t.Fatal(err)
	}
	got := resp.Claims[string(claim.UID)]
	wantID := gpushare.DRACDIKind + "=" + string(claim.UID)
	if got.GetError() != "" || len(got.Devices) != 1 || got.Devices[0].DeviceName != dev || len(got.Devices[0].CdiDeviceIds) != 1 ||
		got.Devices[0].CdiDeviceIds[0] != wantID || got.Devices[0].GetShareId() == "" {
		t.Fatalf("NodePrepareResources answered %v; want device %s with CDI device %s and its share ID", got, dev, wantID)
	}
	spec := filepath.Join(cfg.CDIDir, "gpu-mem.gpushare.io-claim_"+string(claim.UID)+".json")
	if _, err := os.Stat(spec); err != nil {
		t.Errorf("CDI specification: %v", err)
	}
	un, err := kubelet.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{ref}})
	if err != nil || un.Claims[string(claim.UID)].GetError() != "" {
		t.Fatalf("NodeUnprepareResources: %v, %v", err, un)
	}
	if _, err := os.Stat(spec); !os.IsNotExist(err) {
		t.Errorf("CDI specification after Unprepare: %v", err)
	}

	// A fatal fault republishes the slice with the GPU's device tainted.
	gpu := drv.node.base[2]
	drv.node.health(nvml.HealthEvent{Index: gpu.Index, UUID: gpu.UUID, Xid: 48, Cause: nvml.CauseFatal, Reason: "critical Xid 48"}, time.Now())
	// The helper's controller may update the slice or replace it.
	tainted := false
	deadline := time.After(time.Minute) // a bound, so that a lost republish fails instead of hanging
	for !tainted {
		var ev watch.Event
		open := true
		select {
		case ev, open = <-slices.ResultChan():
			if !open {
				t.Fatal("the slice watch ended before the tainted slice was published")
			}
		case <-deadline:
			t.Fatal("no tainted slice published within a minute of the fault")
		}
		s, ok := ev.Object.(*resourceapi.ResourceSlice)
		if ev.Type == watch.Deleted || !ok || len(s.Spec.Devices) != 8 {
			continue
		}
		taints := s.Spec.Devices[2].Taints
		if tainted = len(taints) == 1 && taints[0].Value == "fatal-xid-48" && taints[0].Effect == resourceapi.DeviceTaintEffectNoSchedule &&
			taints[0].Key == gpushare.DRATaintUnhealthy; !tainted {
			t.Fatalf("slice republished without the taint: %+v", taints)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}
