package isolation_test

import (
	"errors"
	"maps"
	"testing"

	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/isolation"
)

const uuid = "GPU-8a3c1f0e-5d2b-4c6a-9e7f-0123456789ab"

var cfg = isolation.Config{
	MPSPipeDir: "/run/gpushare/mps/pipe", MPSShmDir: "/run/gpushare/mps/shm",
	HAMiLibrary: "/usr/local/vgpu/libvgpu.so.v2.6.1", HAMiPreload: "/usr/local/vgpu/ld.so.preload",
	HAMiLockDir: "/tmp/vgpulock", HAMiCacheRoot: "/var/lib/gpushare/hami-cache",
}

const cacheDir = "/var/lib/gpushare/hami-cache/c-4711"

func env(tier gpushare.Isolation, units uint64, percent int) gpushare.ContainerEnv {
	return gpushare.ContainerEnv{GPUIndex: 3, PodUnits: units + 2, ContainerUnits: units, DevUnits: 79, Isolation: tier, ComputePercent: percent}
}

// Each tier's answer, field by field.
func TestFor(t *testing.T) {
	mpsMounts := []*pluginapi.Mount{
		{ContainerPath: "/run/gpushare/mps/pipe", HostPath: "/run/gpushare/mps/pipe"},
		{ContainerPath: "/dev/shm", HostPath: "/run/gpushare/mps/shm"},
	}
	hamiMounts := []*pluginapi.Mount{
		{ContainerPath: "/usr/local/vgpu/libvgpu.so", HostPath: "/usr/local/vgpu/libvgpu.so.v2.6.1", ReadOnly: true},
		{ContainerPath: "/etc/ld.so.preload", HostPath: "/usr/local/vgpu/ld.so.preload", ReadOnly: true},
		{ContainerPath: "/tmp/vgpulock", HostPath: "/tmp/vgpulock"},
		{ContainerPath: "/usr/local/vgpu/gpushare", HostPath: cacheDir},
	}
	for _, tt := range []struct {
		name string
		req  isolation.Request
		want isolation.Answer
	}{
		{"no tier: the seed's answer", isolation.Request{Env: env("", 4, 0), UUIDs: []string{uuid}, Unit: gpushare.GiB}, isolation.Answer{}},
		{"none: nothing beside GPUSHARE_ISOLATION", isolation.Request{Env: env("none", 4, 0), UUIDs: []string{uuid}, Unit: gpushare.GiB}, isolation.Answer{}},
		{"mps, GiB", isolation.Request{Env: env("mps", 20, 0), UUIDs: []string{uuid}, Unit: gpushare.GiB}, isolation.Answer{
			Envs:   map[string]string{"CUDA_MPS_PIPE_DIRECTORY": "/run/gpushare/mps/pipe", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20480M", "CUDA_VISIBLE_DEVICES": uuid},
			Mounts: mpsMounts}},
		{"mps, 256MiB, compute share", isolation.Request{Env: env("mps", 3, 30), UUIDs: []string{uuid}, Unit: 256}, isolation.Answer{
			Envs: map[string]string{"CUDA_MPS_PIPE_DIRECTORY": "/run/gpushare/mps/pipe", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=768M", "CUDA_VISIBLE_DEVICES": uuid,
				"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30"},
			Mounts: mpsMounts}},
		{"hami-core, GiB", isolation.Request{Env: env("hami-core", 40, 0), UUIDs: []string{uuid}, Unit: gpushare.GiB, CacheDir: cacheDir}, isolation.Answer{
			Envs: map[string]string{"CUDA_DEVICE_MEMORY_LIMIT": "40960m", "CUDA_DEVICE_MEMORY_LIMIT_0": "40960m", "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/usr/local/vgpu/gpushare/cudevshr.cache",
				"CUDA_DISABLE_CONTROL": "false", "GPU_CORE_UTILIZATION_POLICY": "default"},
			Mounts: hamiMounts}},
		{"hami-core, MiB, compute share, no UUID needed", isolation.Request{Env: env("hami-core", 1500, 100), Unit: gpushare.MiB, CacheDir: cacheDir}, isolation.Answer{
			Envs: map[string]string{"CUDA_DEVICE_MEMORY_LIMIT": "1500m", "CUDA_DEVICE_MEMORY_LIMIT_0": "1500m", "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/usr/local/vgpu/gpushare/cudevshr.cache",
				"CUDA_DISABLE_CONTROL": "false", "GPU_CORE_UTILIZATION_POLICY": "default",
				"CUDA_DEVICE_SM_LIMIT": "100"},
			Mounts: hamiMounts}},
	} {
		got, err := isolation.For(cfg, tt.req)
		if err != nil || !maps.Equal(got.Envs, tt.want.Envs) || !equalMounts(got.Mounts, tt.want.Mounts) {
			t.Errorf("%s: For = %+v, %v\nwant %+v", tt.name, got, err, tt.want)
		}
	}
}

// The pipe directory can sit elsewhere in the container than on the host.
func TestForMPSContainerPipeDir(t *testing.T) {
	c := cfg
	c.MPSContainerPipeDir = "/mps/pipe"
	got, err := isolation.For(c, isolation.Request{Env: env("mps", 1, 0), UUIDs: []string{uuid}, Unit: gpushare.GiB})
	if err != nil || got.Envs["CUDA_MPS_PIPE_DIRECTORY"] != "/mps/pipe" ||
		!proto.Equal(got.Mounts[0], &pluginapi.Mount{ContainerPath: "/mps/pipe", HostPath: "/run/gpushare/mps/pipe"}) {
		t.Errorf("For = %+v, %v", got, err)
	}
}

// Requests no tier can serve are errors, never an answer without the limit.
func TestForRefuses(t *testing.T) {
	noPaths := isolation.Config{}
	relative := cfg
	relative.HAMiLibrary = "usr/local/vgpu/libvgpu.so"
	for _, tt := range []struct {
		name string
		cfg  isolation.Config
		req  isolation.Request
	}{
		{"compute share on none", cfg, isolation.Request{Env: env("none", 4, 10), UUIDs: []string{uuid}, Unit: gpushare.GiB}},
		{"compute share without a tier", cfg, isolation.Request{Env: env("", 4, 10), UUIDs: []string{uuid}, Unit: gpushare.GiB}},
		{"compute share above 100", cfg, isolation.Request{Env: env("mps", 4, 101), UUIDs: []string{uuid}, Unit: gpushare.GiB}},
		{"unknown tier", cfg, isolation.Request{Env: env("cgpu", 4, 0), UUIDs: []string{uuid}, Unit: gpushare.GiB}},
		{"any is no GPU's tier", cfg, isolation.Request{Env: env("any", 4, 0), UUIDs: []string{uuid}, Unit: gpushare.GiB}},
		{"mps by ordinal", cfg, isolation.Request{Env: env("mps", 4, 0), UUIDs: []string{"3"}, Unit: gpushare.GiB}},
		{"mps without a UUID", cfg, isolation.Request{Env: env("mps", 4, 0), Unit: gpushare.GiB}},
		{"mps with a list for a UUID", cfg, isolation.Request{Env: env("mps", 4, 0), UUIDs: []string{uuid + ",GPU-x=1G"}, Unit: gpushare.GiB}},
		{"mps without units", cfg, isolation.Request{Env: env("mps", 0, 0), UUIDs: []string{uuid}, Unit: gpushare.GiB}},
		{"mps with a bad unit", cfg, isolation.Request{Env: env("mps", 4, 0), UUIDs: []string{uuid}, Unit: 3}},
		{"mps without paths", noPaths, isolation.Request{Env: env("mps", 4, 0), UUIDs: []string{uuid}, Unit: gpushare.GiB}},
		{"hami-core without a cache directory", cfg, isolation.Request{Env: env("hami-core", 4, 0), UUIDs: []string{uuid}, Unit: gpushare.GiB}},
		{"hami-core with a relative cache directory", cfg, isolation.Request{Env: env("hami-core", 4, 0), UUIDs: []string{uuid}, Unit: gpushare.GiB, CacheDir: "c-1"}},
		{"hami-core with a relative library", relative, isolation.Request{Env: env("hami-core", 4, 0), UUIDs: []string{uuid}, Unit: gpushare.GiB, CacheDir: cacheDir}},
		{"hami-core without paths", noPaths, isolation.Request{Env: env("hami-core", 4, 0), UUIDs: []string{uuid}, Unit: gpushare.GiB, CacheDir: cacheDir}},
	} {
		if got, err := isolation.For(tt.cfg, tt.req); !errors.Is(err, isolation.ErrInvalidAnswer) {
			t.Errorf("%s: For = %+v, %v; want ErrInvalidAnswer", tt.name, got, err)
		}
	}
}

func equalMounts(a, b []*pluginapi.Mount) bool {
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
