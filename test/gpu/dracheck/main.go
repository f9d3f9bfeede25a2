// Command dracheck runs gpushare's DRA driver (plugin/dra) on a real GPU
// with the real NVML backend and the mps isolation tier, as the kubelet
// would use it, and prints what it saw, as text worth committing.
// test/gpu/run.sh builds and runs it after mpscheck; it needs root (compute
// modes) and the NVIDIA driver.
//
// It starts plugin/mps's control daemon on the GPU and runs dra.Run against
// a fake API server holding the node; prints the GPU's device in the
// published ResourceSlice; prepares two claims allocated on it (-small-gib
// and -large-gib of consumed memory) over the driver's dra.sock with the
// kubelet's dra/v1 API; checks each claim's CDI specification carries the
// MPS limit of its memory and the GPU's UUID; runs the CUDA client (which
// allocates -alloc-gib) with each specification's environment; and
// unprepares both. Then it shows a hami-core configuration's limit in a
// prepared specification, on placeholder HAMi-core files, without a client.
//
// Verdict: PASS when the device is published with the mps tier, both claims
// are prepared with their limits, the client under the smaller claim fails
// with out-of-memory (exit 2) and under the larger succeeds (exit 0), both
// specifications are gone after Unprepare, the hami-core specification
// holds its limit, and the daemon stops with the compute mode put back.
// Exit status 0 on PASS, 1 otherwise.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/gpushare/gpushare/plugin/mps"
	"github.com/gpushare/gpushare/plugin/nvml"
	"github.com/gpushare/gpushare/test/gpu/internal/client"
	"github.com/gpushare/gpushare/test/gpu/internal/daemon"
	"github.com/gpushare/gpushare/test/gpu/internal/report"
)

// options are the command line.
type options struct {
	backend            string
	controlBin         string
	work               string
	gpu                int
	client             client.Client
	smallGiB, largeGiB int
	driverTimeout      time.Duration
}

func main() {
	var o options
	var cmd string
	var allocGiB int
	var timeout time.Duration
	flag.StringVar(&o.backend, "backend", nvml.BackendNVML, "NVML backend; simulated:* only for run.sh's dry run")
	flag.StringVar(&o.controlBin, "control", mps.DefaultControlBin, "nvidia-cuda-mps-control")
	flag.StringVar(&o.work, "work", "", "directory for the MPS daemon's and the driver's files (required; keep it short: socket paths)")
	flag.IntVar(&o.gpu, "gpu", 0, "NVML index of the GPU to test")
	flag.StringVar(&cmd, "client", "", "client command; the allocation size in GiB is appended (empty: none could be built, a failure)")
	flag.IntVar(&allocGiB, "alloc-gib", 30, "GiB the client allocates")
	flag.IntVar(&o.smallGiB, "small-gib", 20, "GiB of the claim under which the allocation must fail")
	flag.IntVar(&o.largeGiB, "large-gib", 40, "GiB of the claim under which the allocation must succeed")
	flag.DurationVar(&timeout, "client-timeout", 3*time.Minute, "how long one client may run")
	flag.DurationVar(&o.driverTimeout, "driver-timeout", time.Minute, "how long the driver may take to serve, publish, or stop")
	flag.Parse()
	o.client = client.New(cmd, allocGiB, timeout)
	work, err := filepath.Abs(o.work)
	if o.work == "" || err != nil {
		flag.Usage()
		os.Exit(2)
	}
	o.work = work
	if !run(o) {
		os.Exit(1)
	}
}

// run performs the whole check and reports whether it passed.
func run(o options) bool {
	r := &report.Report{}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	log := report.NewLogger()
	defer log.Sync()

	lib, err := nvml.New(log, o.backend)
	if !r.Check("open NVML", err == nil, report.ErrText(err, "backend "+o.backend)) {
		return r.Verdict()
	}
	defer lib.Shutdown()
	if lib.Simulated() {
		r.Say("SIMULATED NVML and MPS: a dry run of the script, which proves nothing about a real GPU")
	}
	gpu, before, ok := daemon.PickGPU(r, lib, o.gpu)
	if !ok || !sizesSane(r, o, gpu) {
		return r.Verdict()
	}
	d := daemon.New(lib, log, o.controlBin, o.work, gpu.UUID)
	if daemon.Start(ctx, r, d, lib, gpu.UUID) {
		mpsTier(ctx, r, o, lib, log, d, gpu)
	}
	daemon.Stop(r, d, lib, gpu.UUID, before)
	hamiTier(ctx, r, o, lib, log, gpu)
	daemon.ShowLogs(r, daemon.LogDir(o.work))
	return r.Verdict()
}

// sizesSane checks the allocation lies between the two claims, on the GPU.
func sizesSane(r *report.Report, o options, gpu nvml.GPU) bool {
	alloc := o.client.AllocGiB
	sane := 0 < o.smallGiB && o.smallGiB < alloc && alloc < o.largeGiB && uint64(o.smallGiB+o.largeGiB)*1024 <= gpu.MemoryMiB
	return r.Check("test sizes", sane, fmt.Sprintf("allocate %d GiB under claims of %d GiB (must fail) and %d GiB (must succeed), together on a %d MiB GPU",
		alloc, o.smallGiB, o.largeGiB, gpu.MemoryMiB))
}

// mpsTier runs the driver in the mps tier with the daemon d: the slice, the
// two claims prepared, the client under each, and both unprepared.
func mpsTier(ctx context.Context, r *report.Report, o options, lib nvml.Library, log *zap.Logger, d *mps.Daemon, gpu nvml.GPU) {
	r.Section("DRA driver in the mps tier (plugin/dra Run)")
	drv, ok := startDriver(ctx, r, o, lib, log, filepath.Join(o.work, "mps"), mpsIsolation(d, o.work))
	if !ok {
		return
	}
	defer drv.stop(r, o.driverTimeout)
	device, ok := drv.showDevice(ctx, r, gpu, "mps", o.driverTimeout)
	if !ok {
		return
	}
	claims := []*claim{newClaim(o.smallGiB, device), newClaim(o.largeGiB, device)}
	if !drv.prepare(ctx, r, claims) {
		drv.unprepare(ctx, r, claims)
		return
	}
	for _, c := range claims {
		checkMPSEnv(r, c, gpu.UUID)
	}
	runClients(ctx, r, o, claims)
	drv.unprepare(ctx, r, claims)
}

// runClients runs the client with each claim's specification env.
func runClients(ctx context.Context, r *report.Report, o options, claims []*claim) {
	if !o.client.Built() {
		r.Check("CUDA clients", false, "none could be built (see above): the claims' limits were not checked")
		return
	}
	for _, c := range claims {
		r.Section(fmt.Sprintf("Client under %s (CDI env of a %d GiB claim)", c.obj.Name, c.gib))
		want := client.ExitAllocated
		if c.gib < o.client.AllocGiB {
			want = client.ExitOutOfMemory
		}
		got := o.client.Run(ctx, r, c.env)
		r.Check(fmt.Sprintf("client under %s allocating %d GiB", c.obj.Name, o.client.AllocGiB), got == want, client.ExitMeaning(got, want))
	}
}
