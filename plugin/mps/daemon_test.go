package mps_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpushare/gpushare/plugin/mps"
	"github.com/gpushare/gpushare/plugin/nvml"
	"github.com/gpushare/gpushare/test/fakemps"
	"go.uber.org/zap/zaptest"
)

// fakeBin is the fake control program, built once for the package.
var fakeBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "mps-test")
	if err == nil {
		// Readable by all, so TestRunAs's unprivileged daemon can run it.
		err = os.Chmod(dir, 0o755)
	}
	if err == nil {
		fakeBin, err = fakemps.Build(dir)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// fixture is a simulated node (the mixed machine, four GPUs) whose GPUs 0 and
// 2 form the MPS tier, with the fake as the control program.
type fixture struct {
	t    *testing.T
	sim  *nvml.Simulator
	all  []string // every GPU's UUID, by index
	tier []string
	cfg  mps.Config
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	sim, err := nvml.NewSimulator(zaptest.NewLogger(t), "simulated:mixed")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Shutdown() })
	gpus, err := sim.Devices()
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, sim: sim}
	for _, g := range gpus {
		f.all = append(f.all, g.UUID)
	}
	f.tier = []string{f.all[0], f.all[2]}
	dir := t.TempDir()
	f.cfg = mps.Config{
		ControlBin:    fakeBin,
		PipeDir:       filepath.Join(dir, "pipe"),
		LogDir:        filepath.Join(dir, "log"),
		GPUs:          f.tier,
		Lib:           sim,
		Logger:        zaptest.NewLogger(t),
		HealthTimeout: 2 * time.Second,
		QuitTimeout:   2 * time.Second,
		SELinuxFS:     t.TempDir(), // SELinux off, whatever the host runs
	}
	return f
}

// daemon builds a Daemon from the fixture's configuration and stops it when
// the test ends, so no fake outlives its test.
func (f *fixture) daemon() *mps.Daemon {
	d := mps.New(f.cfg)
	f.t.Cleanup(func() { d.Stop(context.Background()) })
	return d
}

// modes returns every GPU's compute mode, by index.
func (f *fixture) modes() []nvml.ComputeMode {
	f.t.Helper()
	var out []nvml.ComputeMode
	for _, uuid := range f.all {
		m, err := f.sim.ComputeMode(uuid)
		if err != nil {
			f.t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}

// wantModes fails the test unless the GPUs' modes are want, by index.
func (f *fixture) wantModes(want ...nvml.ComputeMode) {
	f.t.Helper()
	if got := f.modes(); fmt.Sprint(got) != fmt.Sprint(want) {
		f.t.Errorf("compute modes = %v, want %v", got, want)
	}
}

const (
	def  = nvml.ComputeModeDefault
	excl = nvml.ComputeModeExclusiveProcess
)

// pid is the PID the running fake wrote.
func (f *fixture) pid() int {
	f.t.Helper()
	pid, err := fakemps.ReadPID(f.cfg.PipeDir)
	if err != nil {
		f.t.Fatal(err)
	}
	return pid
}

// eventually polls check until it returns nil, failing the test after 10s.
func eventually(t *testing.T, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// gone reports whether no process has pid (the Daemon reaps its children).
func gone(pid int) error {
	if err := syscall.Kill(pid, 0); err == nil {
		return fmt.Errorf("process %d still exists", pid)
	}
	return nil
}

func mustStart(t *testing.T, d *mps.Daemon) {
	t.Helper()
	if err := d.Start(context.Background()); err != nil {
		t.Fatalf("Start: %v", err)
	}
}

func control(t *testing.T, d *mps.Daemon, command string) string {
	t.Helper()
	out, err := d.Control(context.Background(), command)
	if err != nil {
		t.Fatalf("Control(%q): %v", command, err)
	}
	return strings.TrimSpace(out)
}

func TestStartHealthyStop(t *testing.T) {
	f := newFixture(t)
	t.Setenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=1M") // inherited; must not reach the daemon
	t.Setenv("CUDA_VISIBLE_DEVICES", "3")
	f.cfg.Env = []string{"GPUSHARE_TEST_EXTRA=yes"}
	d := f.daemon()
	if d.PipeDir() != f.cfg.PipeDir {
		t.Errorf("PipeDir() = %q, want %q", d.PipeDir(), f.cfg.PipeDir)
	}
	if err := d.Healthy(context.Background()); !errors.Is(err, mps.ErrNotStarted) {
		t.Errorf("Healthy before Start = %v, want ErrNotStarted", err)
	}
	f.wantModes(def, def, def, def)

	mustStart(t, d)
	f.wantModes(excl, def, excl, def)
	if err := d.Healthy(context.Background()); err != nil {
		t.Errorf("Healthy after Start: %v", err)
	}
	for name, want := range map[string]string{
		"CUDA_VISIBLE_DEVICES":              f.tier[0] + "," + f.tier[1],
		"CUDA_MPS_PIPE_DIRECTORY":           f.cfg.PipeDir,
		"CUDA_MPS_LOG_DIRECTORY":            f.cfg.LogDir,
		"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT":  "<unset>",
		"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "<unset>",
		"GPUSHARE_TEST_EXTRA":               "yes",
	} {
		if got := control(t, d, "fake_getenv "+name); got != want {
			t.Errorf("daemon's %s = %q, want %q", name, got, want)
		}
	}
	for _, dir := range []string{f.cfg.PipeDir, f.cfg.LogDir} {
		if info, err := os.Stat(dir); err != nil || info.Mode().Perm() != 0o755 {
			t.Errorf("%s: %v %v, want a 0755 directory", dir, info.Mode(), err)
		}
	}
	record, err := os.ReadFile(filepath.Join(f.cfg.LogDir, "gpushare-compute-modes.json"))
	if err != nil || !strings.Contains(string(record), f.tier[1]) || !strings.Contains(string(record), `"DEFAULT"`) {
		t.Errorf("compute-mode record = %s, %v; want both tier GPUs as DEFAULT", record, err)
	}

	pid := f.pid()
	mustStart(t, d) // idempotent: same daemon
	if again := f.pid(); again != pid {
		t.Errorf("second Start replaced a healthy daemon: pid %d, then %d", pid, again)
	}

	if err := d.Stop(context.Background()); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	f.wantModes(def, def, def, def)
	if err := gone(pid); err != nil {
		t.Error(err)
	}
	if err := d.Healthy(context.Background()); !errors.Is(err, mps.ErrNotStarted) {
		t.Errorf("Healthy after Stop = %v, want ErrNotStarted", err)
	}
	for _, path := range []string{filepath.Join(f.cfg.PipeDir, fakemps.Socket), filepath.Join(f.cfg.LogDir, "gpushare-compute-modes.json")} {
		if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left after Stop: %v", path, err)
		}
	}
	if err := d.Stop(context.Background()); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

// TestKilledDaemon: a daemon killed from outside makes Healthy say so, and
// Start brings up a new one.
func TestKilledDaemon(t *testing.T) {
	f := newFixture(t)
	d := f.daemon()
	mustStart(t, d)
	first := f.pid()
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, "Healthy to report the killed daemon", func() error {
		err := d.Healthy(context.Background())
		if err == nil || !strings.Contains(err.Error(), "exited") || !strings.Contains(err.Error(), "killed") {
			return fmt.Errorf("Healthy = %v", err)
		}
		return nil
	})

	mustStart(t, d)
	if second := f.pid(); second == first {
		t.Errorf("Start kept the killed daemon's pid %d", first)
	}
	if err := d.Healthy(context.Background()); err != nil {
		t.Errorf("Healthy after restart: %v", err)
	}
	f.wantModes(excl, def, excl, def)
}

// TestWedgedDaemon: a daemon that stops answering fails Healthy within the
// timeout; Start leaves it (its clients may still be served) and says so;
// Stop ends it without its cooperation.
func TestWedgedDaemon(t *testing.T) {
	f := newFixture(t)
	f.cfg.HealthTimeout = 300 * time.Millisecond
	d := f.daemon()
	mustStart(t, d)
	pid := f.pid()
	if got := control(t, d, "fake_hang"); got != "hanging" {
		t.Fatalf("fake_hang = %q", got)
	}

	err := d.Healthy(context.Background())
	if err == nil || !strings.Contains(err.Error(), "does not answer") || !strings.Contains(err.Error(), "within 300ms") {
		t.Errorf("Healthy of a wedged daemon = %v, want no answer within 300ms", err)
	}
	err = d.Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), "runs but does not answer") {
		t.Errorf("Start beside a wedged daemon = %v, want it named", err)
	}
	if err := gone(pid); err == nil {
		t.Fatal("Start ended the wedged daemon")
	}
	f.wantModes(excl, def, excl, def)

	if err := d.Stop(context.Background()); err != nil {
		t.Errorf("Stop of a wedged daemon: %v", err)
	}
	if err := gone(pid); err != nil {
		t.Error(err)
	}
	f.wantModes(def, def, def, def)
	mustStart(t, d)
	eventually(t, "Healthy after a fresh Start", func() error { return d.Healthy(context.Background()) })
}

// TestStubbornDaemon: a daemon that ignores quit and SIGTERM is killed.
func TestStubbornDaemon(t *testing.T) {
	f := newFixture(t)
	f.cfg.Env = []string{"FAKEMPS_BEHAVIOUR=stubborn"}
	f.cfg.QuitTimeout = 300 * time.Millisecond
	d := f.daemon()
	mustStart(t, d)
	pid := f.pid()
	if err := d.Stop(context.Background()); err != nil {
		t.Errorf("Stop: %v", err)
	}
	if err := gone(pid); err != nil {
		t.Error(err)
	}
	f.wantModes(def, def, def, def)
}

// failingLib refuses EXCLUSIVE_PROCESS on one GPU, as NVML refuses a non-root caller.
type failingLib struct {
	nvml.Library
	uuid string
}

func (l failingLib) SetComputeMode(uuid string, mode nvml.ComputeMode) error {
	if uuid == l.uuid && mode == nvml.ComputeModeExclusiveProcess {
		return fmt.Errorf("injected: %w", nvml.ErrNoPermission)
	}
	return l.Library.SetComputeMode(uuid, mode)
}

// TestStartFailureRollsBack: whatever makes Start fail, the GPUs end in the
// modes they had and no daemon runs: a GPU left in EXCLUSIVE_PROCESS without
// MPS would admit one process at a time.
func TestStartFailureRollsBack(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*fixture)
		want   []string
	}{
		{"daemon exits at start", func(f *fixture) { f.cfg.Env = []string{"FAKEMPS_BEHAVIOUR=exit"} },
			[]string{"exited before answering", "no CUDA-capable device"}},
		{"compute mode refused", func(f *fixture) { f.cfg.Lib = failingLib{Library: f.sim, uuid: f.tier[1]} },
			[]string{"EXCLUSIVE_PROCESS", "injected", "privileged"}},
		{"no control program", func(f *fixture) { f.cfg.ControlBin = "/nonexistent/nvidia-cuda-mps-control" },
			[]string{"MPS control program", "NVIDIA_DRIVER_CAPABILITIES"}},
		{"pipe dir symlink", func(f *fixture) {
			if err := os.Symlink(t.TempDir(), f.cfg.PipeDir); err != nil {
				t.Fatal(err)
			}
		}, []string{"not a directory"}},
		{"SELinux label unreadable", func(f *fixture) {
			if err := os.WriteFile(filepath.Join(f.cfg.SELinuxFS, "enforce"), []byte("1"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, []string{"SELinux label"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			tt.mutate(f)
			d := f.daemon()
			err := d.Start(context.Background())
			for _, want := range tt.want {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("Start = %v, want an error containing %q", err, want)
				}
			}
			f.wantModes(def, def, def, def)
			if _, err := fakemps.ReadPID(f.cfg.PipeDir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("a daemon runs after a failed Start (PID file: %v)", err)
			}
			if err := d.Healthy(context.Background()); !errors.Is(err, mps.ErrNotStarted) {
				t.Errorf("Healthy after a failed Start = %v, want ErrNotStarted", err)
			}
		})
	}
}

// TestSELinuxPermissive: a label that cannot be set stops Start only when
// SELinux enforces (TestStartFailureRollsBack); permissive mode denies
// nothing, so Start goes on.
func TestSELinuxPermissive(t *testing.T) {
	f := newFixture(t)
	if err := os.WriteFile(filepath.Join(f.cfg.SELinuxFS, "enforce"), []byte("0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := f.daemon()
	mustStart(t, d)
	if err := d.Healthy(context.Background()); err != nil {
		t.Errorf("Healthy: %v", err)
	}
}

// TestRestoresOperatorModes: Stop puts back what the GPUs had, not DEFAULT.
func TestRestoresOperatorModes(t *testing.T) {
	f := newFixture(t)
	if err := f.sim.SetComputeMode(f.tier[0], nvml.ComputeModeProhibited); err != nil {
		t.Fatal(err)
	}
	d := f.daemon()
	mustStart(t, d)
	f.wantModes(excl, def, excl, def)
	if err := d.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.wantModes(nvml.ComputeModeProhibited, def, def, def)
}

// TestRecordOutlivesCrash: a plugin that dies after switching the GPUs
// leaves a record, so its successor restores DEFAULT rather than the
// EXCLUSIVE_PROCESS it finds, whether it starts first or only stops.
func TestRecordOutlivesCrash(t *testing.T) {
	for _, startFirst := range []bool{true, false} {
		t.Run(fmt.Sprintf("startFirst=%v", startFirst), func(t *testing.T) {
			f := newFixture(t)
			crashed := mps.New(f.cfg) // never stopped, as after a crash
			mustStart(t, crashed)
			if err := syscall.Kill(f.pid(), syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			eventually(t, "the crashed daemon to be gone", func() error {
				if crashed.Healthy(context.Background()) == nil {
					return errors.New("still healthy")
				}
				return nil
			})
			f.wantModes(excl, def, excl, def)

			successor := f.daemon()
			if startFirst {
				mustStart(t, successor) // replaces the stale socket
				f.wantModes(excl, def, excl, def)
			}
			if err := successor.Stop(context.Background()); err != nil {
				t.Fatal(err)
			}
			f.wantModes(def, def, def, def)
		})
	}
}

// TestRecordFiles: a record from an earlier boot is ignored (modes reset at
// boot); a corrupt one stops Start before anything changes.
func TestRecordFiles(t *testing.T) {
	write := func(f *fixture, content string) {
		if err := os.MkdirAll(f.cfg.LogDir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(f.cfg.LogDir, "gpushare-compute-modes.json"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("earlier boot", func(t *testing.T) {
		f := newFixture(t)
		write(f, fmt.Sprintf(`{"bootID":"an-earlier-boot","modes":{%q:{"mode":2,"name":"PROHIBITED"}}}`, f.tier[0]))
		d := f.daemon()
		mustStart(t, d)
		if err := d.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
		f.wantModes(def, def, def, def)
	})
	t.Run("corrupt", func(t *testing.T) {
		f := newFixture(t)
		write(f, "{")
		err := f.daemon().Start(context.Background())
		if err == nil || !strings.Contains(err.Error(), "corrupt") {
			t.Errorf("Start = %v, want the corrupt record named", err)
		}
		f.wantModes(def, def, def, def)
	})
}

// TestForeignDaemon: Start refuses to run beside a daemon it did not start,
// and changes nothing.
func TestForeignDaemon(t *testing.T) {
	f := newFixture(t)
	foreign := exec.Command(fakeBin, "-f")
	foreign.Env = append(os.Environ(), "CUDA_MPS_PIPE_DIRECTORY="+f.cfg.PipeDir, "CUDA_MPS_LOG_DIRECTORY="+t.TempDir())
	if err := foreign.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		foreign.Process.Kill()
		foreign.Wait()
	})
	probe := mps.New(f.cfg)
	eventually(t, "the foreign daemon to answer", func() error {
		_, err := probe.Control(context.Background(), "get_server_list")
		return err
	})

	err := f.daemon().Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), "did not start already answers") {
		t.Errorf("Start = %v, want a refusal naming the other daemon", err)
	}
	f.wantModes(def, def, def, def)
	if pid := f.pid(); pid != foreign.Process.Pid {
		t.Errorf("the foreign daemon was replaced (pid %d, want %d)", pid, foreign.Process.Pid)
	}
}

// TestComputeModeDrift: a tier GPU switched back by hand fails Healthy, and
// Start sets it again.
func TestComputeModeDrift(t *testing.T) {
	f := newFixture(t)
	d := f.daemon()
	mustStart(t, d)
	if err := f.sim.SetComputeMode(f.tier[1], nvml.ComputeModeDefault); err != nil {
		t.Fatal(err)
	}
	err := d.Healthy(context.Background())
	if err == nil || !strings.Contains(err.Error(), f.tier[1]) || !strings.Contains(err.Error(), "DEFAULT") {
		t.Errorf("Healthy = %v, want the GPU and its mode named", err)
	}
	mustStart(t, d)
	if err := d.Healthy(context.Background()); err != nil {
		t.Errorf("Healthy after Start: %v", err)
	}
	f.wantModes(excl, def, excl, def)
}

func TestConfigErrors(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*mps.Config)
		want   string
	}{
		{"no library", func(c *mps.Config) { c.Lib = nil }, "Lib"},
		{"relative pipe dir", func(c *mps.Config) { c.PipeDir = "pipe" }, "PipeDir"},
		{"unclean log dir", func(c *mps.Config) { c.LogDir += "/../log" }, "LogDir"},
		{"same dirs", func(c *mps.Config) { c.LogDir = c.PipeDir }, "must differ"},
		{"long pipe dir", func(c *mps.Config) { c.PipeDir = "/" + strings.Repeat("p", 100) }, "108-byte"},
		{"no GPUs", func(c *mps.Config) { c.GPUs = nil }, "no GPU"},
		{"MIG UUID", func(c *mps.Config) { c.GPUs = []string{"MIG-1234"} }, "MIG-1234"},
		{"duplicate GPU", func(c *mps.Config) { c.GPUs = []string{c.GPUs[0], c.GPUs[0]} }, "distinct"},
		{"default limit", func(c *mps.Config) { c.Env = []string{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1G"} }, "Start owns"},
		{"malformed env", func(c *mps.Config) { c.Env = []string{"NOEQUALS"} }, "NAME=value"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			tt.mutate(&f.cfg)
			err := mps.New(f.cfg).Start(context.Background())
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Start = %v, want an error containing %q", err, tt.want)
			}
			f.wantModes(def, def, def, def)
		})
	}
}

// TestRunAs: the daemon runs as the configured user and owns its directories.
func TestRunAs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run the daemon as another user")
	}
	f := newFixture(t)
	// t.TempDir's directories are 0700; the daemon's user must reach its own.
	for dir := filepath.Dir(f.cfg.PipeDir); dir != os.TempDir() && dir != "/"; dir = filepath.Dir(dir) {
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	f.cfg.RunAs = &mps.Credential{UID: 65534, GID: 65534}
	d := f.daemon()
	mustStart(t, d)
	if got := control(t, d, "fake_id"); got != "uid=65534 gid=65534" {
		t.Errorf("daemon runs as %q, want uid=65534 gid=65534", got)
	}
	for _, dir := range []string{f.cfg.PipeDir, f.cfg.LogDir} {
		info, err := os.Stat(dir)
		if err != nil {
			t.Fatal(err)
		}
		if st := info.Sys().(*syscall.Stat_t); st.Uid != 65534 || st.Gid != 65534 {
			t.Errorf("%s owned by %d:%d, want 65534:65534", dir, st.Uid, st.Gid)
		}
	}
	if err := d.Stop(context.Background()); err != nil {
		t.Error(err)
	}
	f.wantModes(def, def, def, def)
}

// TestConcurrentUse: Healthy may run while Start and Stop do (the plugin's
// health loop beside its lifecycle); the race detector checks the rest.
func TestConcurrentUse(t *testing.T) {
	f := newFixture(t)
	d := f.daemon()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			_ = d.Healthy(ctx)
		}
	}()
	for range 3 {
		mustStart(t, d)
		if err := d.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	}
	cancel()
	wg.Wait()
	f.wantModes(def, def, def, def)
}
