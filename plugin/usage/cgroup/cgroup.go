package cgroup

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// QoS classes, as the cgroup path names them.
const (
	QoSGuaranteed = "guaranteed"
	QoSBurstable  = "burstable"
	QoSBestEffort = "besteffort"
)

// sentinelError is a constant error type, so ErrMalformed cannot be
// reassigned yet still works with errors.Is.
type sentinelError string

// Error returns the sentinel's text.
func (e sentinelError) Error() string { return string(e) }

// ErrMalformed is wrapped by every error Parse returns: the content is not a
// well-formed /proc/<pid>/cgroup file, or a pod or container component in it
// is malformed.
const ErrMalformed sentinelError = "malformed cgroup file"

// Owner is the pod and container a process belongs to.
type Owner struct {
	// PodUID is the pod's UID in canonical form: 8-4-4-4-12 lowercase hex.
	PodUID string
	// ContainerID is the container's 64 lowercase hex digits, as the CRI
	// reports it (no runtime prefix).
	ContainerID string
	// QoS is QoSGuaranteed, QoSBurstable or QoSBestEffort where the path says
	// it, "" when it does not (a namespace-relative path that hides it).
	QoS string
}

// Read parses <procRoot>/<pid>/cgroup (procRoot is "/proc", or "/host/proc"
// when the host's proc is mounted there). A process that has exited gives an
// error for which errors.Is(err, fs.ErrNotExist) or ESRCH holds.
func Read(procRoot string, pid uint32) (Owner, bool, error) {
	name := filepath.Join(procRoot, strconv.FormatUint(uint64(pid), 10), "cgroup")
	content, err := os.ReadFile(name)
	if err != nil {
		return Owner{}, false, err
	}
	owner, ok, err := Parse(content)
	if err != nil {
		return Owner{}, false, fmt.Errorf("%s: %w", name, err)
	}
	return owner, ok, nil
}

// Parse reads the content of a /proc/<pid>/cgroup file and returns the owner.
// ok=false (and a nil error) when the process is not in a Kubernetes pod's
// container: host processes, system slices, pod or QoS cgroups without a
// container part, CRI-O's conmon. The error, which wraps ErrMalformed, is only
// for malformed content and names the line.
func Parse(content []byte) (Owner, bool, error) {
	lines, err := splitLines(string(content))
	if err != nil {
		return Owner{}, false, err
	}
	var first, memory match
	seen := map[string]bool{}
	for i, text := range lines {
		m, isMemory, err := parseLine(text, seen)
		if err != nil {
			return Owner{}, false, fmt.Errorf("%w: line %d: %w", ErrMalformed, i+1, err)
		}
		if m.pod && !first.pod {
			first = m
		}
		if m.pod && isMemory && !memory.pod {
			memory = m
		}
	}
	if memory.pod {
		return memory.owner, memory.ok, nil
	}
	return first.owner, first.ok, nil
}

// splitLines splits the file into lines, allowing one final newline.
func splitLines(content string) ([]string, error) {
	if content == "" {
		return nil, fmt.Errorf("%w: empty content", ErrMalformed)
	}
	return strings.Split(strings.TrimSuffix(content, "\n"), "\n"), nil
}

// parseLine parses one "<hierarchy-id>:<controllers>:<path>" line. It returns
// the line's match (zero for hierarchies that are not read) and whether the
// line is the memory hierarchy's. seen collects the hierarchy IDs and
// controllers of the lines before.
func parseLine(line string, seen map[string]bool) (match, bool, error) {
	id, rest, ok := strings.Cut(line, ":")
	controllers, path, ok2 := strings.Cut(rest, ":")
	if !ok || !ok2 {
		return match{}, false, fmt.Errorf("%q is not <hierarchy-id>:<controllers>:<path>", line)
	}
	if !isDigits(id) {
		return match{}, false, fmt.Errorf("hierarchy ID %q is not a number", id)
	}
	if !strings.HasPrefix(path, "/") {
		return match{}, false, fmt.Errorf("path %q does not start with /", path)
	}
	if err := claim(seen, id, controllers); err != nil {
		return match{}, false, err
	}
	if !readHierarchy(controllers) {
		return match{}, false, nil
	}
	m, err := parsePath(path)
	if err != nil {
		return match{}, false, fmt.Errorf("path %q: %w", path, err)
	}
	return m, hasController(controllers, "memory"), nil
}

// claim records a line's hierarchy ID and controllers, which the kernel never
// repeats. A repeat means a line was forged, by a workload that put a newline
// in the name of a cgroup it made, so the file is refused rather than trusted.
func claim(seen map[string]bool, id, controllers string) error {
	keys := []string{"#" + id}
	if controllers != "" {
		for c := range strings.SplitSeq(controllers, ",") {
			keys = append(keys, c)
		}
	}
	for _, k := range keys {
		if seen[k] {
			return fmt.Errorf("hierarchy %q repeats an earlier line's", id+":"+controllers)
		}
		seen[k] = true
	}
	return nil
}

// readHierarchy says whether a line's hierarchy is one whose path is read:
// the v2 unified one (no controllers) or a v1 one with memory, cpu, cpuacct,
// pids or name=systemd.
func readHierarchy(controllers string) bool {
	if controllers == "" {
		return true
	}
	for _, c := range []string{"memory", "cpu", "cpuacct", "pids", "name=systemd"} {
		if hasController(controllers, c) {
			return true
		}
	}
	return false
}

// hasController says whether the comma-separated list holds name.
func hasController(controllers, name string) bool {
	for c := range strings.SplitSeq(controllers, ",") {
		if c == name {
			return true
		}
	}
	return false
}

// isDigits says whether s is a non-empty run of decimal digits.
func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := range len(s) {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
