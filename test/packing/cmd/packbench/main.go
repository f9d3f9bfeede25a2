// Command packbench replays the packing benchmark's workloads (test/packing)
// through the extender's allocator and through kube-scheduler's DRA
// allocator (package dra; -dra=false leaves it out), and writes the results
// as JSON, PNG plots and the tables of docs/benchmarks.md. It is a module of
// its own, so its plotting libraries and the DRA allocator's CEL stay out of
// the programs' go.mod; it reads and writes
// paths relative to the repository's root, wherever it is run from:
//
//	go -C test/packing/cmd/packbench run . -generate    # rewrite the workload files from their seeds
//	go -C test/packing/cmd/packbench run . -out docs/benchmarks/packing.json -plots docs/img -md docs/benchmarks.md
package main

import (
	"compress/gzip"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/gpushare/gpushare/test/packing"
	"github.com/gpushare/gpushare/test/packing/cmd/packbench/dra"
)

func main() {
	err := toRepositoryRoot()
	if err == nil {
		err = run(os.Args[1:], os.Stderr)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "packbench:", err)
		os.Exit(1)
	}
}

// rootModule is the go.mod line of the repository's root module.
const rootModule = "module github.com/gpushare/gpushare\n"

// toRepositoryRoot changes to the nearest directory above the working one
// whose go.mod is the repository's root module, so every path flag reads
// the same from the root (make bench) and from this module (go -C).
func toRepositoryRoot() error {
	dir, err := os.Getwd()
	if err != nil {
		return err
	}
	for {
		if mod, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.Contains(string(mod), rootModule) {
			return os.Chdir(dir)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return errors.New("not inside the gpushare repository: no go.mod of github.com/gpushare/gpushare above the working directory")
		}
		dir = parent
	}
}

// Results is the JSON file packbench writes.
type Results struct {
	Command string           `json:"command"`
	Machine Machine          `json:"machine"`
	Reports []packing.Report `json:"scenarios"`
}

// Machine names where the figures were measured. Packing figures do not depend
// on it (the simulation is deterministic); run times do.
type Machine struct {
	Description string `json:"description"`
	CPUs        int    `json:"cpus"`
	GOOS        string `json:"goos"`
	GOARCH      string `json:"goarch"`
	Go          string `json:"go"`
}

func run(args []string, log io.Writer) error {
	fs := flag.NewFlagSet("packbench", flag.ContinueOnError)
	data := fs.String("data", "test/packing/testdata", "folder of the workload files")
	generate := fs.Bool("generate", false, "rewrite the workload files from their seeds and exit")
	out := fs.String("out", "", "write the results as JSON to this file")
	plots := fs.String("plots", "", "write the PNG plots into this folder")
	md := fs.String("md", "", "rewrite the packing section of this markdown file (between its markers)")
	only := fs.String("only", "", "run only the scenarios whose name contains this")
	machine := fs.String("machine", "2 cores, 24 GiB", "the machine, as the docs name it")
	withDRA := fs.Bool("dra", true, "also replay every scenario through kube-scheduler's DRA allocator (runs dra, dra/lowest, dra/scored, and dra/nvlink and dra/nvlink/scored for multi-GPU workloads)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var scenarios []packing.Scenario
	for _, s := range packing.Scenarios() {
		if strings.Contains(s.Name, *only) {
			scenarios = append(scenarios, s)
		}
	}
	if *generate {
		return generateAll(*data, scenarios, log)
	}
	res := Results{
		Command: "go -C test/packing/cmd/packbench run . " + strings.Join(args, " "),
		Machine: Machine{Description: *machine, CPUs: runtime.NumCPU(), GOOS: runtime.GOOS, GOARCH: runtime.GOARCH, Go: runtime.Version()},
	}
	for _, s := range scenarios {
		spec, pods, err := readWorkload(filepath.Join(*data, s.File()))
		if err != nil {
			return err
		}
		if !reflect.DeepEqual(spec, s.Gen) {
			return fmt.Errorf("%s: the file was generated from %+v, the scenario says %+v: run with -generate", s.File(), spec, s.Gen)
		}
		start := time.Now()
		runs := packing.RunsFor(s)
		if *withDRA {
			runs = append(runs, dra.Runs(s)...)
		}
		rep, err := packing.RunScenario(s, pods, runs)
		if err != nil {
			return err
		}
		fmt.Fprintf(log, "%-16s %6d pods  %v\n", s.Name, len(pods), time.Since(start).Round(time.Millisecond))
		for _, c := range rep.Churn {
			if t := c.Result.Topology; t != nil {
				fmt.Fprintf(log, "  %-16s multi-GPU pods placed %d, topology honoured %d (%.1f%%), allocated %.2f%%\n",
					c.Run, t.Placed, t.Honoured, 100*t.Rate, 100*c.Steady.Allocated)
			}
		}
		res.Reports = append(res.Reports, rep)
	}
	if *out != "" {
		if err := writeResults(*out, res); err != nil {
			return err
		}
	}
	if *plots != "" {
		if err := writePlots(*plots, res.Reports); err != nil {
			return err
		}
	}
	if *md != "" {
		if err := rewriteMarkdown(*md, res); err != nil {
			return err
		}
	}
	return nil
}

func generateAll(dir string, scenarios []packing.Scenario, log io.Writer) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, s := range scenarios {
		if err := s.Validate(); err != nil {
			return err
		}
		pods, err := packing.Generate(s.Gen)
		if err != nil {
			return err
		}
		f, err := os.Create(filepath.Join(dir, s.File()))
		if err != nil {
			return err
		}
		zw, err := gzip.NewWriterLevel(f, gzip.BestCompression)
		if err != nil {
			f.Close()
			return err
		}
		err = packing.WriteWorkload(zw, s.Gen, pods)
		if zerr := zw.Close(); err == nil {
			err = zerr
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		fmt.Fprintf(log, "%s: %d pods\n", s.File(), len(pods))
	}
	return nil
}

func readWorkload(path string) (packing.GenSpec, []packing.Pod, error) {
	f, err := os.Open(path)
	if err != nil {
		return packing.GenSpec{}, nil, err
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(path, ".gz") {
		zr, err := gzip.NewReader(f)
		if err != nil {
			return packing.GenSpec{}, nil, fmt.Errorf("%s: %w", path, err)
		}
		defer zr.Close()
		r = zr
	}
	spec, pods, err := packing.ReadWorkload(r)
	if err != nil {
		return packing.GenSpec{}, nil, fmt.Errorf("%s: %w", path, err)
	}
	return spec, pods, nil
}

func writeJSON(path string, v any) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(v, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// seriesLine is one sample of one run, a line of the series file.
type seriesLine struct {
	Scenario string `json:"scenario"`
	Run      string `json:"run"`
	packing.Sample
}

// writeResults writes res without its samples to path, and the samples, as
// gzip-compressed JSON lines, beside it (name-series.jsonl.gz).
func writeResults(path string, res Results) error {
	summary := res
	summary.Reports = make([]packing.Report, len(res.Reports))
	var lines []seriesLine
	for i, r := range res.Reports {
		r.Churn = slices.Clone(r.Churn)
		for j := range r.Churn {
			for _, s := range r.Churn[j].Result.Samples {
				lines = append(lines, seriesLine{Scenario: r.Scenario.Name, Run: r.Churn[j].Run, Sample: s})
			}
			r.Churn[j].Result.Samples = nil
		}
		summary.Reports[i] = r
	}
	if err := writeJSON(path, summary); err != nil {
		return err
	}
	f, err := os.Create(strings.TrimSuffix(path, ".json") + "-series.jsonl.gz")
	if err != nil {
		return err
	}
	zw, err := gzip.NewWriterLevel(f, gzip.BestCompression)
	if err != nil {
		f.Close()
		return err
	}
	enc := json.NewEncoder(zw)
	for _, l := range lines {
		if err = enc.Encode(l); err != nil {
			break
		}
	}
	if zerr := zw.Close(); err == nil {
		err = zerr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
