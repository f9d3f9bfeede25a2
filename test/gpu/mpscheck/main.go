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
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/gpushare/gpushare/plugin/mps"
	"github.com/gpushare/gpushare/plugin/nvml"
	"go.uber.org/zap"
)

// options are the command line.
type options struct {
	backend       string
	controlBin    string
	work          string
	gpu           int
	client        []string
	allocGiB      int
	oomMiB, okMiB int
	clientTimeout time.Duration
}

func main() {
	var o options
	var client string
	flag.StringVar(&o.backend, "backend", nvml.BackendNVML, "NVML backend; simulated:* only for run.sh's dry run")
	flag.StringVar(&o.controlBin, "control", mps.DefaultControlBin, "nvidia-cuda-mps-control")
	flag.StringVar(&o.work, "work", "", "directory for the MPS pipe and log directories (required; keep it short: socket paths)")
	flag.IntVar(&o.gpu, "gpu", 0, "NVML index of the GPU to test")
	flag.StringVar(&client, "client", "", "client command; the allocation size in GiB is appended (empty: none could be built, a failure)")
	flag.IntVar(&o.allocGiB, "alloc-gib", 30, "GiB each client allocates")
	flag.IntVar(&o.oomMiB, "limit-oom", 20480, "MiB limit under which the allocation must fail")
	flag.IntVar(&o.okMiB, "limit-ok", 40960, "MiB limit under which the allocation must succeed")
	flag.DurationVar(&o.clientTimeout, "client-timeout", 3*time.Minute, "how long one client may run")
	flag.Parse()
	o.client = strings.Fields(client)
	if o.work == "" {
		flag.Usage()
		os.Exit(2)
	}
	if !run(o) {
		os.Exit(1)
	}
}

// report prints the findings and counts failed checks.
type report struct{ failed []string }

func (r *report) section(title string) { fmt.Printf("\n## %s\n\n", title) }

func (r *report) say(format string, args ...any) { fmt.Printf(format+"\n", args...) }

// check prints one verdict line and remembers a failure.
func (r *report) check(name string, ok bool, detail string) bool {
	verdict := "ok  "
	if !ok {
		verdict = "FAIL"
		r.failed = append(r.failed, name)
	}
	fmt.Printf("[%s] %s: %s\n", verdict, name, detail)
	return ok
}

// run performs the whole check and reports whether it passed.
func run(o options) bool {
	r := &report{}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	log := newLogger()
	defer log.Sync()

	lib, err := nvml.New(log, o.backend)
	if !r.check("open NVML", err == nil, errText(err, "backend "+o.backend)) {
		return verdict(r)
	}
	defer lib.Shutdown()
	if lib.Simulated() {
		r.say("SIMULATED NVML and MPS: a dry run of the script, which proves nothing about a real GPU")
	}
	gpu, before, ok := pickGPU(r, lib, o)
	if !ok {
		return verdict(r)
	}
	d := mps.New(mps.Config{
		ControlBin: o.controlBin,
		PipeDir:    filepath.Join(o.work, "pipe"),
		LogDir:     filepath.Join(o.work, "log"),
		GPUs:       []string{gpu.UUID},
		Lib:        lib,
		Logger:     log,
	})
	if started := startDaemon(ctx, r, d, lib, gpu.UUID); started && len(o.client) > 0 {
		runClients(ctx, r, d, o, gpu.UUID)
	} else if started {
		r.check("CUDA clients", false, "none could be built (see above): the limits were not checked")
	}
	stopDaemon(r, d, lib, gpu.UUID, before)
	showLogs(r, filepath.Join(o.work, "log"))
	return verdict(r)
}

// newLogger writes plugin/mps's and plugin/nvml's logs to stdout, in order
// with the report.
func newLogger() *zap.Logger {
	cfg := zap.NewDevelopmentConfig()
	cfg.DisableStacktrace = true
	cfg.DisableCaller = true
	cfg.OutputPaths = []string{"stdout"}
	cfg.ErrorOutputPaths = []string{"stdout"}
	log, err := cfg.Build()
	if err != nil {
		return zap.NewNop()
	}
	return log
}

// pickGPU finds the GPU under test and its compute mode before the check.
func pickGPU(r *report, lib nvml.Library, o options) (nvml.GPU, nvml.ComputeMode, bool) {
	r.section("GPU")
	gpus, err := lib.Devices()
	if !r.check("list GPUs", err == nil && o.gpu < len(gpus), fmt.Sprintf("%d GPU(s), testing index %d%s", len(gpus), o.gpu, errSuffix(err))) {
		return nvml.GPU{}, 0, false
	}
	gpu := gpus[o.gpu]
	r.say("GPU %d: %s, %s, %d MiB (%.1f GiB), PCI %s", gpu.Index, gpu.UUID, gpu.Model, gpu.MemoryMiB, float64(gpu.MemoryMiB)/1024, gpu.PCIBusID)
	before, err := lib.ComputeMode(gpu.UUID)
	if !r.check("compute mode before", err == nil, fmt.Sprintf("%v%s", before, errSuffix(err))) {
		return gpu, 0, false
	}
	alloc := o.allocGiB * 1024
	sane := o.oomMiB < alloc && alloc < o.okMiB && uint64(o.okMiB) <= gpu.MemoryMiB
	r.check("test sizes", sane, fmt.Sprintf("allocate %d MiB under limits %d MiB (must fail) and %d MiB (must succeed) on a %d MiB GPU",
		alloc, o.oomMiB, o.okMiB, gpu.MemoryMiB))
	return gpu, before, sane
}

// startDaemon starts the daemon through plugin/mps and checks it answers and
// the GPU is exclusive.
func startDaemon(ctx context.Context, r *report, d *mps.Daemon, lib nvml.Library, uuid string) bool {
	r.section("MPS control daemon (plugin/mps Start, Healthy)")
	t0 := time.Now()
	err := d.Start(ctx)
	if !r.check("Start", err == nil, fmt.Sprintf("took %v%s", time.Since(t0).Round(time.Millisecond), errSuffix(err))) {
		return false
	}
	err = d.Healthy(ctx)
	r.check("Healthy", err == nil, errText(err, "answers get_server_list, GPU exclusive"))
	mode, err := lib.ComputeMode(uuid)
	r.check("compute mode while running", err == nil && mode == nvml.ComputeModeExclusiveProcess, fmt.Sprintf("%v%s", mode, errSuffix(err)))
	return true
}

// runClients runs the client under the two limits, in the form Allocate
// writes (CUDA_VISIBLE_DEVICES=<UUID>, the limit by ordinal 0), and a
// diagnostic when the lower limit did not hold.
func runClients(ctx context.Context, r *report, d *mps.Daemon, o options, uuid string) {
	low := runClient(ctx, r, o, d.PipeDir(), uuid, fmt.Sprintf("0=%dM", o.oomMiB))
	r.check(fmt.Sprintf("client limited to %d MiB allocating %d GiB", o.oomMiB, o.allocGiB), low == 2, exitMeaning(low, 2))
	high := runClient(ctx, r, o, d.PipeDir(), uuid, fmt.Sprintf("0=%dM", o.okMiB))
	r.check(fmt.Sprintf("client limited to %d MiB allocating %d GiB", o.okMiB, o.allocGiB), high == 0, exitMeaning(high, 0))
	r.section("Diagnostic: the limit by UUID")
	r.say("Allocate wrote the UUID form before round 3; whether this driver honours it:")
	runClient(ctx, r, o, d.PipeDir(), uuid, fmt.Sprintf("%s=%dM", uuid, o.oomMiB))
	r.section("MPS servers after the clients")
	out, err := d.Control(ctx, "get_server_list")
	r.say("get_server_list: %q%s", strings.TrimSpace(out), errSuffix(err))
}

// runClient runs the client with the environment Allocate gives a container
// of the mps tier and returns its exit status (-1 when it did not run).
func runClient(ctx context.Context, r *report, o options, pipeDir, uuid, limit string) int {
	r.section("Client: CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=" + limit)
	ctx, cancel := context.WithTimeout(ctx, o.clientTimeout)
	defer cancel()
	args := append(append([]string(nil), o.client[1:]...), fmt.Sprint(o.allocGiB))
	cmd := exec.CommandContext(ctx, o.client[0], args...)
	added := []string{"CUDA_MPS_PIPE_DIRECTORY=" + pipeDir, "CUDA_VISIBLE_DEVICES=" + uuid, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=" + limit}
	cmd.Env = append(clientEnv(), added...)
	r.say("$ %s %s", strings.Join(added, " "), strings.Join(cmd.Args, " "))
	t0 := time.Now()
	out, err := cmd.CombinedOutput()
	r.say("%s", strings.TrimRight(string(out), "\n"))
	code := -1
	var exit *exec.ExitError
	switch {
	case err == nil:
		code = 0
	case errors.As(err, &exit) && exit.Exited():
		code = exit.ExitCode()
	}
	if code == -1 {
		r.say("did not complete after %v: %v", time.Since(t0).Round(time.Millisecond), err)
	} else {
		r.say("exit %d after %v", code, time.Since(t0).Round(time.Millisecond))
	}
	return code
}

// clientEnv is this process's environment without what would change which
// GPUs a client sees or its MPS settings: a container gets only Allocate's.
func clientEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if name != "CUDA_VISIBLE_DEVICES" && !strings.HasPrefix(name, "CUDA_MPS_") {
			env = append(env, kv)
		}
	}
	return env
}

// stopDaemon stops the daemon and checks the compute mode is back.
func stopDaemon(r *report, d *mps.Daemon, lib nvml.Library, uuid string, before nvml.ComputeMode) {
	r.section("plugin/mps Stop")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := d.Stop(ctx)
	r.check("Stop", err == nil, errText(err, "quit, daemon gone"))
	mode, err := lib.ComputeMode(uuid)
	r.check("compute mode restored", err == nil && mode == before, fmt.Sprintf("%v (was %v)%s", mode, before, errSuffix(err)))
}

// showLogs prints the end of MPS's own logs: the control daemon records each
// client it admits, which shows the clients really went through MPS.
func showLogs(r *report, logDir string) {
	for _, name := range []string{"control.log", "server.log", "gpushare-control-daemon.out"} {
		data, err := os.ReadFile(filepath.Join(logDir, name))
		r.section("MPS " + name + " (last 40 lines)")
		if err != nil {
			r.say("(%v)", err)
			continue
		}
		lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		r.say("%s", strings.Join(lines[max(0, len(lines)-40):], "\n"))
	}
}

// verdict prints PASS or FAIL with the failed checks.
func verdict(r *report) bool {
	r.section("Verdict")
	if len(r.failed) == 0 {
		r.say("PASS")
		return true
	}
	r.say("FAIL: %s", strings.Join(r.failed, "; "))
	return false
}

// exitMeaning explains a client's exit status against the wanted one.
func exitMeaning(code, want int) string {
	meaning := map[int]string{0: "allocated", 1: "failed otherwise", 2: "out of memory", -1: "did not run to completion"}
	return fmt.Sprintf("exit %d (%s), want %d (%s)", code, meaning[code], want, meaning[want])
}

// errSuffix renders err for the end of a line, or nothing.
func errSuffix(err error) string {
	if err != nil {
		return " (error: " + err.Error() + ")"
	}
	return ""
}

// errText renders err, or ok when there is none.
func errText(err error, ok string) string {
	if err != nil {
		return "error: " + err.Error()
	}
	return ok
}
