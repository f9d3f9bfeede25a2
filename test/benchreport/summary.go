package benchreport

import (
	"fmt"
	"slices"
	"strings"
)

// Stat is one metric of one benchmark over its runs: a record of results.json.
type Stat struct {
	Source  string    `json:"source"`  // the raw file
	Package string    `json:"package"` // import path
	Name    string    `json:"name"`    // "BenchmarkFilter/nodes=1000", without the -procs suffix
	Procs   int       `json:"procs"`   // GOMAXPROCS of the run
	Metric  string    `json:"metric"`  // as reported: "ns/op", "p50-ns", "pods/s-extender"
	Unit    string    `json:"unit"`    // what the value counts: "ns", "B", "pods/s"
	N       int       `json:"n"`       // runs
	Median  float64   `json:"median"`
	Min     float64   `json:"min"`
	Max     float64   `json:"max"`
	Values  []float64 `json:"values"`  // each run's value, in the raw file's order
	Command string    `json:"command"` // the exact command that wrote the raw file
	Rerun   string    `json:"rerun"`   // that command narrowed to this benchmark's package and name
}

// Source is a raw file and how it was made.
type Source struct {
	Path     string `json:"path"`
	Command  string `json:"command"`
	Date     string `json:"date"`
	Revision string `json:"revision"`
}

// Results is results.json.
type Results struct {
	Module     string   `json:"module"` // the main module's path: packages below it are shown as ./dir
	Machine    Machine  `json:"machine"`
	Sources    []Source `json:"sources"`
	Benchmarks []Stat   `json:"benchmarks"`
}

// benchKey names one benchmark; the same name in two raw files is two
// benchmarks, and Summarize refuses it.
type benchKey struct {
	pkg, name string
	procs     int
}

// Summarize computes each benchmark's metrics over its runs. module is the
// main module's path, to turn packages into ./dir patterns in the rerun
// commands. The raw files must come from one machine: the tables name one.
func Summarize(files []File, module string) (Results, error) {
	if len(files) == 0 {
		return Results{}, fmt.Errorf("no raw files")
	}
	res := Results{Module: module, Machine: files[0].Header.Machine, Sources: []Source{}, Benchmarks: []Stat{}}
	owner := map[benchKey]string{}
	for _, f := range files {
		// Compared as the tables print them: MemTotal moves by some KiB between
		// boots of one machine, as the kernel reserves memory.
		if f.Header.Machine.String() != res.Machine.String() {
			return Results{}, fmt.Errorf("%s was measured on %s, %s on %s: run them on one machine", files[0].Path, res.Machine, f.Path, f.Header.Machine)
		}
		if len(f.Results) == 0 {
			return Results{}, fmt.Errorf("%s: no benchmark results", f.Path)
		}
		res.Sources = append(res.Sources, Source{Path: f.Path, Command: f.Header.Command, Date: f.Header.Date, Revision: f.Header.Revision})
		var order []benchKey
		runs := map[benchKey][]Result{}
		for _, r := range f.Results {
			k := benchKey{r.Pkg, r.Name, r.Procs}
			if p, ok := owner[k]; ok && p != f.Path {
				return Results{}, fmt.Errorf("%s %s is in both %s and %s", r.Pkg, r.Name, p, f.Path)
			}
			owner[k] = f.Path
			if _, ok := runs[k]; !ok {
				order = append(order, k)
			}
			runs[k] = append(runs[k], r)
		}
		for _, k := range order {
			rerun, err := Rerun(f.Header.Command, k.pkg, k.name, module)
			if err != nil {
				return Results{}, fmt.Errorf("%s: %w", f.Path, err)
			}
			base := Stat{Source: f.Path, Package: k.pkg, Name: k.name, Procs: k.procs, Command: f.Header.Command, Rerun: rerun}
			res.Benchmarks = append(res.Benchmarks, metrics(base, runs[k])...)
		}
	}
	return res, nil
}

// metrics gives one Stat per metric of a benchmark's runs, in the order the
// metrics first appear.
func metrics(base Stat, runs []Result) []Stat {
	var units []string
	values := map[string][]float64{}
	for _, r := range runs {
		for _, v := range r.Value {
			if _, ok := values[v.Unit]; !ok {
				units = append(units, v.Unit)
			}
			values[v.Unit] = append(values[v.Unit], v.Value)
		}
	}
	out := make([]Stat, 0, len(units))
	for _, u := range units {
		s := base
		s.Metric, s.Unit, s.Values = u, UnitOf(u), values[u]
		s.N = len(s.Values)
		s.Median, s.Min, s.Max = Median(s.Values), slices.Min(s.Values), slices.Max(s.Values)
		out = append(out, s)
	}
	return out
}

// Median is the middle value, or the mean of the two middle ones for an even
// count; 0 for none.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	m := len(s) / 2
	if len(s)%2 == 1 {
		return s[m]
	}
	return (s[m-1] + s[m]) / 2
}

// timeScale is a time unit's size in ns; ok is false for other units.
func timeScale(u string) (float64, bool) {
	switch u {
	case "ns":
		return 1, true
	case "µs", "us":
		return 1e3, true
	case "ms":
		return 1e6, true
	case "s", "sec":
		return 1e9, true
	}
	return 0, false
}

// sizeScale is a size unit's size in bytes; ok is false for other units.
func sizeScale(u string) (float64, bool) {
	switch u {
	case "B", "bytes":
		return 1, true
	case "KiB":
		return 1 << 10, true
	case "MiB":
		return 1 << 20, true
	case "GiB":
		return 1 << 30, true
	}
	return 0, false
}

func isTimeOrSize(u string) bool {
	_, t := timeScale(u)
	_, s := sizeScale(u)
	return t || s
}

// UnitOf says what a metric's value counts, from the conventions of
// testing.B.ReportMetric: "ns/op" is ns, "p50-µs" µs, "cache-MiB" MiB,
// "bytes/msg" bytes, "pods/s-extender" pods/s, "cpu-ms/pod-etcd-alone"
// ms/pod; anything else is its own unit ("ratio", "devices").
func UnitOf(metric string) string {
	// The process names in a CPU metric are not units, whatever their
	// segments read as; CPU ms/pod is not a duration to scale either.
	if strings.HasPrefix(metric, cpuPrefix) {
		return cpuUnit
	}
	if u, ok := strings.CutSuffix(metric, "/op"); ok {
		return u
	}
	segs := strings.Split(metric, "-")
	for _, s := range segs {
		if isTimeOrSize(s) {
			return s
		}
	}
	if u, _, ok := strings.Cut(metric, "/"); ok && isTimeOrSize(u) {
		return u
	}
	if len(segs) > 1 {
		for _, s := range segs {
			if strings.Contains(s, "/") {
				return s
			}
		}
	}
	return metric
}
