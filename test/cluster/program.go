package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
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

// OwnBinaries puts this repository's commands (gpushare-scheduler-extender,
// gpushare-device-plugin, kubectl-inspect-gpushare), built with the race detector when race is
// set, into dir and returns dir. The first call of a process for each race setting builds them
// (a link of three binaries costs about 20 s of CPU even with the Go build cache warm) into a
// directory of this process; every call then hard-links (or copies) them into dir. That directory
// lives as long as the process: a later process removes those of processes no longer running.
func OwnBinaries(dir string, race bool) (string, error) {
	built, err := ownBuild(race)
	if err != nil {
		return "", err
	}
	for _, name := range ownCommands {
		if err := linkOrCopy(filepath.Join(built, name), filepath.Join(dir, name)); err != nil {
			return "", err
		}
	}
	return dir, nil
}

var ownCommands = []string{"gpushare-scheduler-extender", "gpushare-device-plugin", "kubectl-inspect-gpushare", "gpushare-webhook"}

var (
	ownMu    sync.Mutex
	ownBuilt = map[bool]string{} // race -> directory holding the built commands
)

// ownPrefix names this process's build directories in os.TempDir(): gpushare-own-<pid>-*.
const ownPrefix = "gpushare-own-"

func ownBuild(race bool) (string, error) {
	ownMu.Lock()
	defer ownMu.Unlock()
	if dir, ok := ownBuilt[race]; ok {
		return dir, nil
	}
	if len(ownBuilt) == 0 {
		removeStaleOwnBuilds()
	}
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", fmt.Errorf("cannot locate the repository")
	}
	root := filepath.Join(filepath.Dir(file), "..", "..")
	dir, err := os.MkdirTemp("", fmt.Sprintf("%s%d-", ownPrefix, os.Getpid()))
	if err != nil {
		return "", err
	}
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	if race {
		args = append(args, "-race")
	}
	for _, name := range ownCommands {
		args = append(args, "./cmd/"+name)
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		_ = os.RemoveAll(dir)
		return "", fmt.Errorf("go %v: %w\n%s", args, err, out.String())
	}
	ownBuilt[race] = dir
	return dir, nil
}

// removeStaleOwnBuilds removes the build directories of processes that no longer run.
func removeStaleOwnBuilds() {
	entries, err := os.ReadDir(os.TempDir())
	if err != nil {
		return
	}
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), ownPrefix)
		if !ok || !e.IsDir() {
			continue
		}
		pidText, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidText)
		if err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			_ = os.RemoveAll(filepath.Join(os.TempDir(), e.Name()))
		}
	}
}

// linkOrCopy makes to the same file as from: a hard link, or a copy across file systems.
func linkOrCopy(from, to string) error {
	if err := os.Link(from, to); err == nil {
		return nil
	}
	data, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, data, 0o755)
}

// LogCount returns how many lines of the program's log (all its runs) contain substr.
func (p *Program) LogCount(substr string) int {
	data, err := os.ReadFile(p.proc.logPath)
	if err != nil {
		return 0
	}
	return bytes.Count(data, []byte(substr))
}
