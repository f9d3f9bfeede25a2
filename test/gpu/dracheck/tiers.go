package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"go.uber.org/zap"

	"github.com/gpushare/gpushare/plugin/dra"
	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/isolation"
	"github.com/gpushare/gpushare/plugin/mps"
	"github.com/gpushare/gpushare/plugin/nvml"
	"github.com/gpushare/gpushare/test/gpu/internal/report"
)

// mpsIsolation is the mps tier on the daemon d. The client runs on the
// host, as the daemon does, so both use the host's /dev/shm; the shm
// directory is what a container would get there.
func mpsIsolation(d *mps.Daemon, work string) dra.IsolationConfig {
	return dra.IsolationConfig{Tier: gpushare.IsolationMPS, MPS: d,
		Paths: isolation.Config{MPSPipeDir: d.PipeDir(), MPSShmDir: filepath.Join(work, "shm")}}
}

// hamiTier runs the driver in the hami-core tier and shows a claim's limit
// in its prepared specification. HAMi-core is not installed: the library
// is a placeholder file, enough for the tier's probe, and no client runs.
func hamiTier(ctx context.Context, r *report.Report, o options, lib nvml.Library, log *zap.Logger, gpu nvml.GPU) {
	r.Section("DRA driver in the hami-core tier (placeholder library: the specification only, no client)")
	root := filepath.Join(o.work, "hami")
	paths, err := hamiFiles(root)
	if !r.Check("hami-core placeholder files", err == nil, report.ErrText(err, paths.HAMiLibrary+", "+paths.HAMiPreload)) {
		return
	}
	drv, ok := startDriver(ctx, r, o, lib, log, root, dra.IsolationConfig{Tier: gpushare.IsolationHAMiCore, Paths: paths})
	if !ok {
		return
	}
	defer drv.stop(r, o.driverTimeout)
	device, ok := drv.showDevice(ctx, r, gpu, string(gpushare.IsolationHAMiCore), o.driverTimeout)
	if !ok {
		return
	}
	c := newClaim(o.smallGiB, device)
	if drv.prepare(ctx, r, []*claim{c}) {
		checkEnv(r, c, gpushare.EnvHAMiMemoryLimit, fmt.Sprintf("%dm", c.gib*1024))
	}
	drv.unprepare(ctx, r, []*claim{c})
}

// hamiFiles writes what the hami-core tier's probe requires under root: a
// non-empty library (a placeholder), the preload file naming the library's
// path in containers, the lock directory and the cache root.
func hamiFiles(root string) (isolation.Config, error) {
	p := isolation.Config{HAMiLibrary: filepath.Join(root, "libvgpu.so"), HAMiPreload: filepath.Join(root, "ld.so.preload"),
		HAMiLockDir: filepath.Join(root, "lock"), HAMiCacheRoot: filepath.Join(root, "cache")}
	for _, dir := range []string{p.HAMiLockDir, p.HAMiCacheRoot} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return p, err
		}
	}
	if err := os.WriteFile(p.HAMiLibrary, []byte("placeholder, not HAMi-core: dracheck only reads the specification\n"), 0o644); err != nil {
		return p, err
	}
	return p, os.WriteFile(p.HAMiPreload, []byte(gpushare.HAMiContainerLibrary+"\n"), 0o644)
}
