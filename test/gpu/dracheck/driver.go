package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/gpushare/gpushare/plugin/dra"
	"github.com/gpushare/gpushare/plugin/dra/slice"
	"github.com/gpushare/gpushare/plugin/dra/store"
	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/nvml"
	"github.com/gpushare/gpushare/test/gpu/internal/report"
)

// nodeName is the node the fake API server holds and the driver serves.
const nodeName = "gpushare-gpu-check"

// driver is dra.Run serving on a fake API server, and the kubelet's side of
// its dra.sock.
type driver struct {
	api     *fake.Clientset
	store   *store.Store // the driver's directories, for SpecPath
	kubelet drapb.DRAPluginClient
	conn    *grpc.ClientConn
	cancel  context.CancelFunc
	done    chan error
}

// startDriver runs dra.Run with its directories under root and waits until
// it serves.
func startDriver(ctx context.Context, r *report.Report, o options, lib nvml.Library, log *zap.Logger, root string, iso dra.IsolationConfig) (*driver, bool) {
	cfg := dra.Config{Node: nodeName, Library: lib, Isolation: iso, Logger: log, PluginDir: filepath.Join(root, "plugin"),
		RegistrarDir: filepath.Join(root, "registry"), CDIDir: filepath.Join(root, "cdi")}
	cfg.Client = fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, UID: "gpushare-gpu-check-node"}})
	st, err := store.New(cfg.PluginDir, cfg.CDIDir)
	if err == nil {
		err = os.MkdirAll(cfg.RegistrarDir, 0o755)
	}
	if !r.Check("driver directories", err == nil, report.ErrText(err, root)) {
		return nil, false
	}
	started := make(chan struct{}, 1)
	cfg.Started = func(*dra.Driver) { started <- struct{}{} }
	ctx, cancel := context.WithCancel(ctx)
	d := &driver{api: cfg.Client.(*fake.Clientset), store: st, cancel: cancel, done: make(chan error, 1)}
	t0 := time.Now()
	go func() { d.done <- dra.Run(ctx, cfg) }()
	if !waitServing(r, d, started, o.driverTimeout, t0) {
		cancel()
		return nil, false
	}
	d.conn, err = grpc.NewClient("unix://"+filepath.Join(cfg.PluginDir, "dra.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if !r.Check("connect to dra.sock", err == nil, report.ErrText(err, filepath.Join(cfg.PluginDir, "dra.sock"))) {
		d.stop(r, o.driverTimeout)
		return nil, false
	}
	d.kubelet = drapb.NewDRAPluginClient(d.conn)
	return d, true
}

// waitServing waits for the driver's Started, or its end, or timeout.
func waitServing(r *report.Report, d *driver, started <-chan struct{}, timeout time.Duration, t0 time.Time) bool {
	var err error
	select {
	case <-started:
	case err = <-d.done:
		err = fmt.Errorf("dra.Run ended before serving: %v", err)
	case <-time.After(timeout):
		err = fmt.Errorf("not serving after %v", timeout)
	}
	return r.Check("dra.Run serves", err == nil, report.ErrText(err, fmt.Sprintf("registered and published in %v", time.Since(t0).Round(time.Millisecond))))
}

// stop ends dra.Run and waits for it.
func (d *driver) stop(r *report.Report, timeout time.Duration) {
	if d.conn != nil {
		d.conn.Close()
	}
	d.cancel()
	var err error
	select {
	case err = <-d.done:
	case <-time.After(timeout):
		err = fmt.Errorf("still running %v after it was told to stop", timeout)
	}
	r.Check("dra.Run stops", err == nil, report.ErrText(err, "returned nil"))
}

// showDevice waits for the node's ResourceSlice, prints the GPU's device in
// it and checks its isolation attribute is tier; it returns the device name.
func (d *driver) showDevice(ctx context.Context, r *report.Report, gpu nvml.GPU, tier string, timeout time.Duration) (string, bool) {
	name, err := slice.DeviceName(gpu.UUID)
	if !r.Check("device name", err == nil, report.ErrText(err, name)) {
		return "", false
	}
	s, err := d.waitSlice(ctx, timeout)
	if !r.Check("ResourceSlice published", err == nil, report.ErrText(err, sliceLine(s))) {
		return "", false
	}
	dev := findDevice(s, name)
	if !r.Check("ResourceSlice device of GPU "+fmt.Sprint(gpu.Index), dev != nil, name) {
		return "", false
	}
	memory := dev.Capacity[gpushare.DRACapacityMemory].Value
	isolation := stringAttr(dev, gpushare.DRAAttributeIsolation)
	r.Say("slice device %s: memory capacity %s, isolation %s, uuid %s, productName %s", name, memory.String(), isolation,
		stringAttr(dev, gpushare.DRAAttributeUUID), stringAttr(dev, gpushare.DRAAttributeProductName))
	ok := isolation == tier && stringAttr(dev, gpushare.DRAAttributeUUID) == gpu.UUID
	r.Check("published isolation tier", ok, fmt.Sprintf("%s, want %s", isolation, tier))
	return name, ok
}

// waitSlice polls the fake API server for the driver's slice of the node.
func (d *driver) waitSlice(ctx context.Context, timeout time.Duration) (*resourceapi.ResourceSlice, error) {
	deadline := time.Now().Add(timeout)
	for {
		list, err := d.api.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, err
		}
		for i := range list.Items {
			if s := &list.Items[i]; s.Spec.Driver == gpushare.DRADriverName && s.Spec.Pool.Name == nodeName {
				return s, nil
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("no slice of %s after %v", gpushare.DRADriverName, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func sliceLine(s *resourceapi.ResourceSlice) string {
	if s == nil {
		return ""
	}
	return fmt.Sprintf("driver %s, pool %s, node %s, %d device(s)", s.Spec.Driver, s.Spec.Pool.Name, ptrString(s.Spec.NodeName), len(s.Spec.Devices))
}

func ptrString(p *string) string {
	if p == nil {
		return "(none)"
	}
	return *p
}

func findDevice(s *resourceapi.ResourceSlice, name string) *resourceapi.Device {
	for i := range s.Spec.Devices {
		if s.Spec.Devices[i].Name == name {
			return &s.Spec.Devices[i]
		}
	}
	return nil
}

func stringAttr(dev *resourceapi.Device, name resourceapi.QualifiedName) string {
	if v := dev.Attributes[name].StringValue; v != nil {
		return *v
	}
	return ""
}
