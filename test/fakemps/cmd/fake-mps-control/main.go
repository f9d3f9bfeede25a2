// Command fake-mps-control behaves like NVIDIA's nvidia-cuda-mps-control as
// far as gpushare's plugin/mps uses it, so the MPS tier can be tested on
// machines without a GPU:
//
//	fake-mps-control -f   run the control daemon in the foreground
//	fake-mps-control -d   start the control daemon in the background and return
//	fake-mps-control      client: send each line of stdin to the daemon, print its answers
//
// The daemon listens on the unix socket "control" in $CUDA_MPS_PIPE_DIRECTORY
// (default /tmp/nvidia-mps), writes its PID to nvidia-cuda-mps-control.pid
// there (as the real daemon does, so tests can kill it) and appends to
// control.log in $CUDA_MPS_LOG_DIRECTORY (default /var/log/nvidia-mps).
//
// Commands: get_server_list (prints nothing: a fake starts no MPS server),
// get_default_active_thread_percentage, quit, and three for tests only:
// "fake_getenv NAME" prints the daemon's value of NAME or "<unset>",
// "fake_id" prints the daemon's UID and GID, "fake_hang" makes the daemon
// accept every later command and never answer (a wedged daemon).
//
// FAKEMPS_BEHAVIOUR in the daemon's environment: "exit" makes it fail at
// start, as a real daemon does without a usable GPU; "stubborn" makes it
// ignore quit and SIGTERM, so only SIGKILL ends it.
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

const (
	defaultPipeDir = "/tmp/nvidia-mps"
	defaultLogDir  = "/var/log/nvidia-mps"
	socketName     = "control"
	pidFileName    = "nvidia-cuda-mps-control.pid"
)

func main() {
	foreground := flag.Bool("f", false, "run the control daemon in the foreground")
	background := flag.Bool("d", false, "start the control daemon in the background")
	flag.Parse()
	var err error
	switch {
	case *foreground:
		err = runDaemon()
	case *background:
		err = daemonize()
	default:
		err = runClient(os.Stdin, os.Stdout)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake-mps-control:", err)
		os.Exit(1)
	}
}

// dirs returns the pipe and log directories from the environment, with the
// real tool's defaults.
func dirs() (pipe, log string) {
	pipe, log = os.Getenv("CUDA_MPS_PIPE_DIRECTORY"), os.Getenv("CUDA_MPS_LOG_DIRECTORY")
	if pipe == "" {
		pipe = defaultPipeDir
	}
	if log == "" {
		log = defaultLogDir
	}
	return pipe, log
}

// daemonize starts this program with -f in a new session, detached from the
// caller, and returns at once, as the real -d does.
func daemonize() error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(self, "-f")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start the daemon: %w", err)
	}
	return cmd.Process.Release()
}

// runClient sends each non-empty stdin line to the daemon as one command and
// copies the answer to out; it fails when the daemon cannot be reached.
func runClient(in io.Reader, out io.Writer) error {
	pipe, _ := dirs()
	scanner := bufio.NewScanner(in)
	for scanner.Scan() {
		line := strings.TrimSpace(scanner.Text())
		if line == "" {
			continue
		}
		if err := send(filepath.Join(pipe, socketName), line, out); err != nil {
			return err
		}
	}
	return scanner.Err()
}

// send runs one command: write it, close the write side, copy the answer.
func send(socket, command string, out io.Writer) error {
	conn, err := net.Dial("unix", socket)
	if err != nil {
		return fmt.Errorf("cannot reach the MPS control daemon at %s: %w", socket, err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, command+"\n"); err != nil {
		return err
	}
	if err := conn.(*net.UnixConn).CloseWrite(); err != nil {
		return err
	}
	_, err = io.Copy(out, conn)
	return err
}

// daemon is the running fake control daemon.
type daemon struct {
	pipe, log string
	stubborn  bool
	listener  net.Listener
	hung      atomic.Bool
	logFile   *os.File
	closeOnce sync.Once
}

// runDaemon serves commands until quit or a signal.
func runDaemon() error {
	pipe, log := dirs()
	d := &daemon{pipe: pipe, log: log, stubborn: os.Getenv("FAKEMPS_BEHAVIOUR") == "stubborn"}
	if err := d.open(); err != nil {
		return err
	}
	if os.Getenv("FAKEMPS_BEHAVIOUR") == "exit" {
		d.logf("exiting at start as FAKEMPS_BEHAVIOUR=exit asks")
		d.close()
		return errors.New("no CUDA-capable device is usable (FAKEMPS_BEHAVIOUR=exit)")
	}
	go d.handleSignals()
	d.logf("started: CUDA_VISIBLE_DEVICES=%q", os.Getenv("CUDA_VISIBLE_DEVICES"))
	fmt.Println("fake MPS control daemon started, pid", os.Getpid())
	return d.serve()
}

// open creates the directories, refuses to run twice, replaces a stale
// socket, listens and writes the PID file.
func (d *daemon) open() error {
	for _, dir := range []string{d.pipe, d.log} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	f, err := os.OpenFile(filepath.Join(d.log, "control.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	d.logFile = f
	socket := filepath.Join(d.pipe, socketName)
	if conn, err := net.Dial("unix", socket); err == nil {
		conn.Close()
		return errors.New("an instance of this daemon is already running")
	}
	if err := os.Remove(socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if d.listener, err = net.Listen("unix", socket); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(d.pipe, pidFileName), fmt.Appendf(nil, "%d\n", os.Getpid()), 0o644)
}

// close removes what open created in the pipe directory; quit and a signal
// may both call it.
func (d *daemon) close() {
	d.closeOnce.Do(func() {
		// The PID file goes first: closing the listener ends serve, and
		// with it the process.
		os.Remove(filepath.Join(d.pipe, pidFileName))
		if d.listener != nil {
			d.listener.Close() // a unix listener removes its socket file
		}
	})
}

// logf appends one line to control.log.
func (d *daemon) logf(format string, args ...any) {
	fmt.Fprintf(d.logFile, "[%s fake-mps-control %d] %s\n", time.Now().Format(time.RFC3339Nano), os.Getpid(), fmt.Sprintf(format, args...))
}

// handleSignals ends the daemon cleanly on SIGTERM or SIGINT, unless stubborn.
func (d *daemon) handleSignals() {
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	for sig := range signals {
		if d.stubborn {
			d.logf("ignoring %v (stubborn)", sig)
			continue
		}
		d.logf("stopping on %v", sig)
		d.close()
		os.Exit(0)
	}
}

// serve answers connections, each on its own goroutine so a client that
// never writes cannot block the others, until quit closes the listener.
func (d *daemon) serve() error {
	for {
		conn, err := d.listener.Accept()
		if errors.Is(err, net.ErrClosed) {
			return nil
		}
		if err != nil {
			return err
		}
		go func() {
			if d.handle(conn) {
				d.logf("quit")
				d.close()
			}
		}()
	}
}

// handle answers one command and reports whether it was an obeyed quit.
// A hung daemon reads the command and never answers.
func (d *daemon) handle(conn net.Conn) (quit bool) {
	line, _ := bufio.NewReader(conn).ReadString('\n')
	command := strings.Fields(line)
	if d.hung.Load() {
		d.logf("not answering %q (hung)", line)
		return false // the connection stays open and unanswered
	}
	defer conn.Close()
	if len(command) == 0 {
		return false
	}
	d.logf("command %q", strings.Join(command, " "))
	switch command[0] {
	case "get_server_list":
	case "get_default_active_thread_percentage":
		fmt.Fprintln(conn, "100.0")
	case "fake_getenv":
		fmt.Fprintln(conn, getenv(command[1:]))
	case "fake_id":
		fmt.Fprintf(conn, "uid=%d gid=%d\n", os.Getuid(), os.Getgid())
	case "fake_hang":
		d.hung.Store(true)
		fmt.Fprintln(conn, "hanging")
	case "quit":
		return !d.stubborn
	default:
		fmt.Fprintf(conn, "unknown command %q\n", command[0])
	}
	return false
}

// getenv answers fake_getenv: the value, or <unset>.
func getenv(args []string) string {
	if len(args) != 1 {
		return "usage: fake_getenv NAME"
	}
	if v, ok := os.LookupEnv(args[0]); ok {
		return v
	}
	return "<unset>"
}
