package mps

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"
)

const (
	// outputTail is how much of the daemon's output an error quotes.
	outputTail = 2048
	// killWait bounds the wait for a daemon to be reaped after SIGKILL, which
	// it cannot ignore; only a process stuck in the kernel takes longer.
	killWait = 5 * time.Second
)

// process is a control daemon running in the foreground as our child.
type process struct {
	cmd *exec.Cmd
	// done is closed when the daemon has exited and been reaped.
	done chan struct{}
	// err is how it exited; read only after done.
	err error
	// outPath and outStart locate this run's output in the output file.
	outPath  string
	outStart int64
}

// launch starts "bin -f" with env, as cred when set, its output appended to
// outPath.
func launch(bin string, env []string, cred *Credential, outPath string) (*process, error) {
	out, err := os.OpenFile(outPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, fmt.Errorf("MPS control daemon output: %w", err)
	}
	defer out.Close() // the child has its own descriptor
	fmt.Fprintf(out, "--- gpushare: %s -f, %s\n", bin, time.Now().UTC().Format(time.RFC3339))
	start, err := out.Seek(0, io.SeekEnd)
	if err != nil {
		return nil, fmt.Errorf("MPS control daemon output: %w", err)
	}
	cmd := exec.Command(bin, "-f")
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = sysProcAttr(cred)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start MPS control daemon %s: %w", bin, err)
	}
	p := &process{cmd: cmd, done: make(chan struct{}), outPath: outPath, outStart: start}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *process) pid() int { return p.cmd.Process.Pid }

// exited reports whether the daemon has exited.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// wait waits up to timeout for the daemon to exit and reports whether it did.
func (p *process) wait(timeout time.Duration) bool {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.done:
		return true
	case <-t.C:
		return false
	}
}

// stop ends the daemon with SIGTERM, waiting up to grace, then SIGKILL, and
// reports whether it is gone.
func (p *process) stop(grace time.Duration) bool {
	if p.exited() {
		return true
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	if p.wait(grace) {
		return true
	}
	_ = p.cmd.Process.Kill()
	return p.wait(killWait)
}

// reason says how the daemon exited and quotes the end of its output; call
// it after done.
func (p *process) reason() string {
	if !p.exited() {
		return "still running"
	}
	how := "exit status 0"
	if p.err != nil {
		how = p.err.Error()
	}
	if tail := p.outputTail(); tail != "" {
		how += "; its output ends: " + tail
	}
	return how
}

// outputTail returns the last outputTail bytes this run wrote, on one line.
func (p *process) outputTail() string {
	f, err := os.Open(p.outPath)
	if err != nil {
		return ""
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return ""
	}
	from := max(p.outStart, info.Size()-outputTail)
	data := make([]byte, info.Size()-from)
	if _, err := f.ReadAt(data, from); err != nil && err != io.EOF {
		return ""
	}
	return oneLine(string(data))
}
