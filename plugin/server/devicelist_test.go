package server_test

import (
	"context"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/internal/fakeapi"
	"github.com/gpushare/gpushare/plugin/inventory"
	"github.com/gpushare/gpushare/plugin/isolation"
	"github.com/gpushare/gpushare/plugin/manager"
	"github.com/gpushare/gpushare/plugin/nvml"
	"github.com/gpushare/gpushare/plugin/server"
)

func strategies(t testing.TB, s string) gpushare.DeviceListStrategies {
	t.Helper()
	out, err := gpushare.ParseDeviceListStrategies(s)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// withVisible is env's contract environment with NVIDIA_VISIBLE_DEVICES set to v.
func withVisible(env gpushare.ContainerEnv, v string) map[string]string {
	m := env.Map()
	m[gpushare.EnvVisibleDevices] = v
	return m
}

// Each strategy's answer, field by field, against NVIDIA's conventions; the
// gpushare variables are the contract's in every one, and read back as the
// decision (the kubelet's checkpoint holds exactly these).
func TestContainerResponse(t *testing.T) {
	const uuid = "GPU-8a3c1f0e-5d2b-4c6a-9e7f-0123456789ab"
	env := gpushare.ContainerEnv{GPUIndex: 3, PodUnits: 10, ContainerUnits: 6, DevUnits: 79, DisableIsolation: true}
	const dir = "/var/run/nvidia-container-devices"
	mount := func(id string) []*pluginapi.Mount {
		return []*pluginapi.Mount{{ContainerPath: dir + "/" + id, HostPath: "/dev/null"}}
	}
	cdi := func(id string) []*pluginapi.CDIDevice { return []*pluginapi.CDIDevice{{Name: "nvidia.com/gpu=" + id}} }
	ann := func(id string) map[string]string {
		return map[string]string{"cdi.k8s.io/gpushare-device-plugin_3": "nvidia.com/gpu=" + id}
	}
	for _, tt := range []struct {
		list, ids string // flag values; "" is the zero value
		want      *pluginapi.ContainerAllocateResponse
	}{
		{"", "", &pluginapi.ContainerAllocateResponse{Envs: withVisible(env, "3")}},
		{"envvar", "uuid", &pluginapi.ContainerAllocateResponse{Envs: withVisible(env, "3")}},
		{"envvar", "index", &pluginapi.ContainerAllocateResponse{Envs: withVisible(env, "3")}},
		{"volume-mounts", "", &pluginapi.ContainerAllocateResponse{Envs: withVisible(env, dir), Mounts: mount(uuid)}},
		{"volume-mounts", "index", &pluginapi.ContainerAllocateResponse{Envs: withVisible(env, dir), Mounts: mount("3")}},
		{"envvar,volume-mounts", "uuid", &pluginapi.ContainerAllocateResponse{Envs: withVisible(env, dir), Mounts: mount(uuid)}},
		{"cdi-annotations", "uuid", &pluginapi.ContainerAllocateResponse{Envs: withVisible(env, "void"), Annotations: ann(uuid)}},
		{"cdi-annotations", "index", &pluginapi.ContainerAllocateResponse{Envs: withVisible(env, "void"), Annotations: ann("3")}},
		{"cdi-cri", "uuid", &pluginapi.ContainerAllocateResponse{Envs: withVisible(env, "void"), CdiDevices: cdi(uuid)}},
		{"cdi-cri", "index", &pluginapi.ContainerAllocateResponse{Envs: withVisible(env, "void"), CdiDevices: cdi("3")}},
		{"cdi-annotations,cdi-cri", "uuid", &pluginapi.ContainerAllocateResponse{Envs: withVisible(env, "void"), Annotations: ann(uuid), CdiDevices: cdi(uuid)}},
		{"envvar,cdi-cri", "uuid", &pluginapi.ContainerAllocateResponse{Envs: withVisible(env, "3"), CdiDevices: cdi(uuid)}},
		{"cdi-cri,volume-mounts", "index", &pluginapi.ContainerAllocateResponse{Envs: withVisible(env, dir), Mounts: mount("3"), CdiDevices: cdi("3")}},
	} {
		d := server.DeviceList{IDs: gpushare.DeviceIDStrategy(tt.ids)}
		if tt.list != "" {
			d.Strategies = strategies(t, tt.list)
		}
		got, err := d.ContainerResponse(env, []string{uuid})
		if err != nil || !proto.Equal(got, tt.want) {
			t.Errorf("%s: ContainerResponse =\n  %v, %v\nwant\n  %v", d, got, err, tt.want)
			continue
		}
		if back, err := gpushare.ParseContainerEnv(got.Envs); err != nil || back != env {
			t.Errorf("%s: the answer's environment reads back as %+v, %v; want %+v", d, back, err, env)
		}
	}
}

// Every strategy composes with every tier: the tier's variables join the
// strategy's, its mounts follow, the rest of the strategy's answer is
// untouched, and the contract's environment (GPUSHARE_ISOLATION included)
// still reads back as the decision. Under a CDI strategy a tier with
// variables also names the limits device holding them (in CDIDevices after
// the GPU's for cdi-cri, in its own annotation for cdi-annotations), and the
// specification holds it; the none tier names none.
func TestContainerResponseWithTier(t *testing.T) {
	const uuid = "GPU-8a3c1f0e-5d2b-4c6a-9e7f-0123456789ab"
	cfg := isolation.Config{MPSPipeDir: "/run/gpushare/mps/pipe", MPSShmDir: "/run/gpushare/mps/shm",
		HAMiLibrary: "/usr/local/vgpu/libvgpu.so", HAMiPreload: "/usr/local/vgpu/ld.so.preload", HAMiLockDir: "/tmp/vgpulock"}
	limits, err := server.NewLimitSpecs(server.LimitSpecsConfig{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	for _, list := range []string{"envvar", "volume-mounts", "cdi-cri", "cdi-annotations", "envvar,cdi-annotations", "volume-mounts,cdi-cri", "cdi-annotations,cdi-cri"} {
		for _, tt := range []struct {
			tier    gpushare.Isolation
			percent int
		}{{gpushare.IsolationNone, 0}, {gpushare.IsolationMPS, 0}, {gpushare.IsolationMPS, 40}, {gpushare.IsolationHAMiCore, 60}} {
			env := gpushare.ContainerEnv{GPUIndex: 3, PodUnits: 10, ContainerUnits: 6, DevUnits: 79, Isolation: tt.tier, ComputePercent: tt.percent}
			tier, err := isolation.For(cfg, isolation.Request{Env: env, UUIDs: []string{uuid}, Unit: gpushare.GiB, CacheDir: "/var/lib/gpushare/hami-cache/c-1"})
			if err != nil {
				t.Fatal(err)
			}
			d := server.DeviceList{Strategies: strategies(t, list), Limits: limits}
			base, err := d.ContainerResponse(env, []string{uuid})
			if err != nil {
				t.Fatal(err)
			}
			got, err := d.ContainerResponseWith(env, []string{uuid}, tier)
			if err != nil {
				t.Fatalf("%s, %s: %v", list, tt.tier, err)
			}
			want := proto.Clone(base).(*pluginapi.ContainerAllocateResponse)
			maps.Copy(want.Envs, tier.Envs)
			want.Mounts = append(want.Mounts, tier.Mounts...)
			if tt.tier != gpushare.IsolationNone {
				edits := gpushare.CDILimitsEnv(tier.Envs)
				name := gpushare.CDILimitsDeviceName(tt.tier, edits)
				if d.Strategies.Includes(gpushare.DeviceListCDICRI) {
					want.CdiDevices = append(want.CdiDevices, &pluginapi.CDIDevice{Name: "gpushare.io/limits=" + name})
				}
				if d.Strategies.Includes(gpushare.DeviceListCDIAnnotations) {
					want.Annotations["cdi.k8s.io/gpushare-device-plugin_limits"] = "gpushare.io/limits=" + name
				}
				cdi := d.Strategies.Includes(gpushare.DeviceListCDICRI) || d.Strategies.Includes(gpushare.DeviceListCDIAnnotations)
				if cdi && !slices.Contains(readSpec(t, limits.Path()), name+" "+strings.Join(edits, " ")) {
					t.Errorf("%s, %s: limits device %s not in the specification %v", list, tt.tier, name, readSpec(t, limits.Path()))
				}
			}
			if !proto.Equal(got, want) {
				t.Errorf("%s, %s: answer\n  %v\nwant\n  %v", list, tt.tier, got, want)
			}
			if back, err := gpushare.ParseContainerEnv(got.Envs); err != nil || back != env || got.Envs[gpushare.EnvIsolation] != string(tt.tier) {
				t.Errorf("%s, %s: reads back as %+v, %v; want %+v", list, tt.tier, back, err, env)
			}
		}
	}
}

// A tier's answer that would overwrite the strategy's is refused.
func TestContainerResponseWithTierConflicts(t *testing.T) {
	env := gpushare.ContainerEnv{GPUIndex: 1, PodUnits: 2, ContainerUnits: 2, DevUnits: 40, Isolation: gpushare.IsolationMPS}
	d := server.DeviceList{Strategies: strategies(t, "volume-mounts")}
	for _, tier := range []isolation.Answer{
		{Envs: map[string]string{gpushare.EnvVisibleDevices: "all"}},
		{Envs: map[string]string{gpushare.EnvIsolation: "none"}},
		{Mounts: []*pluginapi.Mount{{ContainerPath: "/var/run/nvidia-container-devices/GPU-1", HostPath: "/dev/null"}}},
		{Mounts: []*pluginapi.Mount{{ContainerPath: "/dev/shm", HostPath: "/a"}, {ContainerPath: "/dev/shm", HostPath: "/b"}}},
	} {
		if resp, err := d.ContainerResponseWith(env, []string{"GPU-1"}, tier); err == nil {
			t.Errorf("tier answer %+v composed into %v; want an error", tier, resp)
		}
	}
}

// A strategy that names the GPU by UUID never answers without one; those that
// do not need it do not care.
func TestContainerResponseWithoutUUID(t *testing.T) {
	env := gpushare.ContainerEnv{GPUIndex: 1, PodUnits: 2, ContainerUnits: 2, DevUnits: 40}
	for _, list := range []string{"volume-mounts", "cdi-annotations", "cdi-cri", "envvar,cdi-cri"} {
		d := server.DeviceList{Strategies: strategies(t, list)}
		if resp, err := d.ContainerResponse(env, []string{""}); err == nil || !strings.Contains(err.Error(), "no UUID") {
			t.Errorf("%s: ContainerResponse without a UUID = %v, %v; want an error", d, resp, err)
		}
		d.IDs = gpushare.DeviceIDIndex
		if _, err := d.ContainerResponse(env, []string{""}); err != nil {
			t.Errorf("%s: %v", d, err)
		}
	}
	if resp, err := (server.DeviceList{}).ContainerResponse(env, []string{""}); err != nil || resp.Envs[gpushare.EnvVisibleDevices] != "1" {
		t.Errorf("envvar without a UUID = %v, %v", resp, err)
	}
}

const dlNode = "dl-node"

// dlPod is a one-container pod of units units the extender placed on gpu (an
// H100 of 80 GiB units in the simulation).
func dlPod(t testing.TB, name string, units uint64, gpu int) *corev1.Pod {
	t.Helper()
	ann, err := gpushare.PodAssignment{GPUIndex: gpu, PodUnits: units, DevUnits: 80, AssumeTime: 1,
		Allocation: gpushare.Allocation{0: {gpu: units}}}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name), Annotations: ann},
		Spec: corev1.PodSpec{NodeName: dlNode, Containers: []corev1.Container{{Name: "main", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{gpushare.ResourceName: *resource.NewQuantity(int64(units), resource.DecimalSI)},
		}}}},
		Status: corev1.PodStatus{Phase: corev1.PodPending},
	}
}

// runPlugin runs a manager-run plugin for dlNode on lib with list until the
// returned stop, and returns a client of its socket once it registered.
func runPlugin(t *testing.T, api kubernetes.Interface, lib nvml.Library, list server.DeviceList) (pluginapi.DevicePluginClient, func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	dir := t.TempDir()
	startFakeKubelet(t, dir)
	registered := make(chan struct{}, 10)
	m, err := manager.New(manager.Config{
		Node: dlNode, Client: api, Library: lib, DevicePluginDir: dir, Logger: zap.NewNop(), DeviceList: list,
		OnRegistered: func() { registered <- struct{}{} },
	})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- m.Run(ctx) }()
	select {
	case <-registered:
	case err := <-errc:
		t.Fatal(err)
	}
	stop := func() {
		cancel()
		if err := <-errc; err != nil {
			t.Error(err)
		}
	}
	return client(t, filepath.Join(dir, gpushare.DevicePluginSocket)), stop
}

// The whole path, per strategy: the kubelet's Allocate over the plugin's
// socket to a manager-run plugin on a simulated 8 × H100 node, for a pod the
// extender placed on GPU 5. The answer names GPU 5 by the UUID the simulated
// NVML gave it (also the one the node's gpushare.io/gpus publishes), the
// gpushare variables are the contract's, and the record on the pod is the
// same bytes in every mode. A plugin restarted with the same strategy reads
// that record back: it serves the next pod (GPU 6), not the first again.
func TestAllocateDeviceListStrategies(t *testing.T) {
	for _, tt := range []struct{ list, ids string }{
		{"envvar", "uuid"},
		{"volume-mounts", "uuid"},
		{"volume-mounts", "index"},
		{"cdi-annotations", "uuid"},
		{"cdi-cri", "uuid"},
		{"cdi-cri", "index"},
		{"envvar,cdi-annotations,cdi-cri", "uuid"},
	} {
		t.Run(tt.list+"/"+tt.ids, func(t *testing.T) {
			list := server.DeviceList{Strategies: strategies(t, tt.list), IDs: gpushare.DeviceIDStrategy(tt.ids)}
			sim, err := nvml.NewSimulator(nil, "simulated:dgxh100")
			if err != nil {
				t.Fatal(err)
			}
			defer sim.Shutdown()
			gpus, err := sim.Devices()
			if err != nil {
				t.Fatal(err)
			}
			api := fake.NewSimpleClientset(dlPod(t, "first", 10, 5), dlPod(t, "second", 10, 6),
				&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: dlNode}})
			fakeapi.KeepResourceVersions(api, nil)
			req := &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: unitIDs(10)}}}

			c, stop := runPlugin(t, api, sim, list)
			resp, err := c.Allocate(t.Context(), req)
			if err != nil {
				t.Fatal(err)
			}
			stop()
			checkAnswer(t, list, resp, gpus[5], gpushare.ContainerEnv{GPUIndex: 5, PodUnits: 10, ContainerUnits: 10, DevUnits: 80, Isolation: gpushare.IsolationNone})
			node, err := api.CoreV1().Nodes().Get(t.Context(), dlNode, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			published, err := gpushare.DecodeNodeGPUs(node.Annotations[gpushare.AnnotationNodeGPUs])
			if err != nil || published.GPUs[5].UUID != gpus[5].UUID {
				t.Errorf("the node publishes GPU 5 as %+v, %v; NVML says %s", published, err, gpus[5].UUID)
			}
			first, err := api.CoreV1().Pods("default").Get(t.Context(), "first", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got, want := first.Annotations[gpushare.AnnotationContainerEnv], `{"main":{"gpu":5,"pod":10,"container":10,"dev":80,"isolation":"none"}}`; got != want {
				t.Errorf("record %s; want %s, as in envvar mode", got, want)
			}

			c, stop = runPlugin(t, api, sim, list)
			defer stop()
			resp, err = c.Allocate(t.Context(), req)
			if err != nil {
				t.Fatal(err)
			}
			checkAnswer(t, list, resp, gpus[6], gpushare.ContainerEnv{GPUIndex: 6, PodUnits: 10, ContainerUnits: 10, DevUnits: 80, Isolation: gpushare.IsolationNone})
		})
	}
}

// unitIDs are n device IDs of GPU 0: only their number counts.
func unitIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = inventory.DeviceID(0, uint64(i))
	}
	return ids
}

// checkAnswer checks one container's answer for env on gpu under list.
func checkAnswer(t *testing.T, list server.DeviceList, resp *pluginapi.AllocateResponse, gpu nvml.GPU, env gpushare.ContainerEnv) {
	t.Helper()
	if len(resp.ContainerResponses) != 1 {
		t.Fatalf("%d container answers; want 1", len(resp.ContainerResponses))
	}
	r := resp.ContainerResponses[0]
	if !strings.HasPrefix(gpu.UUID, "GPU-") {
		t.Fatalf("simulated GPU %d has UUID %q", gpu.Index, gpu.UUID)
	}
	id := gpu.UUID
	if list.IDs == gpushare.DeviceIDIndex {
		id = strconv.Itoa(gpu.Index)
	}
	contract := env.Map()
	delete(contract, gpushare.EnvVisibleDevices)
	got := maps.Clone(r.Envs)
	visible := got[gpushare.EnvVisibleDevices]
	delete(got, gpushare.EnvVisibleDevices)
	if !maps.Equal(got, contract) {
		t.Errorf("gpushare variables %v; want %v", got, contract)
	}
	s := list.Strategies
	wantVisible := strconv.Itoa(gpu.Index)
	switch {
	case s.Includes(gpushare.DeviceListVolumeMounts):
		wantVisible = "/var/run/nvidia-container-devices"
	case s.OnlyCDI():
		wantVisible = "void"
	}
	if visible != wantVisible {
		t.Errorf("NVIDIA_VISIBLE_DEVICES=%q; want %q", visible, wantVisible)
	}
	var wantMounts []*pluginapi.Mount
	if s.Includes(gpushare.DeviceListVolumeMounts) {
		wantMounts = []*pluginapi.Mount{{ContainerPath: "/var/run/nvidia-container-devices/" + id, HostPath: "/dev/null"}}
	}
	if !equalMsgs(r.Mounts, wantMounts) {
		t.Errorf("mounts %v; want %v", r.Mounts, wantMounts)
	}
	var wantAnn map[string]string
	if s.Includes(gpushare.DeviceListCDIAnnotations) {
		wantAnn = map[string]string{"cdi.k8s.io/gpushare-device-plugin_" + strconv.Itoa(gpu.Index): "nvidia.com/gpu=" + id}
	}
	if !maps.Equal(r.Annotations, wantAnn) {
		t.Errorf("annotations %v; want %v", r.Annotations, wantAnn)
	}
	var wantCDI []*pluginapi.CDIDevice
	if s.Includes(gpushare.DeviceListCDICRI) {
		wantCDI = []*pluginapi.CDIDevice{{Name: "nvidia.com/gpu=" + id}}
	}
	if !equalMsgs(r.CdiDevices, wantCDI) {
		t.Errorf("CDI devices %v; want %v", r.CdiDevices, wantCDI)
	}
	if len(r.Devices) != 0 {
		t.Errorf("device specs %v; want none", r.Devices)
	}
}

func equalMsgs[M proto.Message](a, b []M) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !proto.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}
