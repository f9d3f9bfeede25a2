package cluster

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"time"
)

// Program is one of our own binaries (the extender, a device plugin) run as a separate process on
// the bed, so tests can crash it with SIGKILL as an OOM kill or a node failure would, and start it
// again with the same arguments.
type Program struct{ proc *process }

// StartProgram runs bin with args (and extra environment entries "K=V") as a process named name
// whose log joins the cluster's logs. The cluster stops it when it stops.
func (c *Cluster) StartProgram(name, bin string, args []string, env ...string) (*Program, error) {
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return nil, fmt.Errorf("cluster stopped")
	}
	if _, dup := c.programs[name]; dup {
		c.mu.Unlock()
		return nil, fmt.Errorf("program %s already exists", name)
	}
	p := &Program{proc: newProcess(name, bin, filepath.Join(c.dir, name+".log"), args, env...)}
	c.programs[name] = p
	c.mu.Unlock()
	if err := p.proc.start(); err != nil {
		return nil, err
	}
	return p, nil
}

// Start runs the program again after Kill or Stop.
func (p *Program) Start() error { return p.proc.start() }

// Kill ends the program at once with SIGKILL and waits for it.
func (p *Program) Kill() { p.proc.kill() }

// Stop sends SIGTERM, waits up to grace, then SIGKILLs.
func (p *Program) Stop(grace time.Duration) { p.proc.stop(grace) }

// Running tells whether the program's current run is alive.
func (p *Program) Running() bool { return p.proc.running() }

// Exited is closed when the current run ends.
func (p *Program) Exited() <-chan struct{} { return p.proc.exited() }

// LogTail returns the last n lines of the program's log (all its runs).
func (p *Program) LogTail(n int) string { return p.proc.logTail(n) }

// OwnBinaries builds this repository's commands (gpushare-scheduler-extender,
// gpushare-device-plugin, kubectl-inspect-gpushare) into dir with the race detector when race is
// set, and returns the directory. The Go build cache makes repeated calls cheap.
func OwnBinaries(dir string, race bool) (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", fmt.Errorf("cannot locate the repository")
	}
	root := filepath.Join(filepath.Dir(file), "..", "..")
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	if race {
		args = append(args, "-race")
	}
	args = append(args, "./cmd/gpushare-scheduler-extender", "./cmd/gpushare-device-plugin", "./cmd/kubectl-inspect-gpushare")
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go %v: %w\n%s", args, err, out.String())
	}
	if _, err := os.Stat(filepath.Join(dir, "gpushare-scheduler-extender")); err != nil {
		return "", err
	}
	return dir, nil
}

// LogCount returns how many lines of the program's log (all its runs) contain substr.
func (p *Program) LogCount(substr string) int {
	data, err := os.ReadFile(p.proc.logPath)
	if err != nil {
		return 0
	}
	return bytes.Count(data, []byte(substr))
}
