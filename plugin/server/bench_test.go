package server_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/internal/fakeapi"
	"github.com/gpushare/gpushare/plugin/inventory"
	"github.com/gpushare/gpushare/plugin/manager"
	"github.com/gpushare/gpushare/plugin/nvml"
)

const benchNode = "bench-node"

// benchPod is a one-container pod of size units the extender placed on gpu
// (80 units, an H100 in GiB); assigned pods carry a complete record.
func benchPod(b *testing.B, i int, units uint64, gpu int, assigned bool) *corev1.Pod {
	ann, err := gpushare.PodAssignment{GPUIndex: gpu, PodUnits: units, DevUnits: 80, AssumeTime: int64(i + 1),
		Allocation: gpushare.Allocation{0: {gpu: units}}}.Encode()
	if err != nil {
		b.Fatal(err)
	}
	if assigned {
		rec, err := gpushare.EncodeContainerEnvs(gpushare.ContainerEnvs{"main": {GPUIndex: gpu, PodUnits: units, ContainerUnits: units, DevUnits: 80}})
		if err != nil {
			b.Fatal(err)
		}
		ann[gpushare.AnnotationContainerEnv] = rec
		ann[gpushare.AnnotationAssigned] = "true"
	}
	name := fmt.Sprintf("p%06d", i)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name), Annotations: ann,
			ResourceVersion: strconv.Itoa(i + 1)},
		Spec: corev1.PodSpec{NodeName: benchNode, Containers: []corev1.Container{{Name: "main", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{gpushare.ResourceName: *resource.NewQuantity(int64(units), resource.DecimalSI)},
		}}}},
		Status: corev1.PodStatus{Phase: corev1.PodPending},
	}
}

// BenchmarkAllocate100Pods times the whole Allocate path as the kubelet sees
// it: a gRPC call over the plugin's unix socket to a manager-run plugin
// (simulated 8 × H100, GiB), the decision on a node with 100 pods (50 in
// flight, five sizes, each size on its own GPU as the extender's rule makes
// them; 50 already assigned), and the record PATCH against a fake API
// server. Each call serves the oldest in-flight 3-unit pod; between calls,
// off the clock, that pod is deleted and a fresh one created, which reach
// the plugin through its watch as they would in a cluster. p50 and p99 of
// the calls are reported.
//
// Two fake API servers: the plain object tracker (NewSimpleClientset), whose
// PATCH costs little, so the figure is the plugin's; and the field-managed
// one (NewClientset), which builds a REST mapper on every write and so
// shows how a slow API server's PATCH adds to each call.
func BenchmarkAllocate100Pods(b *testing.B) {
	b.Run("simple-fake", func(b *testing.B) { benchmarkAllocate(b, fake.NewSimpleClientset) })
	b.Run("field-managed-fake", func(b *testing.B) { benchmarkAllocate(b, fake.NewClientset) })
}

func benchmarkAllocate(b *testing.B, newClient func(...runtime.Object) *fake.Clientset) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const size, sizeGPU = 3, 3
	var objs []runtime.Object
	var waiting []string // in-flight pods of `size`, oldest first
	for i := range 100 {
		units := uint64(1 + i%5)
		p := benchPod(b, i, units, int(units), i >= 50)
		objs = append(objs, p)
		if i < 50 && units == size {
			waiting = append(waiting, p.Name)
		}
	}
	objs = append(objs, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: benchNode}})
	api := newClient(objs...)
	// resourceVersions as on a real API server: without them the plugin
	// would decode every pod on every call, which it never does in a cluster.
	fakeapi.KeepResourceVersions(api, nil)
	sim, err := nvml.NewSimulator(nil, "simulated:dgxh100")
	if err != nil {
		b.Fatal(err)
	}
	defer sim.Shutdown()
	dir := b.TempDir()
	startFakeKubelet(b, dir)
	registered := make(chan struct{}, 10)
	m, err := manager.New(manager.Config{
		Node: benchNode, Client: api, Library: sim, DevicePluginDir: dir, Logger: zap.NewNop(),
		OnRegistered: func() { registered <- struct{}{} },
	})
	if err != nil {
		b.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- m.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-errc; err != nil {
			b.Error(err)
		}
	}()
	select {
	case <-registered:
	case err := <-errc:
		b.Fatal(err)
	}
	c := client(b, filepath.Join(dir, gpushare.DevicePluginSocket))
	ids := make([]string, size)
	for i := range ids {
		ids[i] = inventory.DeviceID(0, uint64(i)) // any IDs: only their number counts
	}
	req := &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}}

	next := 100
	var took []time.Duration
	for b.Loop() {
		start := time.Now()
		resp, err := c.Allocate(ctx, req)
		took = append(took, time.Since(start))
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if got := resp.ContainerResponses[0].Envs[gpushare.EnvGPUIndex]; got != fmt.Sprint(sizeGPU) {
			b.Fatalf("GPU %s; want %d", got, sizeGPU)
		}
		served := waiting[0]
		waiting = waiting[1:]
		pod, err := api.CoreV1().Pods("default").Get(ctx, served, metav1.GetOptions{})
		if err != nil || pod.Annotations[gpushare.AnnotationAssigned] != "true" {
			b.Fatalf("served pod %s not recorded: %v, %v", served, pod.GetAnnotations(), err)
		}
		if err := api.CoreV1().Pods("default").Delete(ctx, served, metav1.DeleteOptions{}); err != nil {
			b.Fatal(err)
		}
		fresh := benchPod(b, next, size, sizeGPU, false)
		next++
		if _, err := api.CoreV1().Pods("default").Create(ctx, fresh, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		waiting = append(waiting, fresh.Name)
		b.StartTimer()
	}
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(took[len(took)*99/100].Microseconds()), "p99-µs")
}
