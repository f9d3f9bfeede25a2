package server_test

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/server"
)

// A container on two GPUs gets one mount, CDI annotation or CDI device per
// GPU, in the set's order, whatever the strategies; NVIDIA_VISIBLE_DEVICES is
// what a single GPU gets, the list of indices for envvar.
func TestContainerResponseMultiGPU(t *testing.T) {
	const uuidA, uuidB = "GPU-11111111-2222-3333-4444-555555555555", "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
	env := gpushare.ContainerEnv{GPUIndex: 2, GPUs: gpushare.NewGPUSet(2, 5), PodUnits: 12, ContainerUnits: 8, DevUnits: 79}
	uuids := []string{uuidA, uuidB}
	const dir = "/var/run/nvidia-container-devices"
	mounts := func(a, b string) []*pluginapi.Mount {
		return []*pluginapi.Mount{{ContainerPath: dir + "/" + a, HostPath: "/dev/null"}, {ContainerPath: dir + "/" + b, HostPath: "/dev/null"}}
	}
	cdi := func(a, b string) []*pluginapi.CDIDevice {
		return []*pluginapi.CDIDevice{{Name: "nvidia.com/gpu=" + a}, {Name: "nvidia.com/gpu=" + b}}
	}
	ann := func(a, b string) map[string]string {
		return map[string]string{"cdi.k8s.io/gpushare-device-plugin_2": "nvidia.com/gpu=" + a, "cdi.k8s.io/gpushare-device-plugin_5": "nvidia.com/gpu=" + b}
	}
	for _, tt := range []struct {
		list, ids string
		want      *pluginapi.ContainerAllocateResponse
	}{
		{"", "", &pluginapi.ContainerAllocateResponse{Envs: withVisible(env, "2,5")}},
		{"envvar", "uuid", &pluginapi.ContainerAllocateResponse{Envs: withVisible(env, "2,5")}},
		{"envvar", "index", &pluginapi.ContainerAllocateResponse{Envs: withVisible(env, "2,5")}},
		{"volume-mounts", "uuid", &pluginapi.ContainerAllocateResponse{Envs: withVisible(env, dir), Mounts: mounts(uuidA, uuidB)}},
		{"volume-mounts", "index", &pluginapi.ContainerAllocateResponse{Envs: withVisible(env, dir), Mounts: mounts("2", "5")}},
		{"envvar,volume-mounts", "uuid", &pluginapi.ContainerAllocateResponse{Envs: withVisible(env, dir), Mounts: mounts(uuidA, uuidB)}},
		{"cdi-annotations", "uuid", &pluginapi.ContainerAllocateResponse{Envs: withVisible(env, "void"), Annotations: ann(uuidA, uuidB)}},
		{"cdi-annotations", "index", &pluginapi.ContainerAllocateResponse{Envs: withVisible(env, "void"), Annotations: ann("2", "5")}},
		{"cdi-cri", "uuid", &pluginapi.ContainerAllocateResponse{Envs: withVisible(env, "void"), CdiDevices: cdi(uuidA, uuidB)}},
		{"cdi-cri", "index", &pluginapi.ContainerAllocateResponse{Envs: withVisible(env, "void"), CdiDevices: cdi("2", "5")}},
		{"cdi-annotations,cdi-cri", "uuid", &pluginapi.ContainerAllocateResponse{Envs: withVisible(env, "void"), Annotations: ann(uuidA, uuidB), CdiDevices: cdi(uuidA, uuidB)}},
		{"envvar,cdi-cri", "index", &pluginapi.ContainerAllocateResponse{Envs: withVisible(env, "2,5"), CdiDevices: cdi("2", "5")}},
		{"envvar,cdi-annotations", "uuid", &pluginapi.ContainerAllocateResponse{Envs: withVisible(env, "2,5"), Annotations: ann(uuidA, uuidB)}},
		{"cdi-cri,volume-mounts", "uuid", &pluginapi.ContainerAllocateResponse{Envs: withVisible(env, dir), Mounts: mounts(uuidA, uuidB), CdiDevices: cdi(uuidA, uuidB)}},
		{"volume-mounts,cdi-annotations,cdi-cri", "index", &pluginapi.ContainerAllocateResponse{Envs: withVisible(env, dir), Mounts: mounts("2", "5"),
			Annotations: ann("2", "5"), CdiDevices: cdi("2", "5")}},
	} {
		d := server.DeviceList{IDs: gpushare.DeviceIDStrategy(tt.ids)}
		if tt.list != "" {
			d.Strategies = strategies(t, tt.list)
		}
		got, err := d.ContainerResponse(env, uuids)
		if err != nil || !proto.Equal(got, tt.want) {
			t.Errorf("%s: ContainerResponse =\n  %v, %v\nwant\n  %v", d, got, err, tt.want)
			continue
		}
		if got.Envs[gpushare.EnvGPUCount] != "2" || got.Envs[gpushare.EnvGPUIndex] != "2,5" {
			t.Errorf("%s: envs %v lack the GPU list and count", d, got.Envs)
		}
		if back, err := gpushare.ParseContainerEnv(got.Envs); err != nil || back != env {
			t.Errorf("%s: the answer's environment reads back as %+v, %v; want %+v", d, back, err, env)
		}
	}
}

// Not one UUID per GPU of the set is an error for every strategy that names
// GPUs to the runtime; an empty UUID too where UUIDs are used.
func TestContainerResponseMultiGPUWrongUUIDs(t *testing.T) {
	env := gpushare.ContainerEnv{GPUIndex: 2, GPUs: gpushare.NewGPUSet(2, 5), PodUnits: 8, ContainerUnits: 8, DevUnits: 79}
	for _, list := range []string{"volume-mounts", "cdi-annotations", "cdi-cri", "envvar,cdi-cri", "volume-mounts,cdi-annotations"} {
		for _, ids := range []string{"uuid", "index"} {
			d := server.DeviceList{Strategies: strategies(t, list), IDs: gpushare.DeviceIDStrategy(ids)}
			for _, uuids := range [][]string{nil, {"GPU-a"}, {"GPU-a", "GPU-b", "GPU-c"}} {
				got, err := d.ContainerResponse(env, uuids)
				if err == nil || got != nil || !strings.Contains(err.Error(), "UUIDs for the 2 GPUs 2,5") {
					t.Errorf("%s with %d UUIDs: ContainerResponse = %v, %v; want an error", d, len(uuids), got, err)
				}
			}
			got, err := d.ContainerResponse(env, []string{"GPU-a", ""})
			if ids == "uuid" && (err == nil || got != nil || !strings.Contains(err.Error(), "GPU 5 has no UUID")) {
				t.Errorf("%s with an empty second UUID: ContainerResponse = %v, %v; want an error naming GPU 5", d, got, err)
			}
			if ids == "index" && err != nil {
				t.Errorf("%s with an empty second UUID by index: %v", d, err)
			}
		}
	}
}
