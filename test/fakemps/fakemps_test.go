package fakemps

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// bin is the fake built once for the package's tests.
var bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fakemps")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin, err = Build(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// env is one daemon's directories.
type env struct{ pipe, log string }

func newEnv(t *testing.T) env {
	dir := t.TempDir()
	return env{pipe: filepath.Join(dir, "pipe"), log: filepath.Join(dir, "log")}
}

func (e env) vars(extra ...string) []string {
	return append(os.Environ(), append([]string{"CUDA_MPS_PIPE_DIRECTORY=" + e.pipe, "CUDA_MPS_LOG_DIRECTORY=" + e.log}, extra...)...)
}

// client runs the fake as a client with stdin and returns its output.
func (e env) client(stdin string) (string, error) {
	cmd := exec.Command(bin)
	cmd.Env = e.vars()
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%w: %s", err, errOut.String())
	}
	return out.String(), nil
}

// daemonProc is a daemon started with -f.
type daemonProc struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when it exited
	err  error         // its exit, read after done
}

// foreground starts the daemon with -f and kills it when the test ends.
func (e env) foreground(t *testing.T, extra ...string) *daemonProc {
	t.Helper()
	p := &daemonProc{cmd: exec.Command(bin, "-f"), done: make(chan struct{})}
	p.cmd.Env = e.vars(extra...)
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.done
	})
	return p
}

// wait waits for the daemon to exit and returns how it exited.
func (p *daemonProc) wait(t *testing.T) error {
	t.Helper()
	select {
	case <-p.done:
		return p.err
	case <-time.After(10 * time.Second):
		t.Fatal("daemon did not exit")
		return nil
	}
}

// waitAnswer polls until the daemon answers, or fails the test.
func (e env) waitAnswer(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := e.client("get_server_list\n")
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("daemon never answered: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitGone polls until pid no longer exists, or fails the test.
func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			t.Fatalf("process %d still exists", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitLog polls control.log until it holds text, or fails the test.
func waitLog(t *testing.T, e env, text string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		log, _ := os.ReadFile(filepath.Join(e.log, "control.log"))
		if strings.Contains(string(log), text) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("control.log never said %q:\n%s", text, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestForegroundCommands(t *testing.T) {
	e := newEnv(t)
	d := e.foreground(t, "CUDA_VISIBLE_DEVICES=GPU-a,GPU-b")
	e.waitAnswer(t)

	if pid, err := ReadPID(e.pipe); err != nil || pid != d.cmd.Process.Pid {
		t.Errorf("ReadPID = %d, %v; want %d", pid, err, d.cmd.Process.Pid)
	}
	out, err := e.client("get_server_list\nget_default_active_thread_percentage\nfake_getenv CUDA_VISIBLE_DEVICES\nfake_getenv CUDA_MPS_PINNED_DEVICE_MEM_LIMIT\n")
	if err != nil {
		t.Fatal(err)
	}
	if want := "100.0\nGPU-a,GPU-b\n<unset>\n"; out != want {
		t.Errorf("answers = %q, want %q", out, want)
	}
	log, err := os.ReadFile(filepath.Join(e.log, "control.log"))
	if err != nil || !strings.Contains(string(log), `CUDA_VISIBLE_DEVICES="GPU-a,GPU-b"`) {
		t.Errorf("control.log = %q, %v; want the start line", log, err)
	}

	if _, err := e.client("quit\n"); err != nil {
		t.Fatal(err)
	}
	if err := d.wait(t); err != nil {
		t.Errorf("daemon exit after quit: %v", err)
	}
	for _, name := range []string{Socket, PIDFile} {
		if _, err := os.Stat(filepath.Join(e.pipe, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left behind after quit: %v", name, err)
		}
	}
	if _, err := e.client("get_server_list\n"); err == nil || !strings.Contains(err.Error(), "cannot reach") {
		t.Errorf("client with no daemon = %v, want a failure saying it cannot reach it", err)
	}
}

func TestBackgroundDaemon(t *testing.T) {
	e := newEnv(t)
	cmd := exec.Command(bin, "-d")
	cmd.Env = e.vars()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("-d: %v\n%s", err, out)
	}
	e.waitAnswer(t)
	pid, err := ReadPID(e.pipe)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })

	second := exec.Command(bin, "-f")
	second.Env = e.vars()
	if out, err := second.CombinedOutput(); err == nil || !strings.Contains(string(out), "already running") {
		t.Errorf("second daemon = %v %q, want a refusal", err, out)
	}

	if _, err := e.client("quit\n"); err != nil {
		t.Fatal(err)
	}
	waitGone(t, pid)
}

// TestStaleSocket: a daemon killed with SIGKILL leaves its socket; the next
// one replaces it.
func TestStaleSocket(t *testing.T) {
	e := newEnv(t)
	first := e.foreground(t)
	e.waitAnswer(t)
	first.cmd.Process.Kill()
	first.wait(t)
	if _, err := os.Stat(filepath.Join(e.pipe, Socket)); err != nil {
		t.Fatalf("expected a stale socket after SIGKILL: %v", err)
	}
	if _, err := e.client("get_server_list\n"); err == nil {
		t.Fatal("a killed daemon answered")
	}
	e.foreground(t)
	e.waitAnswer(t)
}

func TestHang(t *testing.T) {
	e := newEnv(t)
	e.foreground(t)
	e.waitAnswer(t)
	if out, err := e.client("fake_hang\n"); err != nil || out != "hanging\n" {
		t.Fatalf("fake_hang = %q, %v", out, err)
	}
	cmd := exec.Command(bin)
	cmd.Env = e.vars()
	cmd.Stdin = strings.NewReader("get_server_list\n")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		t.Fatalf("a hung daemon answered: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	cmd.Process.Kill()
	<-done
}

func TestBehaviours(t *testing.T) {
	t.Run("exit", func(t *testing.T) {
		e := newEnv(t)
		cmd := exec.Command(bin, "-f")
		cmd.Env = e.vars("FAKEMPS_BEHAVIOUR=exit")
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "no CUDA-capable device") {
			t.Errorf("exit behaviour = %v %q, want a failure", err, out)
		}
		if _, err := os.Stat(filepath.Join(e.pipe, PIDFile)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("PID file left behind: %v", err)
		}
	})
	t.Run("stubborn", func(t *testing.T) {
		e := newEnv(t)
		d := e.foreground(t, "FAKEMPS_BEHAVIOUR=stubborn")
		e.waitAnswer(t)
		if _, err := e.client("quit\n"); err != nil {
			t.Fatal(err)
		}
		if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		waitLog(t, e, "ignoring terminated (stubborn)")
		e.waitAnswer(t)
		if syscall.Kill(d.cmd.Process.Pid, 0) != nil {
			t.Error("a stubborn daemon stopped")
		}
	})
}
