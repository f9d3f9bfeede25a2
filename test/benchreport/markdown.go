package benchreport

import (
	"bytes"
	"cmp"
	"fmt"
	"math"
	"path/filepath"
	"slices"
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
// measures the scheduler alone and in each configuration, and each
// configuration's ratio to the scheduler alone.
const metricAlone = "pods/s-scheduler"

// config is one configuration the throughput benchmark measures beside the
// scheduler alone: its rate, its ratio to alone and its CPU phase.
type config struct {
	words, rate, ratio, phase string
}

// configs are the configurations in the order the tables list them.
func configs() []config {
	return []config{
		{"extender", "pods/s-extender", "ratio", "-extender"},
		{"extender without prioritize (MostAllocated)", "pods/s-mostallocated", "ratio-mostallocated", "-mostallocated"},
		{"scheduler plugin (gpushare-scheduler)", "pods/s-plugin", "ratio-plugin", "-plugin"},
	}
}

// The benchmark also reports the CPU time each process of the test bed spent
// per pod bound in each phase, as cpu-ms/pod-<process>-<phase>. Process names
// have dashes of their own (kube-apiserver), so the process is what lies
// between the prefix and the phase.
const (
	cpuPrefix  = "cpu-ms/pod-"
	cpuUnit    = "ms/pod"
	phaseAlone = "-alone"
)

// Markdown renders res as the section between the markers: the machine, the
// raw files and their commands, then the scheduling throughput side by side
// with the CPU each process spends per pod, and a table per package. Each row
// names its machine and the command that reproduces it.
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
		_, e := g.metric(configs()[0].rate)
		if a && e {
			throughput = append(throughput, g)
		} else {
			others = append(others, g)
		}
	}
	if len(throughput) > 0 {
		throughputTable(&w, throughput, res.Machine)
		cpuTable(&w, throughput, res.Machine)
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
			fmt.Fprintf(&w, "| %s | %s | %d | %s | %s |\n", displayName(g.first(), res.Machine), strings.Join(cells, " | "), g.runs(), res.Machine.Short(), code(g.first().Rerun))
		}
	}
	return w.String()
}

// throughputTable renders a row per throughput group and configuration it
// measured: the rates alone and with it, and their ratio run by run.
func throughputTable(w *strings.Builder, gs []group, m Machine) {
	w.WriteString("\n#### Scheduling throughput: the scheduler alone and in each configuration\n\n")
	w.WriteString("Each run measures the configurations one after the other on the same cluster (the plugin between two rounds of the scheduler alone, since 2 December 2026); the ratio is taken in each run and its median shown.\n\n")
	w.WriteString("| benchmark | configuration | scheduler alone (pods/s) | with it (pods/s) | ratio to alone | ratio of each run | runs | machine | command |\n")
	w.WriteString("|---|---|---|---|---|---|---|---|---|\n")
	for _, g := range gs {
		a, _ := g.metric(metricAlone)
		for _, c := range configs() {
			e, ok := g.metric(c.rate)
			if !ok {
				continue
			}
			ratios := runRatios(g, c.ratio, a, e)
			each := make([]string, len(ratios))
			for i, r := range ratios {
				each[i] = fmtNum(r)
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %d | %s | %s |\n", displayName(g.first(), m), c.words,
				cell(a), cell(e), cell(statOf("ratio", ratios)),
				strings.Join(each, ", "), g.runs(), m.Short(), code(a.Rerun))
		}
	}
}

// runRatios is with / alone of each run: the benchmark's own ratio metric
// where it reports one for every run, else the quotient of the run's two rates.
func runRatios(g group, ratio string, alone, with Stat) []float64 {
	if r, ok := g.metric(ratio); ok && r.N == g.runs() {
		return r.Values
	}
	n := min(len(alone.Values), len(with.Values))
	out := make([]float64, n)
	for i := range n {
		out[i] = with.Values[i] / alone.Values[i]
	}
	return out
}

// cpuTable renders the CPU cost per pod bound of each process of the
// throughput groups that report it, alone and in each configuration, and the
// difference, taken per run as the ratio is.
func cpuTable(w *strings.Builder, gs []group, m Machine) {
	header := false
	for _, g := range gs {
		for _, c := range configs() {
			procs := cpuProcesses(g, c.phase)
			if len(procs) == 0 {
				continue
			}
			if !header {
				header = true
				w.WriteString("\n#### CPU per pod bound, by process\n\n")
				w.WriteString("CPU time (user + system, from /proc) each process of the test bed spent during the burst, divided by the pods bound; " +
					"both phases are measured in each run, and the added cost is taken in each run and its median shown. " +
					"The extender runs only in its configurations.\n\n")
				w.WriteString("| benchmark | configuration | process | scheduler alone (CPU ms/pod) | with it (CPU ms/pod) | added by it (CPU ms/pod) | runs | machine | command |\n")
				w.WriteString("|---|---|---|---|---|---|---|---|---|\n")
			}
			cpuRows(w, g, c, procs, m)
		}
	}
}

// cpuRows renders one configuration's rows of cpuTable, the sum of the
// processes last.
func cpuRows(w *strings.Builder, g group, c config, procs []string, m Machine) {
	row := func(process, alone, with, added string) {
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %d | %s | %s |\n", displayName(g.first(), m), c.words, escape(process),
			alone, with, added, g.runs(), m.Short(), code(g.first().Rerun))
	}
	// all sums the processes run by run; nil once a process has no
	// value for every run, which leaves that phase blank.
	sumAlone, sumWith := make([]float64, g.runs()), make([]float64, g.runs())
	for _, p := range procs {
		a, aRuns := cpuRuns(g, p, phaseAlone)
		e, eRuns := cpuRuns(g, p, c.phase)
		row(p, cell(a), cell(e), addedCell(aRuns, eRuns))
		sumAlone, sumWith = addRuns(sumAlone, aRuns), addRuns(sumWith, eRuns)
	}
	row("all", runsCell(sumAlone), runsCell(sumWith), addedCell(sumAlone, sumWith))
}

// cpuMetric splits cpu-ms/pod-<process>-<phase>; phase keeps its dash.
func cpuMetric(metric string) (process, phase string, ok bool) {
	rest, ok := strings.CutPrefix(metric, cpuPrefix)
	if !ok {
		return "", "", false
	}
	phases := []string{phaseAlone}
	for _, c := range configs() {
		phases = append(phases, c.phase)
	}
	for _, ph := range phases {
		if p, ok := strings.CutSuffix(rest, ph); ok && p != "" {
			return p, ph, true
		}
	}
	return "", "", false
}

// cpuProcesses are the processes g reports CPU for in phase: the test bed's in
// a fixed order, so that the rows of every benchmark line up, then others
// sorted. A process that reports alone only is listed once phase has any.
func cpuProcesses(g group, phase string) []string {
	rank := func(p string) int {
		switch p {
		case "kube-apiserver":
			return 0
		case "etcd":
			return 1
		case "kube-scheduler":
			return 2
		case "extender":
			return 3
		}
		return 4
	}
	var out, alone []string
	for _, s := range g.stats {
		p, ph, ok := cpuMetric(s.Metric)
		switch {
		case ok && ph == phase && !slices.Contains(out, p):
			out = append(out, p)
		case ok && ph == phaseAlone:
			alone = append(alone, p)
		}
	}
	if len(out) == 0 {
		return nil
	}
	for _, p := range alone {
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b string) int {
		return cmp.Or(cmp.Compare(rank(a), rank(b)), strings.Compare(a, b))
	})
	return out
}

// cpuRuns is process's CPU in phase as reported, and its value in each run.
// A process that did not report in a phase spent nothing there (the
// extender does not run while the scheduler is measured alone): zeros. The
// runs are nil when it reported in some runs only, since the values then
// cannot be paired with their runs.
func cpuRuns(g group, process, phase string) (Stat, []float64) {
	s, found := g.metric(cpuPrefix + process + phase)
	if !found {
		zeros := make([]float64, g.runs())
		return statOf(cpuUnit, zeros), zeros
	}
	if s.N != g.runs() {
		return s, nil
	}
	return s, s.Values
}

// addRuns adds a process's runs to sum; an unknown either way makes the sum
// unknown.
func addRuns(sum, runs []float64) []float64 {
	if sum == nil || runs == nil {
		return nil
	}
	for i, v := range runs {
		sum[i] += v
	}
	return sum
}

// runsCell is the cell of values computed per run; blank when unknown.
func runsCell(runs []float64) string {
	if runs == nil {
		return ""
	}
	return cell(statOf(cpuUnit, runs))
}

// addedCell is ext - alone taken in each run; blank when either is unknown.
func addedCell(alone, ext []float64) string {
	if alone == nil || ext == nil {
		return ""
	}
	added := make([]float64, len(alone))
	for i := range added {
		added[i] = ext[i] - alone[i]
	}
	return runsCell(added)
}

// statOf summarizes values computed from the runs, such as their ratios.
func statOf(unit string, values []float64) Stat {
	return Stat{Unit: unit, N: len(values), Median: Median(values), Min: minOf(values), Max: maxOf(values), Values: values}
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
