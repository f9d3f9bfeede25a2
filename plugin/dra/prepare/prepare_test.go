package prepare_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	apiresource "k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpushare/gpushare/plugin/dra/prepare"
	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/isolation"
)

const node = "node-a"

var uuids = []string{
	"GPU-00000000-0000-0000-0000-000000000000",
	"GPU-11111111-1111-1111-1111-111111111111",
	"GPU-22222222-2222-2222-2222-222222222222",
}

func dev(i int) string { return "gpu-" + strings.ToLower(strings.TrimPrefix(uuids[i], "GPU-")) }

func gpus(tier gpushare.Isolation) []prepare.GPU {
	out := make([]prepare.GPU, len(uuids))
	for i, u := range uuids {
		out[i] = prepare.GPU{Index: i, UUID: u, Units: 79, Tier: isolation.Status{Tier: tier}}
	}
	return out
}

var paths = isolation.Config{MPSPipeDir: "/run/gpushare/mps/pipe", MPSShmDir: "/run/gpushare/mps/shm",
	HAMiLibrary: "/usr/local/vgpu/libvgpu.so", HAMiPreload: "/usr/local/vgpu/ld.so.preload", HAMiLockDir: "/tmp/vgpulock", HAMiCacheRoot: "/var/lib/gpushare/hami-cache"}

// result is an allocation result of ours on device i consuming memory.
func result(request string, i int, memory string) resourceapi.DeviceRequestAllocationResult {
	r := resourceapi.DeviceRequestAllocationResult{Request: request, Driver: gpushare.DRADriverName, Pool: node, Device: dev(i)}
	if memory != "" {
		share := types.UID("share-" + memory)
		r.ShareID = &share
		r.ConsumedCapacity = map[resourceapi.QualifiedName]apiresource.Quantity{gpushare.DRACapacityMemory: apiresource.MustParse(memory)}
	}
	return r
}

func claim(results ...resourceapi.DeviceRequestAllocationResult) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{}
	c.Namespace, c.Name, c.UID = "default", "c", "6f0c7a3e-1d2b-4c5d-8e9f-0a1b2c3d4e5f"
	c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: results}}
	return c
}

func TestShares(t *testing.T) {
	other := result("gpu", 0, "4Gi")
	other.Driver = "gpu.nvidia.com"
	foreignPool := result("gpu", 0, "4Gi")
	foreignPool.Pool = "node-b"
	for _, tc := range []struct {
		name  string
		claim *resourceapi.ResourceClaim
		unit  gpushare.Unit
		want  []uint64 // units per share; nil with wantErr
		err   string
	}{
		{name: "one share", claim: claim(result("gpu", 0, "20Gi")), unit: gpushare.GiB, want: []uint64{20}},
		{name: "in 256MiB units", claim: claim(result("gpu", 0, "1280Mi")), unit: 256, want: []uint64{5}},
		{name: "another driver's result is skipped", claim: claim(other, result("gpu", 1, "8Gi")), unit: gpushare.GiB, want: []uint64{8}},
		{name: "not allocated", claim: &resourceapi.ResourceClaim{}, unit: gpushare.GiB, err: "not allocated"},
		{name: "nil", claim: nil, unit: gpushare.GiB, err: "not allocated"},
		{name: "another node's pool", claim: claim(foreignPool), unit: gpushare.GiB, err: `pool "node-b" is not this node's`},
		{name: "no consumed memory", claim: claim(result("gpu", 0, "")), unit: gpushare.GiB, err: "no consumed \"memory\" capacity"},
		{name: "fraction of a unit", claim: claim(result("gpu", 0, "1536Mi")), unit: gpushare.GiB, err: "not a whole number of GiB units"},
		{name: "zero", claim: claim(result("gpu", 0, "0")), unit: gpushare.GiB, err: "not a positive whole number"},
		{name: "negative", claim: claim(result("gpu", 0, "-1Gi")), unit: gpushare.GiB, err: "not a positive whole number"},
		{name: "milli", claim: claim(result("gpu", 0, "1500m")), unit: gpushare.MiB, err: "not a positive whole number"},
		{name: "beyond MaxUnits", claim: claim(result("gpu", 0, "2Ti")), unit: gpushare.MiB, err: "more than"},
		{name: "bad unit", claim: claim(result("gpu", 0, "1Gi")), unit: 3, err: "unit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := prepare.Shares(tc.claim, gpushare.DRADriverName, node, tc.unit)
			if tc.err != "" {
				if err == nil || !errors.Is(err, prepare.ErrInvalidClaim) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want ErrInvalidClaim containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var units []uint64
			for _, s := range got {
				units = append(units, s.Units)
				if s.ShareID == nil || s.Pool != node {
					t.Errorf("share %+v lacks its share ID or pool", s)
				}
			}
			if !slices.Equal(units, tc.want) {
				t.Errorf("units %v, want %v", units, tc.want)
			}
		})
	}
}

// FuzzShares feeds arbitrary consumed quantities (they come from the API
// server, written by a scheduler): Shares never panics, and every share it
// accepts is a whole, positive number of units within MaxUnits.
func FuzzShares(f *testing.F) {
	for _, s := range []string{"1Gi", "80Gi", "1536Mi", "0", "-1", "1e3", "1.5", "9223372036854775807", "1E", "1500m"} {
		f.Add(s, uint64(1024))
	}
	f.Fuzz(func(t *testing.T, q string, unit uint64) {
		quantity, err := apiresource.ParseQuantity(q)
		if err != nil {
			return
		}
		r := result("gpu", 0, "1Gi")
		r.ConsumedCapacity[gpushare.DRACapacityMemory] = quantity
		shares, err := prepare.Shares(claim(r), gpushare.DRADriverName, node, gpushare.Unit(unit))
		if err != nil {
			return
		}
		s := shares[0]
		bytes := int64(gpushare.Unit(unit).ToMiB(s.Units)) << 20
		if s.Units == 0 || s.Units > gpushare.MaxUnits || quantity.CmpInt64(bytes) != 0 {
			t.Fatalf("%s in %dMiB units accepted as %d units", q, unit, s.Units)
		}
	})
}

func build(t *testing.T, tier gpushare.Isolation, cfg prepare.Config, results ...resourceapi.DeviceRequestAllocationResult) prepare.Answer {
	t.Helper()
	c := claim(results...)
	shares, err := prepare.Shares(c, gpushare.DRADriverName, node, cfg.Unit)
	if err != nil {
		t.Fatal(err)
	}
	ans, err := prepare.Build(prepare.Claim{UID: c.UID, Namespace: c.Namespace, Name: c.Name, CacheDir: "/var/lib/gpushare/hami-cache/claim-" + string(c.UID)},
		shares, gpus(tier), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return ans
}

func TestBuildOneGPU(t *testing.T) {
	cfg := prepare.Config{Unit: gpushare.GiB, Isolation: paths}
	for _, tc := range []struct {
		tier   gpushare.Isolation
		env    []string // must be among the edits
		mounts []string // container paths
	}{
		{gpushare.IsolationNone, []string{"GPUSHARE_ISOLATION=none"}, nil},
		{gpushare.IsolationMPS, []string{"GPUSHARE_ISOLATION=mps", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M",
			"CUDA_VISIBLE_DEVICES=" + uuids[1], "CUDA_MPS_PIPE_DIRECTORY=/run/gpushare/mps/pipe"}, []string{"/run/gpushare/mps/pipe", "/dev/shm"}},
		{gpushare.IsolationHAMiCore, []string{"GPUSHARE_ISOLATION=hami-core", "CUDA_DEVICE_MEMORY_LIMIT=20480m", "CUDA_DEVICE_MEMORY_LIMIT_0=20480m"},
			[]string{gpushare.HAMiContainerLibrary, gpushare.HAMiContainerPreload, gpushare.HAMiContainerLockDir, gpushare.HAMiContainerCacheDir}},
	} {
		t.Run(string(tc.tier), func(t *testing.T) {
			ans := build(t, tc.tier, cfg, result("gpu", 1, "20Gi"))
			s := ans.Spec
			if s.Kind != gpushare.DRACDIKind || s.Version != gpushare.DRACDISpecVersion || len(s.Devices) != 1 || s.Devices[0].Name != string(claim().UID) {
				t.Fatalf("spec %+v: want one device named by the claim's UID", s)
			}
			env := s.Devices[0].ContainerEdits.Env
			for _, want := range append([]string{"ALIYUN_COM_GPU_MEM_IDX=1", "ALIYUN_COM_GPU_MEM_CONTAINER=20", "ALIYUN_COM_GPU_MEM_POD=20",
				"ALIYUN_COM_GPU_MEM_DEV=79", "NVIDIA_VISIBLE_DEVICES=1"}, tc.env...) {
				if !slices.Contains(env, want) {
					t.Errorf("env %v lacks %s", env, want)
				}
			}
			if !slices.IsSorted(env) {
				t.Errorf("env %v not sorted", env)
			}
			var mounts []string
			for _, m := range s.Devices[0].ContainerEdits.Mounts {
				mounts = append(mounts, m.ContainerPath)
				if !filepathAbs(m.HostPath) || m.Type != "bind" || !slices.Contains(m.Options, "bind") {
					t.Errorf("mount %+v is not an absolute bind mount", m)
				}
			}
			slices.Sort(mounts)
			want := slices.Clone(tc.mounts)
			slices.Sort(want)
			if !slices.Equal(mounts, want) {
				t.Errorf("mounts %v, want %v", mounts, want)
			}
			if !slices.Equal(ans.Requests[0].CDIDevices, []string{gpushare.DRACDIKind + "=" + string(claim().UID)}) {
				t.Errorf("CDI devices %v", ans.Requests[0].CDIDevices)
			}
		})
	}
}

func filepathAbs(p string) bool { return strings.HasPrefix(p, "/") }

func TestBuildMultiGPUWithCDINames(t *testing.T) {
	for _, ids := range []gpushare.DeviceIDStrategy{gpushare.DeviceIDUUID, gpushare.DeviceIDIndex} {
		cfg := prepare.Config{Unit: gpushare.GiB, Isolation: paths, CDIGPUs: true, IDs: ids}
		ans := build(t, gpushare.IsolationMPS, cfg, result("gpus", 2, "8Gi"), result("gpus", 0, "8Gi"))
		env := ans.Spec.Devices[0].ContainerEdits.Env
		for _, want := range []string{"ALIYUN_COM_GPU_MEM_IDX=0,2", "GPUSHARE_GPU_COUNT=2", "ALIYUN_COM_GPU_MEM_CONTAINER=16",
			"NVIDIA_VISIBLE_DEVICES=void", "CUDA_VISIBLE_DEVICES=" + uuids[0] + "," + uuids[2], "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M,1=8192M"} {
			if !slices.Contains(env, want) {
				t.Errorf("%s: env %v lacks %s", ids, env, want)
			}
		}
		first, second := uuids[0], uuids[2]
		if ids == gpushare.DeviceIDIndex {
			first, second = "0", "2"
		}
		want := []string{"nvidia.com/gpu=" + first, "nvidia.com/gpu=" + second, gpushare.DRACDIKind + "=" + string(claim().UID)}
		if !slices.Equal(ans.Requests[0].CDIDevices, want) {
			t.Errorf("%s: CDI devices %v, want %v", ids, ans.Requests[0].CDIDevices, want)
		}
	}
}

func TestBuildRefuses(t *testing.T) {
	down := gpus(gpushare.IsolationMPS)
	down[0].Tier.Down, down[0].Tier.Reason = true, "the MPS control daemon does not answer"
	sick := gpus(gpushare.IsolationNone)
	sick[0].Fault = "critical Xid 79"
	mixed := gpus(gpushare.IsolationNone)
	mixed[1].Tier.Tier = gpushare.IsolationHAMiCore
	noPaths := prepare.Config{Unit: gpushare.GiB}
	ok := prepare.Config{Unit: gpushare.GiB, Isolation: paths}
	for _, tc := range []struct {
		name    string
		results []resourceapi.DeviceRequestAllocationResult
		gpus    []prepare.GPU
		cfg     prepare.Config
		err     string
	}{
		{"no share", nil, gpus(""), ok, "no device of gpu-mem.gpushare.io"},
		{"bad request of several", []resourceapi.DeviceRequestAllocationResult{result("a", 0, "1Gi"), result("b", 1, "1Gi"), result("b", 2, "2Gi")}, gpus(""), ok, `request "b": it holds 2 units of GPU 2 and 1 of another`},
		{"tiers of requests differ", []resourceapi.DeviceRequestAllocationResult{result("a", 0, "1Gi"), result("b", 1, "1Gi")}, mixed, ok, "different isolation tiers"},
		{"same GPU twice", []resourceapi.DeviceRequestAllocationResult{result("a", 0, "1Gi"), result("a", 0, "1Gi")}, gpus(""), ok, "twice"},
		{"uneven", []resourceapi.DeviceRequestAllocationResult{result("a", 0, "1Gi"), result("a", 1, "2Gi")}, gpus(""), ok, "alike"},
		{"larger than the GPU", []resourceapi.DeviceRequestAllocationResult{result("a", 0, "80Gi")}, gpus(""), ok, "which has 79"},
		{"unknown device", []resourceapi.DeviceRequestAllocationResult{result("a", 0, "1Gi")}, gpus("")[1:], ok, "not one of this node's GPUs"},
		{"unhealthy", []resourceapi.DeviceRequestAllocationResult{result("a", 0, "1Gi")}, sick, ok, "unhealthy: critical Xid 79"},
		{"tier down", []resourceapi.DeviceRequestAllocationResult{result("a", 0, "1Gi")}, down, ok, `isolation tier unavailable: GPU 0 is configured for isolation tier "mps", which is down: the MPS control daemon does not answer`},
		{"mixed tiers", []resourceapi.DeviceRequestAllocationResult{result("a", 0, "1Gi"), result("a", 1, "1Gi")}, mixed, ok, "different isolation tiers"},
		{"tier without paths", []resourceapi.DeviceRequestAllocationResult{result("a", 0, "1Gi")}, gpus(gpushare.IsolationMPS), noPaths, "isolation tier mps"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := claim(tc.results...)
			shares, err := prepare.Shares(c, gpushare.DRADriverName, node, gpushare.GiB)
			if err != nil {
				t.Fatal(err)
			}
			_, err = prepare.Build(prepare.Claim{UID: c.UID, Namespace: "default", Name: "c"}, shares, tc.gpus, tc.cfg)
			if !errors.Is(err, prepare.ErrInvalidClaim) || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("err %v, want ErrInvalidClaim containing %q", err, tc.err)
			}
		})
	}
	if _, err := prepare.Build(prepare.Claim{UID: "../x"}, nil, gpus(""), ok); !errors.Is(err, prepare.ErrInvalidClaim) {
		t.Errorf("UID ../x: err %v, want ErrInvalidClaim", err)
	}
}

// TestBuildSeveralRequests: a claim of several requests (the webhook's pod of several containers)
// gives each request's containers a CDI device of their own, with their own units and the tier's
// limit for exactly those, and _POD the claim's total; the GPU matched by all of them is the same.
func TestBuildSeveralRequests(t *testing.T) {
	cfg := prepare.Config{Unit: gpushare.GiB, Isolation: paths}
	c := claim(result("gpu-0", 1, "3Gi"), result("gpu-1", 1, "2Gi"), result("gpu-2/big", 0, "4Gi"), result("gpu-2/big", 2, "4Gi"))
	shares, err := prepare.Shares(c, gpushare.DRADriverName, node, cfg.Unit)
	if err != nil {
		t.Fatal(err)
	}
	pc := prepare.Claim{UID: c.UID, Namespace: c.Namespace, Name: c.Name, CacheDir: "/var/lib/gpushare/hami-cache/claim-" + string(c.UID),
		Params: map[string]prepare.Params{"gpu-1": {ComputePercent: 20}}}
	ans, err := prepare.Build(pc, shares, gpus(gpushare.IsolationHAMiCore), cfg)
	if err != nil {
		t.Fatal(err)
	}
	type want struct {
		request, device string
		env             []string
		cacheDir        string
	}
	wants := []want{
		{"gpu-0", string(c.UID) + "-gpu-0", []string{"ALIYUN_COM_GPU_MEM_IDX=1", "ALIYUN_COM_GPU_MEM_CONTAINER=3", "ALIYUN_COM_GPU_MEM_POD=13", "CUDA_DEVICE_MEMORY_LIMIT_0=3072m"}, pc.CacheDir + "/gpu-0"},
		{"gpu-1", string(c.UID) + "-gpu-1", []string{"ALIYUN_COM_GPU_MEM_IDX=1", "ALIYUN_COM_GPU_MEM_CONTAINER=2", "ALIYUN_COM_GPU_MEM_POD=13", "CUDA_DEVICE_MEMORY_LIMIT_0=2048m", "CUDA_DEVICE_SM_LIMIT=20"}, pc.CacheDir + "/gpu-1"},
		{"gpu-2", string(c.UID) + "-gpu-2", []string{"ALIYUN_COM_GPU_MEM_IDX=0,2", "ALIYUN_COM_GPU_MEM_CONTAINER=8", "ALIYUN_COM_GPU_MEM_POD=13", "CUDA_DEVICE_MEMORY_LIMIT_1=4096m"}, pc.CacheDir + "/gpu-2"},
	}
	if len(ans.Requests) != len(wants) || len(ans.Spec.Devices) != len(wants) {
		t.Fatalf("%d requests, %d CDI devices; want %d of each", len(ans.Requests), len(ans.Spec.Devices), len(wants))
	}
	for i, w := range wants {
		r, d := ans.Requests[i], ans.Spec.Devices[i]
		if r.Request != w.request || d.Name != w.device || !slices.Equal(r.CDIDevices, []string{gpushare.DRACDIKind + "=" + w.device}) {
			t.Errorf("request %d: %s, CDI device %s, IDs %v; want %s, %s", i, r.Request, d.Name, r.CDIDevices, w.request, w.device)
		}
		for _, e := range w.env {
			if !slices.Contains(d.ContainerEdits.Env, e) {
				t.Errorf("%s: env %v lacks %s", w.request, d.ContainerEdits.Env, e)
			}
		}
		if r.CacheDir != w.cacheDir {
			t.Errorf("%s: cache directory %s, want %s", w.request, r.CacheDir, w.cacheDir)
		}
		if w.request != "gpu-1" && slices.ContainsFunc(d.ContainerEdits.Env, func(e string) bool { return strings.HasPrefix(e, "CUDA_DEVICE_SM_LIMIT=") }) {
			t.Errorf("%s got gpu-1's compute share: %v", w.request, d.ContainerEdits.Env)
		}
	}
}

func TestOvercommit(t *testing.T) {
	capacity := map[string]uint64{dev(0): 79, dev(1): 79}
	prepared := map[types.UID][]prepare.Share{
		"a": {{Device: dev(0), Units: 40}},
		"b": {{Device: dev(0), Units: 30}, {Device: dev(1), Units: 30}},
	}
	if err := prepare.Overcommit(prepared, []prepare.Share{{Device: dev(0), Units: 9}}, capacity); err != nil {
		t.Errorf("79 of 79: %v", err)
	}
	err := prepare.Overcommit(prepared, []prepare.Share{{Device: dev(0), Units: 10}}, capacity)
	if !errors.Is(err, prepare.ErrInvalidClaim) || !strings.Contains(err.Error(), "would hold 80") || !strings.Contains(err.Error(), "[a=40 b=30]") {
		t.Errorf("80 of 79: %v", err)
	}
	// Two requests of one claim on one GPU count twice.
	if err := prepare.Overcommit(nil, []prepare.Share{{Device: dev(1), Units: 40}, {Device: dev(1), Units: 40}}, capacity); err == nil || !strings.Contains(err.Error(), "would hold 80") {
		t.Errorf("two shares of 40 on a GPU of 79: %v", err)
	}
	if err := prepare.Overcommit(nil, []prepare.Share{{Device: "gpu-gone", Units: 1}}, capacity); err == nil {
		t.Error("a device without capacity was accepted")
	}
}
