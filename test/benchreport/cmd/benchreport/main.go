// Command benchreport runs Go benchmarks into raw files and turns those into
// docs/benchmarks/results.json and the throughput and latency tables of
// docs/benchmarks.md (see package test/benchreport).
//
//	benchreport run -o docs/benchmarks/raw/go.txt -- go test -run='^$' -bench=. -benchmem -count=5 ./...
//	benchreport report -json docs/benchmarks/results.json -md docs/benchmarks.md docs/benchmarks/raw/*.txt
//
// run writes the header (command, date, revision, machine) and then the
// command's standard output, which is also shown; the file appears only if
// the command succeeds. report reads only the raw files, so it gives the
// same output wherever it runs.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/gpushare/gpushare/test/benchreport"
)

func main() {
	err := dispatch(os.Args[1:])
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		os.Exit(max(exit.ExitCode(), 1))
	case err != nil:
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		os.Exit(1)
	}
}

const usage = `usage:
  benchreport run -o RAW -- go test -bench=... [flags] [packages]
  benchreport report [-json FILE] [-md FILE] [-module PATH] RAW...`

func dispatch(args []string) error {
	if len(args) == 0 {
		return errors.New(usage)
	}
	switch args[0] {
	case "run":
		return run(args[1:])
	case "report":
		return report(args[1:])
	}
	return fmt.Errorf("unknown command %q\n%s", args[0], usage)
}

func run(args []string) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	out := fs.String("o", "", "the raw file to write")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cmdArgs := fs.Args()
	if *out == "" || len(cmdArgs) == 0 {
		return errors.New(usage)
	}
	h := benchreport.Header{
		Command:  benchreport.QuoteCommand(cmdArgs),
		Date:     time.Now().UTC().Format(time.RFC3339),
		Revision: revision(),
		Machine:  machine(),
	}
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		return err
	}
	// Written aside and renamed at the end: a failed or interrupted run
	// leaves the last good raw file in place.
	partial := *out + ".partial"
	f, err := os.Create(partial)
	if err != nil {
		return err
	}
	defer os.Remove(partial)
	if _, err := io.WriteString(f, benchreport.FormatHeader(h)); err != nil {
		f.Close()
		return err
	}
	// Ctrl-C reaches the command too; wait for it to end, then clean up.
	signal.Notify(make(chan os.Signal, 1), os.Interrupt)
	cmd := exec.Command(cmdArgs[0], cmdArgs[1:]...)
	cmd.Stdout = io.MultiWriter(f, os.Stdout)
	cmd.Stderr = os.Stderr
	start := time.Now()
	runErr := cmd.Run()
	if err := f.Close(); err != nil && runErr == nil {
		runErr = err
	}
	if runErr != nil {
		return fmt.Errorf("%s: %w (%s not written)", h.Command, runErr, *out)
	}
	if err := os.Rename(partial, *out); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "benchreport: wrote %s in %v\n", *out, time.Since(start).Round(time.Second))
	return nil
}

func report(args []string) error {
	fs := flag.NewFlagSet("report", flag.ContinueOnError)
	jsonOut := fs.String("json", "", "write the results as JSON to this file")
	md := fs.String("md", "", "rewrite the section of this markdown file between the benchreport markers")
	module := fs.String("module", "", "the main module's path (default: the module line of ./go.mod)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return errors.New(usage)
	}
	if *module == "" {
		m, err := modulePath("go.mod")
		if err != nil {
			return err
		}
		*module = m
	}
	var files []benchreport.File
	for _, path := range fs.Args() {
		f, err := parseFile(path)
		if err != nil {
			return err
		}
		files = append(files, f)
	}
	res, err := benchreport.Summarize(files, *module)
	if err != nil {
		return err
	}
	if *jsonOut != "" {
		b, err := json.MarshalIndent(res, "", " ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(*jsonOut, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	if *md != "" {
		doc, err := os.ReadFile(*md)
		if err != nil {
			return err
		}
		out, err := benchreport.Replace(doc, benchreport.Markdown(res, benchreport.Options{Dir: filepath.Dir(*md), JSON: *jsonOut}))
		if err != nil {
			return fmt.Errorf("%s: %w", *md, err)
		}
		if err := os.WriteFile(*md, out, 0o644); err != nil {
			return err
		}
	}
	fmt.Fprintf(os.Stderr, "benchreport: %d figures from %d raw files\n", len(res.Benchmarks), len(files))
	return nil
}

func parseFile(path string) (benchreport.File, error) {
	f, err := os.Open(path)
	if err != nil {
		return benchreport.File{}, err
	}
	defer f.Close()
	return benchreport.Parse(path, f)
}

func modulePath(gomod string) (string, error) {
	b, err := os.ReadFile(gomod)
	if err != nil {
		return "", fmt.Errorf("%w (run from the module root or pass -module)", err)
	}
	for line := range strings.Lines(string(b)) {
		if m, ok := strings.CutPrefix(strings.TrimSpace(line), "module "); ok {
			return strings.Trim(strings.TrimSpace(m), `"`), nil
		}
	}
	return "", fmt.Errorf("%s: no module line", gomod)
}

// machine describes this machine; fields it cannot read stay empty or zero.
func machine() benchreport.Machine {
	m := benchreport.Machine{CPU: "unknown CPU", Cores: runtime.NumCPU(), OS: runtime.GOOS, Arch: runtime.GOARCH, Go: runtime.Version()}
	if v, ok := procField("/proc/cpuinfo", "model name"); ok {
		m.CPU = strings.Join(strings.Fields(v), " ")
	}
	if v, ok := procField("/proc/meminfo", "MemTotal"); ok {
		if kb, err := strconv.ParseUint(strings.TrimSuffix(v, " kB"), 10, 64); err == nil {
			m.MemoryBytes = kb << 10
		}
	}
	return m
}

// procField is the value of the first "key: value" line of a /proc file.
func procField(path, key string) (string, bool) {
	f, err := os.Open(path)
	if err != nil {
		return "", false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v), true
		}
	}
	return "", false
}

// revision is HEAD's commit, marked +modified when files outside docs/
// differ from it: the figures in docs/ do not change what was measured.
func revision() string {
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	rev := string(bytes.TrimSpace(head))
	status, err := exec.Command("git", "status", "--porcelain", "--", ".", ":(exclude)docs").Output()
	if err != nil || len(bytes.TrimSpace(status)) > 0 {
		rev += "+modified"
	}
	return rev
}
