package cluster

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
)

// RSS returns the resident set size of the program's current run and the
// highest it has been (VmRSS and VmHWM of /proc/<pid>/status), in bytes.
// Memory benchmarks read it from outside, as a container's memory limit sees
// the process, rather than trusting the program's own accounting.
func (p *Program) RSS() (current, peak uint64, err error) { return p.proc.rss() }

// rss reads the current run's VmRSS and VmHWM.
func (p *process) rss() (current, peak uint64, err error) {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil || isClosed(done) {
		return 0, 0, fmt.Errorf("%s is not running", p.name)
	}
	current, peak, err = readRSS(cmd.Process.Pid)
	if err != nil {
		return 0, 0, fmt.Errorf("%s: %w", p.name, err)
	}
	return current, peak, nil
}

// readRSS reads VmRSS and VmHWM of process pid, in bytes.
func readRSS(pid int) (current, peak uint64, err error) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	return parseStatusRSS(status)
}

// parseStatusRSS reads the VmRSS and VmHWM lines of a /proc/<pid>/status
// file ("VmRSS:\t  123456 kB"; the kernel's kB are KiB). A zombie or a
// kernel thread has neither line, which is an error: it has no memory to
// report, not zero.
func parseStatusRSS(status []byte) (current, peak uint64, err error) {
	var haveRSS, haveHWM bool
	for line := range bytes.Lines(status) {
		key, value, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		var dst *uint64
		switch string(key) {
		case "VmRSS":
			dst, haveRSS = &current, true
		case "VmHWM":
			dst, haveHWM = &peak, true
		default:
			continue
		}
		fields := bytes.Fields(value)
		if len(fields) != 2 || string(fields[1]) != "kB" {
			return 0, 0, fmt.Errorf("/proc status line %q: want a number of kB", bytes.TrimSpace(line))
		}
		kib, err := strconv.ParseUint(string(fields[0]), 10, 64)
		if err != nil || kib > 1<<53 {
			return 0, 0, fmt.Errorf("/proc status line %q: want a number of kB", bytes.TrimSpace(line))
		}
		*dst = kib << 10
	}
	if !haveRSS || !haveHWM {
		return 0, 0, fmt.Errorf("/proc status has no VmRSS and VmHWM lines (a zombie or a kernel thread?)")
	}
	return current, peak, nil
}
