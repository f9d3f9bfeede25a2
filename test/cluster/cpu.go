package cluster

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"time"
)

// clockTicksPerSecond is USER_HZ, the unit of /proc/<pid>/stat's CPU times:
// 100 on every Linux architecture Go runs on (the kernel fixes it for its ABI).
const clockTicksPerSecond = 100

// cpu returns the CPU time (user + system) the current run of the process has
// used so far, from /proc. A restarted process starts again from zero.
func (p *process) cpu() (time.Duration, error) {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil || isClosed(done) {
		return 0, fmt.Errorf("%s is not running", p.name)
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid))
	if err != nil {
		return 0, fmt.Errorf("%s: %w", p.name, err)
	}
	d, err := parseStatCPU(stat)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", p.name, err)
	}
	return d, nil
}

// parseStatCPU reads utime and stime, fields 14 and 15 of a /proc/<pid>/stat
// line. The command name (field 2) is in parentheses and may hold spaces or
// parentheses itself, so fields are counted from the last ')'.
func parseStatCPU(stat []byte) (time.Duration, error) {
	end := bytes.LastIndexByte(stat, ')')
	if end < 0 {
		return 0, fmt.Errorf("malformed /proc stat line %.60q", stat)
	}
	fields := bytes.Fields(stat[end+1:]) // fields[0] is field 3, the state
	if len(fields) < 13 {
		return 0, fmt.Errorf("/proc stat line has %d fields after the name, want at least 13", len(fields))
	}
	var ticks int64
	for _, f := range fields[11:13] {
		n, err := strconv.ParseInt(string(f), 10, 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("/proc stat CPU time %q", f)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicksPerSecond, nil
}

// ComponentCPU returns the CPU time used so far by the current run of each
// running control-plane component ("etcd", "kube-apiserver",
// "kube-controller-manager", "kube-scheduler") and of each program started with StartProgram, by name.
// Benchmarks take the difference across a measured interval.
func (c *Cluster) ComponentCPU() (map[string]time.Duration, error) {
	c.mu.Lock()
	procs := []*process{c.etcd, c.api, c.controllers, c.scheduler}
	for _, p := range c.programs {
		procs = append(procs, p.proc)
	}
	c.mu.Unlock()
	out := map[string]time.Duration{}
	for _, p := range procs {
		if p == nil || !p.running() {
			continue
		}
		d, err := p.cpu()
		if err != nil {
			return nil, err
		}
		out[p.name] = d
	}
	return out, nil
}
