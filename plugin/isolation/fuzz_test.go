package isolation_test

import (
	"errors"
	"maps"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/isolation"
)

var fuzzTiers = []gpushare.Isolation{"", gpushare.IsolationNone, gpushare.IsolationMPS, gpushare.IsolationHAMiCore, gpushare.IsolationAny, "cgpu"}

// FuzzAnswer checks For against an independent reading of the tiers: it
// answers exactly the requests a tier can serve; the limit is the
// container's units times the unit, in MiB; MPS names the GPU by its UUID,
// never an ordinal; the answer is the same however often it is asked and
// whatever the pod-level inputs it must not depend on (the GPU index, the
// pod's and the GPU's units), and never overrides the contract's variables.
func FuzzAnswer(f *testing.F) {
	f.Add(uint8(2), uint64(20), uint16(1024), int8(0), uuid, uint8(3), cacheDir)
	f.Add(uint8(2), uint64(3), uint16(256), int8(30), uuid, uint8(0), "")
	f.Add(uint8(3), uint64(1500), uint16(1), int8(100), "", uint8(7), cacheDir)
	f.Add(uint8(3), uint64(1), uint16(1024), int8(0), uuid, uint8(1), "relative")
	f.Add(uint8(1), uint64(4), uint16(1024), int8(5), uuid, uint8(1), cacheDir)
	f.Add(uint8(2), uint64(4), uint16(1024), int8(0), "0", uint8(0), cacheDir)
	f.Add(uint8(0), uint64(4), uint16(1024), int8(0), "", uint8(0), "")
	f.Fuzz(func(t *testing.T, tierIdx uint8, units uint64, unit uint16, percent int8, gpuUUID string, gpu uint8, cache string) {
		e := gpushare.ContainerEnv{GPUIndex: int(gpu % 64), PodUnits: units, ContainerUnits: units, DevUnits: units,
			Isolation: fuzzTiers[int(tierIdx)%len(fuzzTiers)], ComputePercent: int(percent)}
		r := isolation.Request{Env: e, UUIDs: []string{gpuUUID}, Unit: gpushare.Unit(unit), CacheDir: cache}
		a, err := isolation.For(cfg, r)
		if serves := servable(r); (err == nil) != serves {
			t.Fatalf("For(%+v) = %+v, %v; the tier can serve it: %v", r, a, err, serves)
		}
		if err != nil {
			if !errors.Is(err, isolation.ErrInvalidAnswer) {
				t.Fatalf("error %v is not ErrInvalidAnswer", err)
			}
			return
		}
		checkAnswer(t, r, a)
		// Pod-level inputs that are not the tier's must not change the answer.
		other := r
		other.Env.GPUIndex, other.Env.PodUnits, other.Env.DevUnits, other.Env.DisableIsolation = (r.Env.GPUIndex+1)%64, units+7, units+9, true
		again, err := isolation.For(cfg, other)
		if err != nil || !maps.Equal(again.Envs, a.Envs) || !equalMounts(again.Mounts, a.Mounts) {
			t.Fatalf("the answer changed with the GPU index or the pod's units: %+v, %v; then %+v", again, err, a)
		}
	})
}

// servable is an independent reading of what For must answer.
func servable(r isolation.Request) bool {
	p, t := r.Env.ComputePercent, r.Env.Isolation
	if p < 0 || p > 100 || (p > 0 && t != gpushare.IsolationMPS && t != gpushare.IsolationHAMiCore) {
		return false
	}
	sized := r.Env.ContainerUnits >= 1 && r.Env.ContainerUnits <= gpushare.MaxUnits && r.Unit.Valid()
	switch t {
	case "", gpushare.IsolationNone:
		return true
	case gpushare.IsolationMPS:
		return sized && len(r.UUIDs) == 1 && strings.HasPrefix(r.UUIDs[0], "GPU-") && !strings.ContainsAny(r.UUIDs[0], "=, ")
	case gpushare.IsolationHAMiCore:
		return sized && filepath.IsAbs(r.CacheDir) && filepath.Clean(r.CacheDir) == r.CacheDir
	}
	return false
}

// checkAnswer checks a served answer against the request.
func checkAnswer(t *testing.T, r isolation.Request, a isolation.Answer) {
	t.Helper()
	mib := strconv.FormatUint(r.Env.ContainerUnits*uint64(r.Unit), 10)
	for k := range r.Env.Map() {
		if _, clash := a.Envs[k]; clash {
			t.Fatalf("the tier's answer sets the contract's %s", k)
		}
	}
	seen := map[string]bool{}
	for _, m := range a.Mounts {
		if seen[m.ContainerPath] || !filepath.IsAbs(m.ContainerPath) || !filepath.IsAbs(m.HostPath) {
			t.Fatalf("mount %v repeated or not absolute", m)
		}
		seen[m.ContainerPath] = true
	}
	share := ""
	if r.Env.ComputePercent > 0 {
		share = strconv.Itoa(r.Env.ComputePercent)
	}
	switch r.Env.Isolation {
	case "", gpushare.IsolationNone:
		if len(a.Envs) != 0 || len(a.Mounts) != 0 {
			t.Fatalf("tier %q adds %+v", r.Env.Isolation, a)
		}
	case gpushare.IsolationMPS:
		// The client sees only its GPU, as ordinal 0.
		dev, limit, _ := strings.Cut(a.Envs[gpushare.EnvMPSPinnedDeviceMemLimit], "=")
		visible := a.Envs[gpushare.EnvCUDAVisibleDevices]
		if dev != "0" || visible != r.UUIDs[0] || !strings.HasPrefix(visible, "GPU-") || limit != mib+"M" || a.Envs[gpushare.EnvMPSActiveThreadPercentage] != share {
			t.Fatalf("mps answer %v for %d units of %s on %s", a.Envs, r.Env.ContainerUnits, r.Unit, r.UUIDs)
		}
		if !seen[gpushare.MPSContainerShmDir] || !seen[a.Envs[gpushare.EnvMPSPipeDirectory]] {
			t.Fatalf("mps mounts %v lack the pipe directory or /dev/shm", a.Mounts)
		}
	case gpushare.IsolationHAMiCore:
		if a.Envs[gpushare.EnvHAMiMemoryLimit] != mib+"m" || a.Envs[gpushare.EnvHAMiSMLimit] != share ||
			filepath.Dir(a.Envs[gpushare.EnvHAMiSharedCache]) != gpushare.HAMiContainerCacheDir {
			t.Fatalf("hami-core answer %v for %d units of %s", a.Envs, r.Env.ContainerUnits, r.Unit)
		}
		for _, m := range a.Mounts {
			if m.ContainerPath == gpushare.HAMiContainerCacheDir && m.HostPath != r.CacheDir {
				t.Fatalf("cache mount %v; want the answer's own directory %s", m, r.CacheDir)
			}
		}
	}
}
