// Package daemon runs gpushare's MPS daemon management (plugin/mps) for the
// real-GPU checks: it picks the GPU under test, starts the control daemon
// on it, checks it answers with the GPU exclusive, and stops it with the
// compute mode restored, printing each step to a report.
package daemon

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/gpushare/gpushare/plugin/mps"
	"github.com/gpushare/gpushare/plugin/nvml"
	"github.com/gpushare/gpushare/test/gpu/internal/report"
	"go.uber.org/zap"
)

// New is plugin/mps's daemon for the GPU uuid, with its pipe directory
// <work>/pipe and its log directory <work>/log.
func New(lib nvml.Library, log *zap.Logger, controlBin, work, uuid string) *mps.Daemon {
	return mps.New(mps.Config{
		ControlBin: controlBin,
		PipeDir:    filepath.Join(work, "pipe"),
		LogDir:     LogDir(work),
		GPUs:       []string{uuid},
		Lib:        lib,
		Logger:     log,
	})
}

// LogDir is the daemon's log directory under work.
func LogDir(work string) string { return filepath.Join(work, "log") }

// PickGPU finds the GPU of NVML index index and its compute mode before the
// check.
func PickGPU(r *report.Report, lib nvml.Library, index int) (nvml.GPU, nvml.ComputeMode, bool) {
	r.Section("GPU")
	gpus, err := lib.Devices()
	if !r.Check("list GPUs", err == nil && index >= 0 && index < len(gpus), fmt.Sprintf("%d GPU(s), testing index %d%s", len(gpus), index, report.ErrSuffix(err))) {
		return nvml.GPU{}, 0, false
	}
	gpu := gpus[index]
	r.Say("GPU %d: %s, %s, %d MiB (%.1f GiB), PCI %s", gpu.Index, gpu.UUID, gpu.Model, gpu.MemoryMiB, float64(gpu.MemoryMiB)/1024, gpu.PCIBusID)
	before, err := lib.ComputeMode(gpu.UUID)
	if !r.Check("compute mode before", err == nil, fmt.Sprintf("%v%s", before, report.ErrSuffix(err))) {
		return gpu, 0, false
	}
	return gpu, before, true
}

// Start starts the daemon through plugin/mps and checks it answers and the
// GPU is exclusive; it reports whether the daemon started.
func Start(ctx context.Context, r *report.Report, d *mps.Daemon, lib nvml.Library, uuid string) bool {
	r.Section("MPS control daemon (plugin/mps Start, Healthy)")
	t0 := time.Now()
	err := d.Start(ctx)
	if !r.Check("Start", err == nil, fmt.Sprintf("took %v%s", time.Since(t0).Round(time.Millisecond), report.ErrSuffix(err))) {
		return false
	}
	err = d.Healthy(ctx)
	r.Check("Healthy", err == nil, report.ErrText(err, "answers get_server_list, GPU exclusive"))
	mode, err := lib.ComputeMode(uuid)
	r.Check("compute mode while running", err == nil && mode == nvml.ComputeModeExclusiveProcess, fmt.Sprintf("%v%s", mode, report.ErrSuffix(err)))
	return true
}

// Stop stops the daemon and checks the compute mode is back to before.
func Stop(r *report.Report, d *mps.Daemon, lib nvml.Library, uuid string, before nvml.ComputeMode) {
	r.Section("plugin/mps Stop")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := d.Stop(ctx)
	r.Check("Stop", err == nil, report.ErrText(err, "quit, daemon gone"))
	mode, err := lib.ComputeMode(uuid)
	r.Check("compute mode restored", err == nil && mode == before, fmt.Sprintf("%v (was %v)%s", mode, before, report.ErrSuffix(err)))
}

// ShowLogs prints the end of MPS's own logs: the control daemon records
// each client it admits, which shows the clients really went through MPS.
func ShowLogs(r *report.Report, logDir string) {
	for _, name := range []string{"control.log", "server.log", "gpushare-control-daemon.out"} {
		data, err := os.ReadFile(filepath.Join(logDir, name))
		r.Section("MPS " + name + " (last 40 lines)")
		if err != nil {
			r.Say("(%v)", err)
			continue
		}
		lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		r.Say("%s", strings.Join(lines[max(0, len(lines)-40):], "\n"))
	}
}
