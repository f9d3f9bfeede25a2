package benchreport

import (
	"bytes"
	"fmt"
	"math"
	"path/filepath"
	"strconv"
	"strings"
)

// The generated tables sit between these markers; BeginMarker is the prefix
// of the begin line, whose remainder is left as it is.
const (
	BeginMarker = "<!-- benchreport:begin"
	EndMarker   = "<!-- benchreport:end -->"
)

// Replace puts section between the markers of doc and leaves every byte
// outside them as it was.
func Replace(doc []byte, section string) ([]byte, error) {
	b := bytes.Index(doc, []byte(BeginMarker))
	if b < 0 {
		return nil, fmt.Errorf("no %q line", BeginMarker+" ... -->")
	}
	if bytes.Contains(doc[b+1:], []byte(BeginMarker)) {
		return nil, fmt.Errorf("more than one %q line", BeginMarker)
	}
	closing := bytes.Index(doc[b:], []byte("-->"))
	if closing < 0 {
		return nil, fmt.Errorf("%q is not closed by -->", BeginMarker)
	}
	begin := b + closing + len("-->")
	e := bytes.Index(doc[begin:], []byte(EndMarker))
	if e < 0 {
		return nil, fmt.Errorf("no %q after %q", EndMarker, BeginMarker)
	}
	end := begin + e
	if bytes.Contains(doc[end+1:], []byte(EndMarker)) {
		return nil, fmt.Errorf("more than one %q", EndMarker)
	}
	var out bytes.Buffer
	out.Write(doc[:begin])
	out.WriteString("\n\n")
	out.WriteString(strings.TrimSpace(section))
	out.WriteString("\n\n")
	out.Write(doc[end:])
	return out.Bytes(), nil
}

// Options are what the tables need besides the results.
type Options struct {
	Dir  string // the markdown file's folder: links are relative to it
	JSON string // path of results.json to link to; empty for none
}

// group is one benchmark's metrics, consecutive in Results.Benchmarks.
type group struct {
	stats []Stat
}

func (g group) first() Stat { return g.stats[0] }

func (g group) metric(m string) (Stat, bool) {
	for _, s := range g.stats {
		if s.Metric == m {
			return s, true
		}
	}
	return Stat{}, false
}

// runs is the number of result lines: the most any metric has.
func (g group) runs() int {
	n := 0
	for _, s := range g.stats {
		n = max(n, s.N)
	}
	return n
}

func groups(stats []Stat) []group {
	var gs []group
	for _, s := range stats {
		if n := len(gs); n > 0 {
			f := gs[n-1].first()
			if f.Source == s.Source && f.Package == s.Package && f.Name == s.Name && f.Procs == s.Procs {
				gs[n-1].stats = append(gs[n-1].stats, s)
				continue
			}
		}
		gs = append(gs, group{stats: []Stat{s}})
	}
	return gs
}

// The metrics of the scheduling throughput benchmark (test/e2e): each run
// measures the scheduler alone and with the extender, and their ratio.
const (
	metricAlone    = "pods/s-scheduler"
	metricExtender = "pods/s-extender"
	metricRatio    = "ratio"
)

// Markdown renders res as the section between the markers: the machine, the
// raw files and their commands, then the scheduling throughput side by side
// and a table per package. Each row names its machine and the command that
// reproduces it.
func Markdown(res Results, opt Options) string {
	var w strings.Builder
	fmt.Fprintf(&w, "Machine: %s.\n\n", res.Machine)
	w.WriteString("Each figure is the median of its runs (the `-count` of its command), with the lowest and highest run in brackets. " +
		"Times and sizes are scaled to a readable unit; other figures are in the unit their column names. " +
		"The raw output, which `benchstat` reads as it is, and the commands that wrote it:\n\n")
	for _, s := range res.Sources {
		fmt.Fprintf(&w, "- %s: `%s`, started %s at revision %s\n", link(s.Path, opt.Dir), s.Command, s.Date, s.Revision)
	}
	if opt.JSON != "" {
		fmt.Fprintf(&w, "\nEvery figure, with each run's value: %s.\n", link(opt.JSON, opt.Dir))
	}
	var throughput, others []group
	for _, g := range groups(res.Benchmarks) {
		_, a := g.metric(metricAlone)
		_, e := g.metric(metricExtender)
		if a && e {
			throughput = append(throughput, g)
		} else {
			others = append(others, g)
		}
	}
	machine := res.Machine.Short()
	if len(throughput) > 0 {
		w.WriteString("\n#### Scheduling throughput: the scheduler alone and with the extender\n\n")
		w.WriteString("Both are measured in each run, one after the other on the same cluster; the ratio is taken in each run and its median shown.\n\n")
		w.WriteString("| benchmark | scheduler alone (pods/s) | with extender (pods/s) | ratio, extender / alone | ratio of each run | runs | machine | command |\n")
		w.WriteString("|---|---|---|---|---|---|---|---|\n")
		for _, g := range throughput {
			a, _ := g.metric(metricAlone)
			e, _ := g.metric(metricExtender)
			ratios := runRatios(g, a, e)
			each := make([]string, len(ratios))
			for i, r := range ratios {
				each[i] = fmtNum(r)
			}
			fmt.Fprintf(&w, "| %s | %s | %s | %s | %s | %d | %s | %s |\n", displayName(g.first(), res.Machine),
				cell(a), cell(e), cell(Stat{Unit: metricRatio, N: len(ratios), Median: Median(ratios), Min: minOf(ratios), Max: maxOf(ratios)}),
				strings.Join(each, ", "), g.runs(), machine, code(a.Rerun))
		}
	}
	for _, pkg := range packages(others) {
		var cols []string
		seen := map[string]bool{}
		for _, g := range pkg {
			for _, s := range g.stats {
				if !seen[s.Metric] {
					seen[s.Metric] = true
					cols = append(cols, s.Metric)
				}
			}
		}
		fmt.Fprintf(&w, "\n#### `%s`\n\n", packageDir(pkg[0].first().Package, res.Module))
		w.WriteString("| benchmark | " + strings.Join(cols, " | ") + " | runs | machine | command |\n")
		w.WriteString("|---" + strings.Repeat("|---", len(cols)+3) + "|\n")
		for _, g := range pkg {
			cells := make([]string, len(cols))
			for i, c := range cols {
				if s, ok := g.metric(c); ok {
					cells[i] = cell(s)
				}
			}
			fmt.Fprintf(&w, "| %s | %s | %d | %s | %s |\n", displayName(g.first(), res.Machine), strings.Join(cells, " | "), g.runs(), machine, code(g.first().Rerun))
		}
	}
	return w.String()
}

// runRatios is extender / alone of each run: the benchmark's own ratio
// metric where it reports one for every run, else the quotient of the run's
// two rates.
func runRatios(g group, alone, ext Stat) []float64 {
	if r, ok := g.metric(metricRatio); ok && r.N == g.runs() {
		return r.Values
	}
	n := min(len(alone.Values), len(ext.Values))
	out := make([]float64, n)
	for i := range n {
		out[i] = ext.Values[i] / alone.Values[i]
	}
	return out
}

func minOf(xs []float64) float64 {
	m := math.Inf(1)
	for _, x := range xs {
		m = math.Min(m, x)
	}
	return m
}

func maxOf(xs []float64) float64 {
	m := math.Inf(-1)
	for _, x := range xs {
		m = math.Max(m, x)
	}
	return m
}

// packages splits groups by package, in the order packages first appear.
func packages(gs []group) [][]group {
	var out [][]group
	index := map[string]int{}
	for _, g := range gs {
		p := g.first().Package
		i, ok := index[p]
		if !ok {
			i = len(out)
			index[p] = i
			out = append(out, nil)
		}
		out[i] = append(out[i], g)
	}
	return out
}

// packageDir is pkg as a ./dir pattern inside module, else pkg.
func packageDir(pkg, module string) string {
	if module == "" {
		return pkg
	}
	if pkg == module {
		return "."
	}
	if rest, ok := strings.CutPrefix(pkg, module+"/"); ok {
		return "./" + rest
	}
	return pkg
}

// displayName drops the Benchmark prefix, as benchstat does, and keeps the
// -procs suffix only where it differs from the machine's cores.
func displayName(s Stat, m Machine) string {
	n := strings.TrimPrefix(s.Name, "Benchmark")
	if s.Procs != m.Cores {
		n += "-" + strconv.Itoa(s.Procs)
	}
	return escape(n)
}

func link(path, dir string) string {
	rel := path
	if dir != "" {
		if r, err := filepath.Rel(dir, path); err == nil {
			rel = r
		}
	}
	rel = filepath.ToSlash(rel)
	return "[`" + rel + "`](" + rel + ")"
}

// code is s as inline code in a table cell: a | would end the cell.
func code(s string) string { return "`" + escape(s) + "`" }

func escape(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

// cell is a stat as "median (min–max)", the range left out when there is
// one run or the runs agree to the digits shown. Times and sizes are scaled
// by the median; whole numbers (allocs/op, devices) stay whole.
func cell(s Stat) string {
	f, suffix := scale(s.Median, s.Unit)
	num := fmtNum
	if suffix == "" && isWhole(s.Median) && isWhole(s.Min) && isWhole(s.Max) {
		num = func(x float64) string { return strconv.FormatFloat(x, 'f', 0, 64) }
	}
	out := num(s.Median*f) + suffix
	if lo, hi := num(s.Min*f), num(s.Max*f); s.N > 1 && lo != hi {
		out += " (" + lo + "–" + hi + ")"
	}
	return out
}

func isWhole(x float64) bool { return x == math.Trunc(x) }

// scale picks the factor and suffix that show v (in unit) readably: times
// from ns to s, sizes from B to GiB. Other units stay as they are, named by
// the column.
func scale(v float64, unit string) (float64, string) {
	if f, ok := timeScale(unit); ok {
		return pick(math.Abs(v)*f, f, []float64{1, 1e3, 1e6, 1e9}, []string{"ns", "µs", "ms", "s"})
	}
	if f, ok := sizeScale(unit); ok {
		return pick(math.Abs(v)*f, f, []float64{1, 1 << 10, 1 << 20, 1 << 30}, []string{"B", "KiB", "MiB", "GiB"})
	}
	return 1, ""
}

// pick returns the factor from unit to the largest of steps not above base
// (the value in the smallest step), and that step's name.
func pick(base, f float64, steps []float64, names []string) (float64, string) {
	i := 0
	for i+1 < len(steps) && base >= steps[i+1] {
		i++
	}
	return f / steps[i], " " + names[i]
}

// fmtNum shows three significant digits, more for numbers of 1000 and
// above, which are shown whole.
func fmtNum(x float64) string {
	a := math.Abs(x)
	switch {
	case a == 0:
		return "0"
	case a >= 100:
		return strconv.FormatFloat(x, 'f', 0, 64)
	case a >= 10:
		return strconv.FormatFloat(x, 'f', 1, 64)
	case a >= 1:
		return strconv.FormatFloat(x, 'f', 2, 64)
	case a >= 0.1:
		return strconv.FormatFloat(x, 'f', 3, 64)
	}
	return strconv.FormatFloat(x, 'g', 3, 64)
}
