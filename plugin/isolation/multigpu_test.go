package isolation_test

import (
	"errors"
	"maps"
	"strings"
	"testing"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/isolation"
)

// multiEnv is a container of units units on GPUs 1 and 4.
func multiEnv(tier gpushare.Isolation, units uint64, percent int) gpushare.ContainerEnv {
	return gpushare.ContainerEnv{GPUIndex: 1, GPUs: gpushare.NewGPUSet(1, 4), PodUnits: units, ContainerUnits: units, DevUnits: 80,
		Isolation: tier, ComputePercent: percent}
}

// A container on two GPUs is limited to its per-GPU share on each: MPS pins
// it per UUID in the set's order, HAMi-core's one limit applies to each GPU.
func TestForMultiGPU(t *testing.T) {
	for _, tt := range []struct {
		name string
		req  isolation.Request
		want map[string]string
	}{
		{"mps, 8 GiB over two GPUs", isolation.Request{Env: multiEnv("mps", 8, 0), UUIDs: []string{"GPU-a", "GPU-b"}, Unit: gpushare.GiB},
			map[string]string{"CUDA_MPS_PIPE_DIRECTORY": "/run/gpushare/mps/pipe", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096M,1=4096M", "CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b"}},
		{"mps keeps the UUIDs' order", isolation.Request{Env: multiEnv("mps", 8, 0), UUIDs: []string{"GPU-b", "GPU-a"}, Unit: gpushare.GiB},
			map[string]string{"CUDA_MPS_PIPE_DIRECTORY": "/run/gpushare/mps/pipe", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096M,1=4096M", "CUDA_VISIBLE_DEVICES": "GPU-b,GPU-a"}},
		{"mps, 256 MiB units, compute share", isolation.Request{Env: multiEnv("mps", 6, 50), UUIDs: []string{"GPU-a", "GPU-b"}, Unit: 256},
			map[string]string{"CUDA_MPS_PIPE_DIRECTORY": "/run/gpushare/mps/pipe", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=768M,1=768M", "CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b",
				"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"}},
		{"hami-core, 8 GiB over two GPUs", isolation.Request{Env: multiEnv("hami-core", 8, 0), UUIDs: []string{"GPU-a", "GPU-b"}, Unit: gpushare.GiB, CacheDir: cacheDir},
			map[string]string{"CUDA_DEVICE_MEMORY_LIMIT": "4096m", "CUDA_DEVICE_MEMORY_LIMIT_0": "4096m", "CUDA_DEVICE_MEMORY_LIMIT_1": "4096m",
				"CUDA_DEVICE_MEMORY_SHARED_CACHE": "/usr/local/vgpu/gpushare/cudevshr.cache", "CUDA_DISABLE_CONTROL": "false", "GPU_CORE_UTILIZATION_POLICY": "default"}},
	} {
		got, err := isolation.For(cfg, tt.req)
		if err != nil || !maps.Equal(got.Envs, tt.want) {
			t.Errorf("%s: For = %+v, %v; want envs %v", tt.name, got, err, tt.want)
		}
	}
}

// A multi-GPU request MPS cannot pin is refused, naming the GPU.
func TestForMultiGPURefuses(t *testing.T) {
	for _, tt := range []struct {
		name  string
		req   isolation.Request
		texts []string
	}{
		{"bad second UUID", isolation.Request{Env: multiEnv("mps", 8, 0), UUIDs: []string{"GPU-a", "4"}, Unit: gpushare.GiB},
			[]string{`GPU 4 has no usable UUID ("4")`}},
		{"empty second UUID", isolation.Request{Env: multiEnv("mps", 8, 0), UUIDs: []string{"GPU-a", ""}, Unit: gpushare.GiB},
			[]string{"GPU 4 has no usable UUID"}},
		{"bad first UUID", isolation.Request{Env: multiEnv("mps", 8, 0), UUIDs: []string{"GPU-a,x", "GPU-b"}, Unit: gpushare.GiB},
			[]string{"GPU 1 has no usable UUID"}},
		{"one UUID for two GPUs", isolation.Request{Env: multiEnv("mps", 8, 0), UUIDs: []string{"GPU-a"}, Unit: gpushare.GiB},
			[]string{"1 UUIDs for the 2 GPUs 1,4"}},
		{"three UUIDs for two GPUs", isolation.Request{Env: multiEnv("mps", 8, 0), UUIDs: []string{"GPU-a", "GPU-b", "GPU-c"}, Unit: gpushare.GiB},
			[]string{"3 UUIDs for the 2 GPUs 1,4"}},
		{"units that do not split evenly", isolation.Request{Env: multiEnv("mps", 7, 0), UUIDs: []string{"GPU-a", "GPU-b"}, Unit: gpushare.GiB},
			[]string{"7 units", "1,4"}},
		{"hami-core, units that do not split evenly", isolation.Request{Env: multiEnv("hami-core", 7, 0), UUIDs: []string{"GPU-a", "GPU-b"}, Unit: gpushare.GiB, CacheDir: cacheDir},
			[]string{"7 units", "1,4"}},
	} {
		got, err := isolation.For(cfg, tt.req)
		if !errors.Is(err, isolation.ErrInvalidAnswer) {
			t.Errorf("%s: For = %+v, %v; want ErrInvalidAnswer", tt.name, got, err)
			continue
		}
		for _, s := range tt.texts {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("%s: error %q lacks %q", tt.name, err, s)
			}
		}
	}
}
