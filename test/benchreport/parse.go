// Package benchreport turns raw `go test -bench` output into the figures of
// docs/benchmarks.md: per benchmark and metric the median, min and max over
// the runs (-count), as JSON and as the markdown tables between the
// benchreport markers.
//
// A raw file is the benchmark format of
// https://go.googlesource.com/proposal/+/master/design/14313-benchmark-format.md,
// so benchstat reads it as it is. The program that runs the benchmarks
// (cmd/benchreport run) puts a header of "# key: value" lines on top naming
// the command, the machine, the date and the revision; they are comments to
// benchstat, so comparing two raw files never splits them into different
// tables. Everything here is pure: the same raw files give the same JSON and
// markdown.
package benchreport

import (
	"bufio"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Machine is where a raw file was measured.
type Machine struct {
	CPU         string `json:"cpu"`          // model name from /proc/cpuinfo
	Cores       int    `json:"cores"`        // runtime.NumCPU of the runner
	MemoryBytes uint64 `json:"memory_bytes"` // MemTotal from /proc/meminfo
	OS          string `json:"os"`
	Arch        string `json:"arch"`
	Go          string `json:"go"` // the toolchain's version
}

// Short is the machine as each table row names it.
func (m Machine) Short() string {
	return fmt.Sprintf("%d cores, %s", m.Cores, gib(m.MemoryBytes))
}

// String is the machine line above the tables.
func (m Machine) String() string {
	return fmt.Sprintf("%s, %s, %s/%s, %s", m.CPU, m.Short(), m.OS, m.Arch, m.Go)
}

func gib(b uint64) string { return strconv.FormatFloat(float64(b)/(1<<30), 'f', 1, 64) + " GiB" }

// Header is what the runner records above a raw file's results.
type Header struct {
	Command  string // the exact command line, shell-quoted
	Date     string // RFC 3339, UTC, when the command started
	Revision string // git commit, "+modified" when the tree had changes outside docs/
	Machine  Machine
}

// The header's keys, in the order they are written.
const (
	keyCommand  = "command"
	keyDate     = "date"
	keyRevision = "revision"
	keyCPU      = "cpu-model"
	keyCores    = "cores"
	keyMemory   = "memory-bytes"
	keyOS       = "os"
	keyArch     = "arch"
	keyGo       = "go"
)

// headerPrefix starts each header line: benchstat ignores lines that are
// neither results nor "key: value" configuration, and "#" is not a key.
const headerPrefix = "# benchreport "

// FormatHeader renders h as the lines the runner writes first.
func FormatHeader(h Header) string {
	var b strings.Builder
	for _, kv := range [][2]string{
		{keyCommand, h.Command}, {keyDate, h.Date}, {keyRevision, h.Revision},
		{keyCPU, h.Machine.CPU}, {keyCores, strconv.Itoa(h.Machine.Cores)},
		{keyMemory, strconv.FormatUint(h.Machine.MemoryBytes, 10)},
		{keyOS, h.Machine.OS}, {keyArch, h.Machine.Arch}, {keyGo, h.Machine.Go},
	} {
		fmt.Fprintf(&b, "%s%s: %s\n", headerPrefix, kv[0], kv[1])
	}
	return b.String()
}

// Value is one measurement of a result line: 1234 ns/op, 3.2 p50-ms.
type Value struct {
	Value float64
	Unit  string
}

// Result is one benchmark line: one run of one benchmark.
type Result struct {
	Pkg   string // from the last "pkg:" line before it
	Name  string // full name with sub-benchmarks, "BenchmarkFilter/nodes=1000", without the -procs suffix
	Procs int    // GOMAXPROCS, the name's -N suffix (1 when absent)
	Iters int64
	Line  int // in the raw file, for errors
	Value []Value
}

// File is a parsed raw file.
type File struct {
	Path    string
	Header  Header
	Results []Result
}

// Parse reads a raw file. Lines that are neither header, configuration nor
// result lines (PASS, ok, logs) are skipped, as benchstat skips them; a
// malformed result line, a missing header key or a failed benchmark is an
// error, since its figures would be wrong or unnamed.
func Parse(path string, r io.Reader) (File, error) {
	f := File{Path: path}
	seen := map[string]bool{}
	pkg := ""
	type bareName struct {
		pkg, name string
		line      int
	}
	var bare []bareName
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, headerPrefix); ok {
			key, val, ok := strings.Cut(rest, ": ")
			if !ok {
				return f, fmt.Errorf("%s:%d: header line without \"key: value\"", path, n)
			}
			if err := setHeader(&f.Header, key, val); err != nil {
				return f, fmt.Errorf("%s:%d: %w", path, n, err)
			}
			seen[key] = true
			continue
		}
		if strings.HasPrefix(line, "--- FAIL") || line == "FAIL" || strings.HasPrefix(line, "FAIL\t") {
			return f, fmt.Errorf("%s:%d: a benchmark failed: %q", path, n, line)
		}
		if key, val, ok := configLine(line); ok {
			if key == "pkg" {
				pkg = val
			}
			continue
		}
		res, ok, err := resultLine(line)
		if err != nil {
			return f, fmt.Errorf("%s:%d: %w", path, n, err)
		}
		if ok && pkg == "" {
			return f, fmt.Errorf("%s:%d: a result before any \"pkg:\" line", path, n)
		}
		if ok && res.Iters == 0 {
			bare = append(bare, bareName{pkg, res.Name, n})
		} else if ok {
			res.Pkg, res.Line = pkg, n
			f.Results = append(f.Results, res)
		}
	}
	if err := sc.Err(); err != nil {
		return f, fmt.Errorf("%s: %w", path, err)
	}
	// go test prints a benchmark's name before running it and its figures
	// after, on the same line; output in between pushes them to a line of
	// their own, which no parser can tie to the name.
	for _, b := range bare {
		if !slices.ContainsFunc(f.Results, func(r Result) bool {
			return r.Pkg == b.pkg && (r.Name == b.name || strings.HasPrefix(r.Name, b.name+"/"))
		}) {
			return f, fmt.Errorf("%s:%d: %s has no result: did output interrupt its line?", path, b.line, b.name)
		}
	}
	for _, k := range []string{keyCommand, keyDate, keyRevision, keyCPU, keyCores, keyMemory, keyOS, keyArch, keyGo} {
		if !seen[k] {
			return f, fmt.Errorf("%s: no %q header line: write raw files with `benchreport run`", path, headerPrefix+k+": ")
		}
	}
	return f, nil
}

func setHeader(h *Header, key, val string) error {
	var err error
	switch key {
	case keyCommand:
		h.Command = val
	case keyDate:
		h.Date = val
	case keyRevision:
		h.Revision = val
	case keyCPU:
		h.Machine.CPU = val
	case keyCores:
		h.Machine.Cores, err = strconv.Atoi(val)
	case keyMemory:
		h.Machine.MemoryBytes, err = strconv.ParseUint(val, 10, 64)
	case keyOS:
		h.Machine.OS = val
	case keyArch:
		h.Machine.Arch = val
	case keyGo:
		h.Machine.Go = val
	default:
		return fmt.Errorf("unknown header key %q", key)
	}
	if err != nil {
		return fmt.Errorf("header %s: %w", key, err)
	}
	return nil
}

// configLine reports whether line is a "key: value" configuration line: a
// key that starts lower case and has no space or upper case, then a colon
// and spaces or tabs.
func configLine(line string) (key, val string, ok bool) {
	i := strings.IndexByte(line, ':')
	if i <= 0 {
		return "", "", false
	}
	key = line[:i]
	first, _ := utf8.DecodeRuneInString(key)
	if !unicode.IsLower(first) || strings.IndexFunc(key, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsUpper(r) }) >= 0 {
		return "", "", false
	}
	rest := line[i+1:]
	if rest == "" {
		return key, "", true
	}
	if rest[0] != ' ' && rest[0] != '\t' {
		return "", "", false
	}
	return key, strings.TrimSpace(rest), true
}

// resultLine parses "BenchmarkName-N  iters  value unit  value unit ...".
// ok is false for a name that continues in lower case (BenchmarkingX). A
// bare name, which go test prints before a benchmark's output or for a
// parent of sub-benchmarks, comes back with Iters 0.
func resultLine(line string) (Result, bool, error) {
	rest, ok := strings.CutPrefix(line, "Benchmark")
	if !ok {
		return Result{}, false, nil
	}
	if r, _ := utf8.DecodeRuneInString(rest); unicode.IsLower(r) {
		return Result{}, false, nil
	}
	fields := strings.Fields(line)
	res := Result{}
	res.Name, res.Procs = splitProcs(fields[0])
	if len(fields) == 1 {
		return res, true, nil // a bare name: Iters 0
	}
	iters, err := strconv.ParseInt(fields[1], 10, 64)
	if err != nil {
		return Result{}, false, fmt.Errorf("%s: iteration count %q", fields[0], fields[1])
	}
	res.Iters = iters
	vals := fields[2:]
	if len(vals) == 0 || len(vals)%2 != 0 {
		return Result{}, false, fmt.Errorf("%s: want value-unit pairs after the iteration count, got %q", fields[0], strings.Join(vals, " "))
	}
	for i := 0; i < len(vals); i += 2 {
		v, err := strconv.ParseFloat(vals[i], 64)
		if err != nil {
			return Result{}, false, fmt.Errorf("%s: value %q", fields[0], vals[i])
		}
		res.Value = append(res.Value, Value{Value: v, Unit: vals[i+1]})
	}
	return res, true, nil
}

// splitProcs splits the -N GOMAXPROCS suffix off a benchmark name, as
// benchstat does; go test leaves it out when GOMAXPROCS is 1.
func splitProcs(name string) (string, int) {
	i := strings.LastIndexByte(name, '-')
	if i < 0 {
		return name, 1
	}
	n, err := strconv.Atoi(name[i+1:])
	if err != nil || n <= 0 {
		return name, 1
	}
	return name[:i], n
}
