package gpushare_test

import (
	"slices"
	"testing"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

// The limits device's edits and name are a function of the variables alone,
// and the name is pinned: a running container's checkpointed answer names it,
// so a plugin that named the same edits otherwise after an upgrade would
// write a second device for them (harmless) but must never give an old name
// other edits (CDILimitsDeviceMatches guards that on read).
func TestCDILimitsDevice(t *testing.T) {
	envs := map[string]string{
		gpushare.EnvHAMiSharedCache: gpushare.HAMiContainerCacheFile,
		gpushare.EnvHAMiMemoryLimit: "4096m",
	}
	edits := gpushare.CDILimitsEnv(envs)
	want := []string{"CUDA_DEVICE_MEMORY_LIMIT=4096m", "CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/gpushare/cudevshr.cache"}
	if !slices.Equal(edits, want) {
		t.Fatalf("edits %q; want %q", edits, want)
	}
	// sha256 of the edits joined by newlines: bd85dafd33667a6faea8ad000f1d9946…
	name := gpushare.CDILimitsDeviceName(gpushare.IsolationHAMiCore, edits)
	if name != "hami-core-bd85dafd33667a6faea8ad000f1d9946" {
		t.Errorf("name %s", name)
	}
	if q := gpushare.CDILimitsDevice(name); q != "gpushare.io/limits=hami-core-bd85dafd33667a6faea8ad000f1d9946" {
		t.Errorf("qualified name %s", q)
	}
	if !gpushare.CDILimitsDeviceMatches(name, edits) {
		t.Error("the name does not match its own edits")
	}
	for _, other := range [][]string{
		{"CUDA_DEVICE_MEMORY_LIMIT=40960m", "CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/gpushare/cudevshr.cache"},
		{"CUDA_DEVICE_MEMORY_LIMIT=4096m"},
		{"CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/gpushare/cudevshr.cache", "CUDA_DEVICE_MEMORY_LIMIT=4096m"},
	} {
		if gpushare.CDILimitsDeviceMatches(name, other) {
			t.Errorf("%s matches the edits %q", name, other)
		}
	}
	if mps := gpushare.CDILimitsDeviceName(gpushare.IsolationMPS, edits); mps == name || !gpushare.CDILimitsDeviceMatches(mps, edits) {
		t.Errorf("mps name %s", mps)
	}
	if gpushare.CDILimitsDeviceMatches("none-"+name[len("hami-core-"):], edits) {
		t.Error("a tier that does not limit matches")
	}
	if gpushare.CDILimitsAnnotationKey != "cdi.k8s.io/gpushare-device-plugin_limits" {
		t.Errorf("annotation key %s", gpushare.CDILimitsAnnotationKey)
	}
}
