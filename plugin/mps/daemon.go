package mps

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gpushare/gpushare/plugin/nvml"
	"go.uber.org/zap"
)

const (
	// DefaultControlBin is NVIDIA's control program, looked up in PATH.
	DefaultControlBin = "nvidia-cuda-mps-control"
	// DefaultHealthTimeout bounds one control command: a live daemon answers
	// in milliseconds, and the plugin's health loop must not stall on a
	// wedged one.
	DefaultHealthTimeout = 5 * time.Second
	// DefaultReadyTimeout bounds how long Start waits for a new daemon to
	// answer its first command.
	DefaultReadyTimeout = 30 * time.Second
	// DefaultQuitTimeout bounds how long Stop waits for the daemon to exit
	// after "quit", and again after SIGTERM, before SIGKILL.
	DefaultQuitTimeout = 10 * time.Second

	// controlSocket is the daemon's socket in the pipe directory; its absence
	// means no daemon serves the directory.
	controlSocket = "control"
	// outputFile, in LogDir, receives the daemon's stdout and stderr.
	outputFile = "gpushare-control-daemon.out"
	// maxPipeDirLen keeps the daemon's unix sockets ("<dir>/control_privileged"
	// and the like) under Linux's 108-byte socket path limit.
	maxPipeDirLen = 80
)

// sentinelError is a constant error type, so sentinels cannot be reassigned
// (no package-level mutable state) yet work with errors.Is.
type sentinelError string

func (e sentinelError) Error() string { return string(e) }

// ErrNotStarted is returned by Healthy before Start succeeds and after Stop.
const ErrNotStarted sentinelError = "MPS control daemon not started"

// Credential is a user and group to run the control daemon as.
type Credential struct {
	UID, GID uint32
}

// Config describes the node's MPS control daemon.
type Config struct {
	// ControlBin is nvidia-cuda-mps-control: a path, or a name looked up in
	// PATH; empty means DefaultControlBin. Tests use the fake in test/fakemps.
	ControlBin string
	// PipeDir is CUDA_MPS_PIPE_DIRECTORY, where the daemon's sockets live.
	// Every client container mounts it at the same path. Absolute; required.
	PipeDir string
	// LogDir is CUDA_MPS_LOG_DIRECTORY (control.log, server.log) and holds
	// this package's compute-mode record. Clients never need it. Absolute;
	// required.
	LogDir string
	// GPUs are the UUIDs of the tier's GPUs ("GPU-..."); the daemon sees
	// exactly these. Required.
	GPUs []string
	// Lib reads and sets the GPUs' compute modes. Required.
	Lib nvml.Library
	// Logger receives the daemon's lifecycle; nil logs nothing.
	Logger *zap.Logger
	// RunAs runs the control daemon, and so every MPS server, as this user
	// instead of this process's (see the package documentation on UIDs).
	RunAs *Credential
	// Env adds "NAME=value" entries to the daemon's environment (for example
	// LD_LIBRARY_PATH). CUDA_VISIBLE_DEVICES and CUDA_MPS_* are refused:
	// Start sets the first three itself, and a default limit must never be.
	Env []string
	// HealthTimeout bounds each control command; 0 means DefaultHealthTimeout.
	HealthTimeout time.Duration
	// ReadyTimeout bounds Start's wait for a new daemon; 0 means DefaultReadyTimeout.
	ReadyTimeout time.Duration
	// QuitTimeout bounds Stop's waits after quit and after SIGTERM; 0 means
	// DefaultQuitTimeout.
	QuitTimeout time.Duration
	// SELinuxFS is where selinuxfs is mounted; empty means /sys/fs/selinux.
	// When SELinux is enabled there, Start labels PipeDir container_file_t
	// so that containers may reach the sockets (as NVIDIA's device plugin does).
	SELinuxFS string
}

// Daemon manages one node-wide MPS control daemon. Its methods are safe for
// concurrent use.
type Daemon struct {
	cfg Config
	log *zap.Logger

	// mu serialises Start and Stop and guards proc and modes.
	mu sync.Mutex
	// proc is the daemon this Daemon started; nil before Start and after Stop.
	proc *process
	// modes are the GPUs' compute modes before gpushare changed them, as in
	// the record file; nil until read.
	modes *modeRecord
}

// New returns a Daemon for cfg; nothing runs until Start, which checks cfg.
func New(cfg Config) *Daemon {
	logger := cfg.Logger
	if logger == nil {
		logger = zap.NewNop()
	}
	cfg.GPUs = append([]string(nil), cfg.GPUs...)
	cfg.Env = append([]string(nil), cfg.Env...)
	return &Daemon{cfg: cfg, log: logger.With(zap.String("component", "mps"), zap.String("pipeDir", cfg.PipeDir))}
}

// PipeDir is the CUDA_MPS_PIPE_DIRECTORY clients must use and mount.
func (d *Daemon) PipeDir() string { return d.cfg.PipeDir }

// Start makes the tier ready: the directories exist with their modes, every
// tier GPU is in EXCLUSIVE_PROCESS (previous modes recorded), and a control
// daemon started by this Daemon answers. It is idempotent: with a daemon that
// answers it only repairs compute modes, and a daemon that exited is
// replaced. A daemon that runs but does not answer is left alone, since its
// clients may still be served: Start says so, and Stop ends it. Start refuses
// to run beside a daemon it did not start on the same pipe directory. When it
// fails, no daemon of its runs and the compute modes are as they were.
func (d *Daemon) Start(ctx context.Context) error {
	if err := d.cfg.validate(); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if p := d.proc; p != nil && !p.exited() {
		if _, err := d.Control(ctx, "get_server_list"); err != nil {
			return fmt.Errorf("MPS control daemon (pid %d) runs but does not answer; Stop ends it: %w", p.pid(), err)
		}
		return d.ensureModes()
	}
	if p := d.proc; p != nil {
		d.log.Warn("MPS control daemon had exited; starting a new one", zap.Int("pid", p.pid()), zap.String("exit", p.reason()))
		d.proc = nil
	}
	if err := d.refuseForeign(ctx); err != nil {
		return err // its GPUs' modes are its own: nothing to undo
	}
	if err := d.start(ctx); err != nil {
		if rerr := d.restoreModes(); rerr != nil {
			err = errors.Join(err, rerr)
		}
		return err
	}
	return nil
}

// start prepares the node and launches a daemon; the caller holds mu and
// undoes the compute modes when it fails.
func (d *Daemon) start(ctx context.Context) error {
	bin, err := exec.LookPath(d.controlBin())
	if err != nil {
		return fmt.Errorf("MPS control program: %w (the NVIDIA container toolkit mounts it when NVIDIA_DRIVER_CAPABILITIES includes compute)", err)
	}
	if err := d.prepareDirs(); err != nil {
		return err
	}
	if err := d.ensureModes(); err != nil {
		return err
	}
	p, err := launch(bin, d.env(), d.cfg.RunAs, filepath.Join(d.cfg.LogDir, outputFile))
	if err != nil {
		return err
	}
	if err := d.waitReady(ctx, p); err != nil {
		p.stop(d.quitTimeout())
		return err
	}
	d.proc = p
	d.log.Info("MPS control daemon started", zap.Int("pid", p.pid()), zap.Strings("gpus", d.cfg.GPUs),
		zap.String("logDir", d.cfg.LogDir), zap.Any("runAs", d.cfg.RunAs))
	return nil
}

// refuseForeign fails when a daemon this Daemon did not start answers on the
// pipe directory: two daemons cannot share one, and ending one that serves
// running clients would end them too.
func (d *Daemon) refuseForeign(ctx context.Context) error {
	if _, err := os.Stat(filepath.Join(d.cfg.PipeDir, controlSocket)); err != nil {
		return nil // no socket: nobody serves the directory
	}
	if _, err := d.Control(ctx, "get_server_list"); err != nil {
		return nil // a stale socket; the new daemon replaces it
	}
	return fmt.Errorf("an MPS control daemon that this plugin did not start already answers in %s: stop it "+
		"(echo quit | CUDA_MPS_PIPE_DIRECTORY=%s %s) or give gpushare another pipe directory",
		d.cfg.PipeDir, d.cfg.PipeDir, d.controlBin())
}

// waitReady polls the new daemon until it answers, exits, or ReadyTimeout
// passes.
func (d *Daemon) waitReady(ctx context.Context, p *process) error {
	ctx, cancel := context.WithTimeout(ctx, d.readyTimeout())
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		_, err := d.Control(ctx, "get_server_list")
		if err == nil {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("MPS control daemon exited before answering: %s", p.reason())
		case <-ctx.Done():
			return fmt.Errorf("MPS control daemon (pid %d) did not answer within %v: %w", p.pid(), d.readyTimeout(), err)
		case <-tick.C:
		}
	}
}

// Healthy returns nil when the daemon this Daemon started answers
// get_server_list within HealthTimeout and every tier GPU is still in
// EXCLUSIVE_PROCESS, and otherwise an error saying which is not so.
func (d *Daemon) Healthy(ctx context.Context) error {
	d.mu.Lock()
	p := d.proc
	d.mu.Unlock()
	if p == nil {
		return ErrNotStarted
	}
	if p.exited() {
		return fmt.Errorf("MPS control daemon (pid %d) exited: %s", p.pid(), p.reason())
	}
	if _, err := d.Control(ctx, "get_server_list"); err != nil {
		return fmt.Errorf("MPS control daemon (pid %d) does not answer: %w", p.pid(), err)
	}
	return d.checkModes()
}

// Stop sends quit to the daemon and waits QuitTimeout for it to exit, then
// sends SIGTERM and waits as long again, then SIGKILL. It then restores the
// compute modes recorded before gpushare changed them, also those an
// earlier, crashed run recorded, so a Daemon that never started can undo
// that run. Clients of the daemon lose their MPS server. Calling it again is
// harmless.
func (d *Daemon) Stop(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	var errs []error
	if d.proc != nil {
		if err := d.quit(ctx, d.proc); err != nil {
			errs = append(errs, err)
		}
		d.proc = nil
	}
	if err := d.restoreModes(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// quit ends p: "quit" first, as NVIDIA documents, then signals.
func (d *Daemon) quit(ctx context.Context, p *process) error {
	if p.exited() {
		d.log.Info("MPS control daemon had already exited", zap.String("exit", p.reason()))
		return nil
	}
	if _, err := d.Control(ctx, "quit"); err != nil {
		d.log.Warn("MPS control daemon did not take quit; signalling it", zap.Error(err))
	} else if p.wait(d.quitTimeout()) {
		d.log.Info("MPS control daemon quit", zap.Int("pid", p.pid()))
		return nil
	}
	if !p.stop(d.quitTimeout()) {
		return fmt.Errorf("MPS control daemon (pid %d) still runs after SIGKILL", p.pid())
	}
	d.log.Warn("MPS control daemon ended by signal", zap.Int("pid", p.pid()), zap.String("exit", p.reason()))
	return nil
}

// Control sends one command (such as "get_server_list") to the daemon through
// the control program and returns its answer. It fails when the program
// fails or no answer comes within HealthTimeout.
func (d *Daemon) Control(ctx context.Context, command string) (string, error) {
	timeout := d.healthTimeout()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, d.controlBin())
	cmd.Env = d.env()
	cmd.Stdin = strings.NewReader(command + "\n")
	cmd.SysProcAttr = sysProcAttr(d.cfg.RunAs)
	cmd.WaitDelay = time.Second // a client stuck in a read must not outlive the deadline
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return "", fmt.Errorf("no answer to %q within %v", command, timeout)
	case ctx.Err() != nil:
		return "", fmt.Errorf("%q: %w", command, ctx.Err())
	case err != nil:
		return "", fmt.Errorf("%s %q: %w: %s", d.controlBin(), command, err, oneLine(stderr.String()+stdout.String()))
	}
	return stdout.String(), nil
}

// env is the daemon's and the control program's environment: this process's,
// less anything that would change which GPUs MPS sees or set a default limit
// or share, plus Config.Env and the three MPS variables.
func (d *Daemon) env() []string {
	var env []string
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); !reservedEnv(name) {
			env = append(env, kv)
		}
	}
	env = append(env, d.cfg.Env...)
	return append(env,
		"CUDA_VISIBLE_DEVICES="+strings.Join(d.cfg.GPUs, ","),
		"CUDA_MPS_PIPE_DIRECTORY="+d.cfg.PipeDir,
		"CUDA_MPS_LOG_DIRECTORY="+d.cfg.LogDir,
	)
}

// reservedEnv names the variables only Start may set for the daemon.
func reservedEnv(name string) bool {
	return name == "CUDA_VISIBLE_DEVICES" || strings.HasPrefix(name, "CUDA_MPS_")
}

// sysProcAttr runs a child as cred, or as this process when cred is nil.
func sysProcAttr(cred *Credential) *syscall.SysProcAttr {
	if cred == nil {
		return nil
	}
	return &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: cred.UID, Gid: cred.GID}}
}

// oneLine joins the non-empty lines of s with " | ", for error messages.
func oneLine(s string) string {
	var lines []string
	for line := range strings.Lines(s) {
		if line = strings.TrimSpace(line); line != "" {
			lines = append(lines, line)
		}
	}
	return strings.Join(lines, " | ")
}

func (d *Daemon) controlBin() string {
	if d.cfg.ControlBin == "" {
		return DefaultControlBin
	}
	return d.cfg.ControlBin
}

func (d *Daemon) healthTimeout() time.Duration {
	return orDefault(d.cfg.HealthTimeout, DefaultHealthTimeout)
}

func (d *Daemon) readyTimeout() time.Duration {
	return orDefault(d.cfg.ReadyTimeout, DefaultReadyTimeout)
}

func (d *Daemon) quitTimeout() time.Duration { return orDefault(d.cfg.QuitTimeout, DefaultQuitTimeout) }

func orDefault(v, def time.Duration) time.Duration {
	if v > 0 {
		return v
	}
	return def
}

// validate checks the configuration Start needs.
func (c Config) validate() error {
	if c.Lib == nil {
		return errors.New("mps: Config.Lib is required (compute modes are set through NVML)")
	}
	if err := c.validateDirs(); err != nil {
		return err
	}
	if len(c.GPUs) == 0 {
		return errors.New("mps: Config.GPUs lists no GPU")
	}
	seen := map[string]bool{}
	for _, uuid := range c.GPUs {
		if !strings.HasPrefix(uuid, "GPU-") || strings.ContainsAny(uuid, ", =") || seen[uuid] {
			return fmt.Errorf("mps: Config.GPUs: %q is not a distinct whole-GPU UUID (GPU-...)", uuid)
		}
		seen[uuid] = true
	}
	for _, kv := range c.Env {
		name, _, ok := strings.Cut(kv, "=")
		if !ok || name == "" || reservedEnv(name) {
			return fmt.Errorf("mps: Config.Env: %q is not NAME=value or sets a variable Start owns", kv)
		}
	}
	return nil
}

// validateDirs checks PipeDir and LogDir.
func (c Config) validateDirs() error {
	for name, dir := range map[string]string{"PipeDir": c.PipeDir, "LogDir": c.LogDir} {
		if !filepath.IsAbs(dir) || filepath.Clean(dir) != dir {
			return fmt.Errorf("mps: Config.%s %q must be a clean absolute path", name, dir)
		}
	}
	if c.PipeDir == c.LogDir {
		return errors.New("mps: Config.PipeDir and LogDir must differ: clients mount the pipe directory, the log directory is private")
	}
	if len(c.PipeDir) > maxPipeDirLen {
		return fmt.Errorf("mps: Config.PipeDir %q is longer than %d bytes: the daemon's unix socket paths in it would pass Linux's 108-byte limit", c.PipeDir, maxPipeDirLen)
	}
	return nil
}
