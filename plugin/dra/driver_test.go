package dra

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	resourceapi "k8s.io/api/resource/v1"
	apiresource "k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpushare/gpushare/plugin/dra/prepare"
	"github.com/gpushare/gpushare/plugin/dra/slice"
	"github.com/gpushare/gpushare/plugin/dra/store"
	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/isolation"
	"github.com/gpushare/gpushare/plugin/nvml"
)

const testNode = "node-a"

// simulated reads the GPUs of a simulated backend as Run does.
func simulated(t *testing.T, backend string) []slice.GPU {
	t.Helper()
	lib, err := nvml.NewSimulator(zaptest.NewLogger(t), backend)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lib.Shutdown() })
	base, err := readGPUs(lib, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	return base
}

// dirs are a driver's plugin data and CDI directories.
type dirs struct{ data, cdi, hami string }

func newDirs(t *testing.T) dirs {
	root := t.TempDir()
	return dirs{data: filepath.Join(root, "plugin"), cdi: filepath.Join(root, "cdi"), hami: filepath.Join(root, "hami")}
}

func testPaths(d dirs) isolation.Config {
	return isolation.Config{MPSPipeDir: "/run/gpushare/mps/pipe", MPSShmDir: "/run/gpushare/mps/shm", HAMiLibrary: "/usr/local/vgpu/libvgpu.so",
		HAMiPreload: "/usr/local/vgpu/ld.so.preload", HAMiLockDir: "/tmp/vgpulock", HAMiCacheRoot: d.hami}
}

// newTestDriver builds a driver over base in d, as Run does after its first probe.
func newTestDriver(t *testing.T, base []slice.GPU, d dirs, tier isolation.Status) *Driver {
	t.Helper()
	n, err := newNode(base, gpushare.GiB, tier)
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.New(d.data, d.cdi)
	if err != nil {
		t.Fatal(err)
	}
	drv, err := newDriver(zaptest.NewLogger(t), testNode, n, st, prepare.Config{Unit: gpushare.GiB, Isolation: testPaths(d)})
	if err != nil {
		t.Fatal(err)
	}
	return drv
}

// allocated is a claim of ours consuming memory on each of devices.
func allocated(uid types.UID, memory string, devices ...string) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{}
	c.Namespace, c.Name, c.UID = "default", "claim-"+string(uid), uid
	var results []resourceapi.DeviceRequestAllocationResult
	for _, d := range devices {
		share := types.UID("share-" + string(uid) + "-" + d)
		results = append(results, resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: gpushare.DRADriverName, Pool: testNode, Device: d,
			ShareID: &share, ConsumedCapacity: map[resourceapi.QualifiedName]apiresource.Quantity{gpushare.DRACapacityMemory: apiresource.MustParse(memory)}})
	}
	c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: results}}
	return c
}

func deviceOf(t *testing.T, g slice.GPU) string {
	name, err := slice.DeviceName(g.UUID)
	if err != nil {
		t.Fatal(err)
	}
	return name
}

func prepareOK(t *testing.T, drv *Driver, c *resourceapi.ResourceClaim) kubeletplugin.PrepareResult {
	t.Helper()
	res, err := drv.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{c})
	if err != nil || res[c.UID].Err != nil {
		t.Fatalf("Prepare %s: %v, %v", c.UID, err, res[c.UID].Err)
	}
	return res[c.UID]
}

func readSpec(t *testing.T, d dirs, uid types.UID) cdispec.Spec {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(d.cdi, "gpu-mem.gpushare.io-claim_"+string(uid)+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var s cdispec.Spec
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestPrepareIdempotentAcrossRestarts(t *testing.T) {
	base := simulated(t, "simulated:dgxh100")
	d := newDirs(t)
	drv := newTestDriver(t, base, d, isolation.Status{Tier: gpushare.IsolationHAMiCore})
	c := allocated("uid-1", "20Gi", deviceOf(t, base[3]), deviceOf(t, base[5]))
	first := prepareOK(t, drv, c)
	if len(first.Devices) != 2 || first.Devices[0].ShareID == nil || *first.Devices[0].ShareID != *c.Status.Allocation.Devices.Results[0].ShareID {
		t.Fatalf("devices %+v: want one per result with its share ID", first.Devices)
	}
	want := []string{gpushare.DRACDIKind + "=uid-1"}
	if !slices.Equal(first.Devices[0].CDIDeviceIDs, want) || len(first.Devices[1].CDIDeviceIDs) != 0 {
		t.Errorf("CDI IDs %v and %v, want %v on the first device only", first.Devices[0].CDIDeviceIDs, first.Devices[1].CDIDeviceIDs, want)
	}
	env := readSpec(t, d, "uid-1").Devices[0].ContainerEdits.Env
	for _, e := range []string{"ALIYUN_COM_GPU_MEM_IDX=3,5", "CUDA_DEVICE_MEMORY_LIMIT=20480m", "GPUSHARE_ISOLATION=hami-core", "ALIYUN_COM_GPU_MEM_CONTAINER=40"} {
		if !slices.Contains(env, e) {
			t.Errorf("spec env %v lacks %s", env, e)
		}
	}
	cache := filepath.Join(d.hami, "claim-uid-1")
	if fi, err := os.Stat(cache); err != nil || !fi.IsDir() {
		t.Errorf("claim's cache directory: %v", err)
	}

	if again := prepareOK(t, drv, c); !reflect.DeepEqual(again, first) {
		t.Errorf("second Prepare %+v, first %+v", again, first)
	}
	// A restarted driver answers the same from the checkpoint, even after
	// the tier changed and the specification went missing.
	if err := os.Remove(filepath.Join(d.cdi, "gpu-mem.gpushare.io-claim_uid-1.json")); err != nil {
		t.Fatal(err)
	}
	restarted := newTestDriver(t, base, d, isolation.Status{Tier: gpushare.IsolationNone})
	if again := prepareOK(t, restarted, c); !reflect.DeepEqual(again, first) {
		t.Errorf("Prepare after a restart %+v, first %+v", again, first)
	}
	if got := readSpec(t, d, "uid-1").Devices[0].ContainerEdits.Env; !slices.Equal(got, env) {
		t.Errorf("rewritten spec env %v, want %v", got, env)
	}

	obj := kubeletplugin.NamespacedObject{UID: "uid-1"}
	for range 2 {
		res, err := restarted.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{obj})
		if err != nil || res["uid-1"] != nil {
			t.Fatalf("Unprepare: %v, %v", err, res["uid-1"])
		}
	}
	if _, err := os.Stat(filepath.Join(d.cdi, "gpu-mem.gpushare.io-claim_uid-1.json")); !os.IsNotExist(err) {
		t.Errorf("spec still there after Unprepare: %v", err)
	}
	if _, err := os.Stat(cache); !os.IsNotExist(err) {
		t.Errorf("cache directory still there after Unprepare: %v", err)
	}
	if prepared, _ := newTestDriver(t, base, d, isolation.Status{}).store.Load(); len(prepared) != 0 {
		t.Errorf("checkpoint after Unprepare: %v", prepared)
	}
}

// TestPrepareSeveralRequests: a claim of two requests on one GPU (the webhook's pod of two
// containers) gets a CDI device per request, named by the kubelet's result of that request only, a
// HAMi-core cache directory per request, and the same answer after a restart; Unprepare removes all.
func TestPrepareSeveralRequests(t *testing.T) {
	base := simulated(t, "simulated:dgxh100")
	d := newDirs(t)
	drv := newTestDriver(t, base, d, isolation.Status{Tier: gpushare.IsolationHAMiCore})
	gpu := deviceOf(t, base[2])
	c := allocated("uid-2", "3Gi", gpu)
	second := allocated("uid-2", "2Gi", gpu).Status.Allocation.Devices.Results[0]
	second.Request = "gpu-1"
	c.Status.Allocation.Devices.Results[0].Request = "gpu-0"
	c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results, second)

	first := prepareOK(t, drv, c)
	if len(first.Devices) != 2 {
		t.Fatalf("devices %+v: want one per result", first.Devices)
	}
	for i, req := range []string{"gpu-0", "gpu-1"} {
		dev := first.Devices[i]
		want := []string{gpushare.DRACDIKind + "=uid-2-" + req}
		if !slices.Equal(dev.Requests, []string{req}) || !slices.Equal(dev.CDIDeviceIDs, want) {
			t.Errorf("device %d: requests %v, CDI IDs %v; want [%s], %v", i, dev.Requests, dev.CDIDeviceIDs, req, want)
		}
		if fi, err := os.Stat(filepath.Join(d.hami, "claim-uid-2", req)); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o777 {
			t.Errorf("%s's cache directory: %v, %v", req, fi, err)
		}
	}
	spec := readSpec(t, d, "uid-2")
	if len(spec.Devices) != 2 || !slices.Contains(spec.Devices[1].ContainerEdits.Env, "CUDA_DEVICE_MEMORY_LIMIT=2048m") ||
		!slices.Contains(spec.Devices[1].ContainerEdits.Env, "ALIYUN_COM_GPU_MEM_POD=5") {
		t.Errorf("spec %+v: want two devices, the second limited to 2 GiB of a pod of 5", spec.Devices)
	}
	restarted := newTestDriver(t, base, d, isolation.Status{Tier: gpushare.IsolationHAMiCore})
	if again := prepareOK(t, restarted, c); !reflect.DeepEqual(again, first) {
		t.Errorf("Prepare after a restart %+v, first %+v", again, first)
	}
	// The GPU holds 5 of its units for this claim: one unit more than the rest is refused, the rest fits.
	capacity := restarted.capacity()[gpu]
	if res, _ := restarted.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{allocated("uid-3", fmt.Sprintf("%dGi", capacity-4), gpu)}); res["uid-3"].Err == nil {
		t.Errorf("a claim of %d units beside the two requests' 5 on a GPU of %d was prepared", capacity-4, capacity)
	}
	prepareOK(t, restarted, allocated("uid-3", fmt.Sprintf("%dGi", capacity-5), gpu))
	res, err := restarted.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{{UID: "uid-2"}})
	if err != nil || res["uid-2"] != nil {
		t.Fatalf("Unprepare: %v, %v", err, res["uid-2"])
	}
	if _, err := os.Stat(filepath.Join(d.hami, "claim-uid-2")); !os.IsNotExist(err) {
		t.Errorf("cache directories still there after Unprepare: %v", err)
	}
}

// TestCheckpointOfOneRequestUnchanged: a claim of one request checkpoints its CDI IDs in the
// first form (cdiDevices), so a driver of the previous version reads what this one wrote.
func TestCheckpointOfOneRequestUnchanged(t *testing.T) {
	base := simulated(t, "simulated:dgxh100")
	d := newDirs(t)
	drv := newTestDriver(t, base, d, isolation.Status{Tier: gpushare.IsolationNone})
	prepareOK(t, drv, allocated("uid-4", "4Gi", deviceOf(t, base[0])))
	b, err := os.ReadFile(filepath.Join(d.data, store.CheckpointFile))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"cdiDevices":["`+gpushare.DRACDIKind+`=uid-4"]`) || strings.Contains(string(b), "requestCDIDevices") {
		t.Errorf("checkpoint %s: want the claim's CDI IDs in cdiDevices alone", b)
	}
}

func TestUnprepareUnknownAndBadUID(t *testing.T) {
	drv := newTestDriver(t, simulated(t, "simulated:dgxh100"), newDirs(t), isolation.Status{Tier: gpushare.IsolationNone})
	res, err := drv.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{{UID: "never-prepared"}, {UID: "../../etc"}})
	if err != nil || res["never-prepared"] != nil {
		t.Errorf("Unprepare of an unknown claim: %v, %v", err, res["never-prepared"])
	}
	if res["../../etc"] == nil {
		t.Error("Unprepare accepted a UID that leaves the directory")
	}
}

func TestPrepareRefuses(t *testing.T) {
	base := simulated(t, "simulated:dgxh100")
	dev0 := deviceOf(t, base[0])
	for _, tc := range []struct {
		name  string
		tier  isolation.Status
		claim *resourceapi.ResourceClaim
		sick  bool
		err   string
	}{
		{"tier down", isolation.Status{Tier: gpushare.IsolationMPS, Down: true, Reason: "the MPS control daemon does not answer"},
			allocated("u1", "4Gi", dev0), false, "isolation tier unavailable"},
		{"fraction of a unit", isolation.Status{Tier: gpushare.IsolationNone}, allocated("u2", "1536Mi", dev0), false, "not a whole number of GiB units"},
		{"tainted GPU", isolation.Status{Tier: gpushare.IsolationNone}, allocated("u3", "4Gi", dev0), true, "unhealthy: critical Xid 79"},
		{"over the GPU", isolation.Status{Tier: gpushare.IsolationNone}, allocated("u4", "81Gi", dev0), false, "has 80 units and would hold 81"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newDirs(t)
			drv := newTestDriver(t, base, d, tc.tier)
			if tc.sick {
				drv.node.health(nvml.HealthEvent{Index: 0, UUID: base[0].UUID, Xid: 79, Cause: nvml.CauseFatal, Reason: "critical Xid 79"}, time.Now())
			}
			res, err := drv.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{tc.claim})
			if err != nil || res[tc.claim.UID].Err == nil || !strings.Contains(res[tc.claim.UID].Err.Error(), tc.err) {
				t.Fatalf("Prepare: %v, %v; want a claim error containing %q", err, res[tc.claim.UID].Err, tc.err)
			}
			if entries, _ := os.ReadDir(d.cdi); len(entries) != 0 {
				t.Errorf("a refused claim left %d files in the CDI directory", len(entries))
			}
		})
	}
}

func TestPrepareRefusesOvercommitAcrossClaims(t *testing.T) {
	base := simulated(t, "simulated:dgxh100")
	drv := newTestDriver(t, base, newDirs(t), isolation.Status{Tier: gpushare.IsolationNone})
	dev := deviceOf(t, base[1])
	prepareOK(t, drv, allocated("a", "40Gi", dev))
	prepareOK(t, drv, allocated("b", "40Gi", dev))
	c := allocated("c", "1Gi", dev)
	res, _ := drv.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{c})
	if res["c"].Err == nil || !strings.Contains(res["c"].Err.Error(), "[a=40 b=40]") {
		t.Errorf("81st GiB of an 80 GiB GPU: %v", res["c"].Err)
	}
}

func TestMIGSkippedAndPublished(t *testing.T) {
	base := simulated(t, "simulated:mixed:mig=1")
	for _, g := range base {
		if g.Index == 1 {
			t.Fatalf("GPU 1 in MIG mode is published: %+v", g)
		}
	}
	n, err := newNode(base, gpushare.GiB, isolation.Status{Tier: gpushare.IsolationNone})
	if err != nil {
		t.Fatal(err)
	}
	devs, err := slice.Devices(n.publish(), gpushare.GiB)
	if err != nil || len(devs) != len(base) {
		t.Fatalf("devices %d, %v; want %d", len(devs), err, len(base))
	}
}

func TestHealthTaints(t *testing.T) {
	base := simulated(t, "simulated:dgxh100")
	n, err := newNode(base, gpushare.GiB, isolation.Status{Tier: gpushare.IsolationNone})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for _, ev := range []nvml.HealthEvent{
		{UUID: base[0].UUID, Xid: 48, Cause: nvml.CauseFatal, Reason: "critical Xid 48"},
		{UUID: base[0].UUID, Xid: 62, Cause: nvml.CauseTransient, Reason: "critical Xid 62"}, // weaker: the fatal taint stays
		{UUID: base[1].UUID, Xid: 79, Cause: nvml.CauseFatal, Reason: "critical Xid 79"},
		{UUID: base[2].UUID, Cause: nvml.CauseFatal, Reason: "GPU is lost (NVML ERROR_GPU_IS_LOST)"},
		{UUID: base[3].UUID, Xid: 62, Cause: nvml.CauseTransient, Reason: "critical Xid 62"},
		{UUID: base[4].UUID, Cause: nvml.CauseUnwatched, Reason: "health watch unavailable"},
		{UUID: base[5].UUID, Cause: nvml.CauseUnwatched, Reason: "health watch unavailable"},
		{UUID: base[5].UUID, Cause: nvml.CauseWatched, Reason: "watched"},
	} {
		if _, _, err := n.health(ev, now); err != nil {
			t.Fatal(err)
		}
	}
	<-n.Changed()
	want := map[int]string{0: "NoSchedule fatal-xid-48", 1: "NoExecute lost", 2: "NoExecute lost", 3: "NoSchedule transient-xid-62", 4: "NoSchedule unwatched"}
	for _, g := range n.publish() {
		got := ""
		if g.Fault != nil {
			got = string(g.Fault.Effect) + " " + g.Fault.Value
		}
		if got != want[g.Index] {
			t.Errorf("GPU %d taint %q, want %q", g.Index, got, want[g.Index])
		}
	}
}
