// Command mpscheck runs gpushare's MPS daemon management (plugin/mps) on a
// real GPU with the real NVML backend, runs two CUDA clients under the limits
// the device plugin's Allocate writes, and prints what it saw, as text worth
// committing. test/gpu/run.sh builds and runs it; it needs root (compute
// modes) and the NVIDIA driver.
//
// Verdict: PASS when the daemon starts and answers, the GPU is in
// EXCLUSIVE_PROCESS while it runs, the client limited below its allocation
// fails with out-of-memory (exit 2), the one limited above it succeeds
// (exit 0), and Stop ends the daemon and puts the compute mode back. Exit
// status 0 on PASS, 1 otherwise.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/mps"
	"github.com/gpushare/gpushare/plugin/nvml"
	"github.com/gpushare/gpushare/test/gpu/internal/client"
	"github.com/gpushare/gpushare/test/gpu/internal/daemon"
	"github.com/gpushare/gpushare/test/gpu/internal/report"
)

// options are the command line.
type options struct {
	backend       string
	controlBin    string
	work          string
	gpu           int
	client        client.Client
	oomMiB, okMiB int
}

func main() {
	var o options
	var cmd string
	var allocGiB int
	var timeout time.Duration
	flag.StringVar(&o.backend, "backend", nvml.BackendNVML, "NVML backend; simulated:* only for run.sh's dry run")
	flag.StringVar(&o.controlBin, "control", mps.DefaultControlBin, "nvidia-cuda-mps-control")
	flag.StringVar(&o.work, "work", "", "directory for the MPS pipe and log directories (required; keep it short: socket paths)")
	flag.IntVar(&o.gpu, "gpu", 0, "NVML index of the GPU to test")
	flag.StringVar(&cmd, "client", "", "client command; the allocation size in GiB is appended (empty: none could be built, a failure)")
	flag.IntVar(&allocGiB, "alloc-gib", 30, "GiB each client allocates")
	flag.IntVar(&o.oomMiB, "limit-oom", 20480, "MiB limit under which the allocation must fail")
	flag.IntVar(&o.okMiB, "limit-ok", 40960, "MiB limit under which the allocation must succeed")
	flag.DurationVar(&timeout, "client-timeout", 3*time.Minute, "how long one client may run")
	flag.Parse()
	o.client = client.New(cmd, allocGiB, timeout)
	if o.work == "" {
		flag.Usage()
		os.Exit(2)
	}
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
	if started := daemon.Start(ctx, r, d, lib, gpu.UUID); started && o.client.Built() {
		runClients(ctx, r, d, o, gpu.UUID)
	} else if started {
		r.Check("CUDA clients", false, "none could be built (see above): the limits were not checked")
	}
	daemon.Stop(r, d, lib, gpu.UUID, before)
	daemon.ShowLogs(r, daemon.LogDir(o.work))
	return r.Verdict()
}

// sizesSane checks the allocation lies between the two limits, on the GPU.
func sizesSane(r *report.Report, o options, gpu nvml.GPU) bool {
	alloc := o.client.AllocGiB * 1024
	sane := o.oomMiB < alloc && alloc < o.okMiB && uint64(o.okMiB) <= gpu.MemoryMiB
	return r.Check("test sizes", sane, fmt.Sprintf("allocate %d MiB under limits %d MiB (must fail) and %d MiB (must succeed) on a %d MiB GPU",
		alloc, o.oomMiB, o.okMiB, gpu.MemoryMiB))
}

// runClients runs the client under the two limits, in the form Allocate
// writes (CUDA_VISIBLE_DEVICES=<UUID>, the limit by ordinal 0), and a
// diagnostic when the lower limit did not hold.
func runClients(ctx context.Context, r *report.Report, d *mps.Daemon, o options, uuid string) {
	name := func(mib int) string {
		return fmt.Sprintf("client limited to %d MiB allocating %d GiB", mib, o.client.AllocGiB)
	}
	low := runClient(ctx, r, o, d.PipeDir(), uuid, fmt.Sprintf("0=%dM", o.oomMiB))
	r.Check(name(o.oomMiB), low == client.ExitOutOfMemory, client.ExitMeaning(low, client.ExitOutOfMemory))
	high := runClient(ctx, r, o, d.PipeDir(), uuid, fmt.Sprintf("0=%dM", o.okMiB))
	r.Check(name(o.okMiB), high == client.ExitAllocated, client.ExitMeaning(high, client.ExitAllocated))
	r.Section("Diagnostic: the limit by UUID")
	r.Say("Allocate wrote the UUID form before round 3; whether this driver honours it:")
	runClient(ctx, r, o, d.PipeDir(), uuid, fmt.Sprintf("%s=%dM", uuid, o.oomMiB))
	r.Section("MPS servers after the clients")
	out, err := d.Control(ctx, "get_server_list")
	r.Say("get_server_list: %q%s", strings.TrimSpace(out), report.ErrSuffix(err))
}

// runClient runs the client with the environment Allocate gives a container
// of the mps tier and returns its exit status.
func runClient(ctx context.Context, r *report.Report, o options, pipeDir, uuid, limit string) int {
	r.Section("Client: " + gpushare.EnvMPSPinnedDeviceMemLimit + "=" + limit)
	return o.client.Run(ctx, r, []string{gpushare.EnvMPSPipeDirectory + "=" + pipeDir,
		gpushare.EnvCUDAVisibleDevices + "=" + uuid, gpushare.EnvMPSPinnedDeviceMemLimit + "=" + limit})
}
