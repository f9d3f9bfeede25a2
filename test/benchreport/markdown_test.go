package benchreport

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReplace(t *testing.T) {
	const before = "# Doc\n\nhand-written <!-- benchreport not a marker\n\n"
	const begin = "<!-- benchreport:begin (generated; do not edit) -->"
	const after = "\n\nhand-written after\r\n| a | b |\n" // no trailing newline change, CRLF kept
	doc := []byte(before + begin + "\nold\nlines\n" + EndMarker + after)
	out, err := Replace(doc, "\nnew table\n\n")
	if err != nil {
		t.Fatal(err)
	}
	want := before + begin + "\n\nnew table\n\n" + EndMarker + after
	if string(out) != want {
		t.Fatalf("Replace:\n%q\nwant\n%q", out, want)
	}
	again, err := Replace(out, "new table")
	if err != nil || !bytes.Equal(again, out) {
		t.Fatalf("a second Replace changed the file: %v\n%q", err, again)
	}

	for _, tc := range []struct{ name, doc, want string }{
		{"no markers", "# Doc\n", "no \"<!-- benchreport:begin ... -->\" line"},
		{"no end", begin + "\nx\n", "no \"<!-- benchreport:end -->\" after"},
		{"end before begin", EndMarker + "\n" + begin + "\n", "no \"<!-- benchreport:end -->\" after"},
		{"begin not closed", "<!-- benchreport:begin\n", "not closed"},
		{"two begins", begin + "\n" + EndMarker + "\n" + begin + "\n" + EndMarker + "\n", "more than one \"<!-- benchreport:begin\""},
		{"two ends", begin + "\n" + EndMarker + "\n" + EndMarker + "\n", "more than one \"<!-- benchreport:end -->\""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Replace([]byte(tc.doc), "x"); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestCell(t *testing.T) {
	for _, tc := range []struct {
		s    Stat
		want string
	}{
		{Stat{Unit: "ns", N: 3, Median: 294666, Min: 284666, Max: 304666}, "295 µs (285–305)"},
		{Stat{Unit: "ns", N: 3, Median: 1355583, Min: 1255583, Max: 11141522}, "1.36 ms (1.26–11.1)"},
		{Stat{Unit: "ns", N: 1, Median: 999}, "999 ns"},
		{Stat{Unit: "ns", N: 2, Median: 5.6e9, Min: 5.6e9, Max: 5.6e9}, "5.60 s"},
		{Stat{Unit: "µs", N: 2, Median: 913, Min: 863, Max: 963}, "913 µs (863–963)"},
		{Stat{Unit: "µs", N: 1, Median: 4293}, "4.29 ms"},
		{Stat{Unit: "B", N: 1, Median: 131004}, "128 KiB"},
		{Stat{Unit: "B", N: 1, Median: 1023}, "1023 B"},
		{Stat{Unit: "bytes", N: 1, Median: 19424}, "19.0 KiB"},
		{Stat{Unit: "MiB", N: 2, Median: 41.33, Min: 41.31, Max: 41.35}, "41.3 MiB (41.3–41.4)"},
		{Stat{Unit: "MiB", N: 1, Median: 2048}, "2.00 GiB"},
		{Stat{Unit: "allocs", N: 1, Median: 1573393}, "1573393"},
		{Stat{Unit: "pods/s", N: 3, Median: 62.2, Min: 56, Max: 62.2}, "62.2 (56.0–62.2)"},
		{Stat{Unit: "ratio", N: 3, Median: 0.4895, Min: 0.4, Max: 0.5}, "0.489 (0.400–0.500)"},
		{Stat{Unit: "ratio", N: 1, Median: 0.012345}, "0.0123"},
		{Stat{Unit: "allocs", N: 2, Median: 8, Min: 8, Max: 8}, "8"},
		{Stat{Unit: "allocs", N: 2, Median: 8.5, Min: 8, Max: 9}, "8.50 (8.00–9.00)"},
		{Stat{Unit: "B", N: 2, Median: 115715906, Min: 115715900, Max: 115715912}, "110 MiB"},
		{Stat{Unit: "devices", N: 1, Median: 0}, "0"},
		// CPU ms per pod is a figure of its column, not a duration to scale.
		{Stat{Unit: "ms/pod", N: 3, Median: 6.12, Min: 6, Max: 7}, "6.12 (6.00–7.00)"},
		{Stat{Unit: "ms/pod", N: 3, Median: 1234.5, Min: 1000, Max: 2000}, "1234 (1000–2000)"},
		{Stat{Unit: "ms/pod", N: 3, Median: 0.4, Min: -1.58, Max: 0.5}, "0.400 (-1.58–0.500)"},
	} {
		if got := cell(tc.s); got != tc.want {
			t.Errorf("cell(%+v) = %q, want %q", tc.s, got, tc.want)
		}
	}
}

// TestMarkdown renders the fixture raw files into the fixture document and
// compares it with the committed result (BENCHREPORT_UPDATE=1 rewrites it).
func TestMarkdown(t *testing.T) {
	var files []File
	for _, name := range []string{"go.txt", "e2e.txt"} {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, parseTest(t, "docs/benchmarks/raw/"+name, string(b)))
	}
	res, err := Summarize(files, "github.com/gpushare/gpushare")
	if err != nil {
		t.Fatal(err)
	}
	opt := Options{Dir: "docs", JSON: "docs/benchmarks/results.json"}
	section := Markdown(res, opt)
	if again := Markdown(res, opt); again != section {
		t.Fatal("two renderings of the same results differ")
	}
	doc, err := os.ReadFile(filepath.Join("testdata", "doc.md"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := Replace(doc, section)
	if err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "doc.want.md")
	if os.Getenv("BENCHREPORT_UPDATE") == "1" {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("rendered document differs from %s (BENCHREPORT_UPDATE=1 rewrites it):\n%s", golden, got)
	}
	// The qps=50 ratios of the fixture are 2.156, 2.0 and 2.5: their median
	// is 2.156, not the 134.1/60 of the medians' quotient.
	if !strings.Contains(string(got), "| SchedulingThroughput/qps=50 | extender | 60.0 (56.0–62.2) | 134 (120–140) | 2.16 (2.00–2.50) | 2.16, 2.00, 2.50 | 3 |") {
		t.Error("the qps=50 row does not show the median of the per-run ratios")
	}
}

// cpuRaw is three runs of the throughput benchmark with the CPU of each
// process: the extender reports only with the extender, and qps=50 reports
// no CPU at all.
const cpuRaw = testHeader + `pkg: example.com/m/e2e
BenchmarkSchedulingThroughput/qps=50-2	1	0 ns/op	120.0 pods/s-extender	60.00 pods/s-scheduler	2.000 ratio
BenchmarkSchedulingThroughput/qps=500-2	1	0 ns/op	3.10 cpu-ms/pod-etcd-alone	1.52 cpu-ms/pod-etcd-extender	2.20 cpu-ms/pod-extender-extender	6.12 cpu-ms/pod-kube-apiserver-alone	8.05 cpu-ms/pod-kube-apiserver-extender	2.14 cpu-ms/pod-kube-scheduler-alone	4.66 cpu-ms/pod-kube-scheduler-extender	240.1 pods/s-scheduler	120.3 pods/s-extender	0.501 ratio
BenchmarkSchedulingThroughput/qps=500-2	1	0 ns/op	3.00 cpu-ms/pod-etcd-alone	3.40 cpu-ms/pod-etcd-extender	2.50 cpu-ms/pod-extender-extender	6.00 cpu-ms/pod-kube-apiserver-alone	9.00 cpu-ms/pod-kube-apiserver-extender	2.00 cpu-ms/pod-kube-scheduler-alone	4.00 cpu-ms/pod-kube-scheduler-extender	230.0 pods/s-scheduler	110.0 pods/s-extender	0.478 ratio
BenchmarkSchedulingThroughput/qps=500-2	1	0 ns/op	3.30 cpu-ms/pod-etcd-alone	3.80 cpu-ms/pod-etcd-extender	1.90 cpu-ms/pod-extender-extender	7.00 cpu-ms/pod-kube-apiserver-alone	8.20 cpu-ms/pod-kube-apiserver-extender	2.30 cpu-ms/pod-kube-scheduler-alone	4.10 cpu-ms/pod-kube-scheduler-extender	250.0 pods/s-scheduler	100.0 pods/s-extender	0.400 ratio
`

func TestCPUTable(t *testing.T) {
	const rerun = "`go test -run='^$' -bench='^BenchmarkSchedulingThroughput$/^qps=500$' -count=2 ./e2e`"
	for _, tc := range []struct {
		name, raw string
		runs      int
		rows      []string // configuration, process, alone, with it, added
	}{
		{
			// kube-apiserver: the per-run differences 1.93, 3.00, 1.20 have
			// median 1.93, not 8.20 - 6.12 of the medians. all: alone 11.36,
			// 11.00, 12.60; with the extender 16.43, 18.90, 18.00, the
			// extender's own 2.20, 2.50, 1.90 included.
			name: "three runs",
			raw:  cpuRaw,
			runs: 3,
			rows: []string{
				"extender | kube-apiserver | 6.12 (6.00–7.00) | 8.20 (8.05–9.00) | 1.93 (1.20–3.00)",
				"extender | etcd | 3.10 (3.00–3.30) | 3.40 (1.52–3.80) | 0.400 (-1.58–0.500)",
				"extender | kube-scheduler | 2.14 (2.00–2.30) | 4.10 (4.00–4.66) | 2.00 (1.80–2.52)",
				"extender | extender | 0 | 2.20 (1.90–2.50) | 2.20 (1.90–2.50)",
				"extender | all | 11.4 (11.0–12.6) | 18.0 (16.4–18.9) | 5.40 (5.07–7.90)",
			},
		},
		{
			// etcd alone is missing from one run: its values cannot be
			// paired with the runs, so its difference and the sums are
			// blank. Processes the test bed does not name come last, sorted.
			name: "a process missing from a run",
			raw: testHeader + `pkg: example.com/m/e2e
BenchmarkSchedulingThroughput/qps=500-2	1	1 cpu-ms/pod-kube-proxy-alone	1 cpu-ms/pod-coredns-extender	2 cpu-ms/pod-etcd-alone	3 cpu-ms/pod-etcd-extender	240 pods/s-scheduler	120 pods/s-extender
BenchmarkSchedulingThroughput/qps=500-2	1	1 cpu-ms/pod-kube-proxy-alone	1 cpu-ms/pod-coredns-extender	4 cpu-ms/pod-etcd-extender	240 pods/s-scheduler	120 pods/s-extender
`,
			runs: 2,
			rows: []string{
				"extender | etcd | 2 | 3.50 (3.00–4.00) | ",
				"extender | coredns | 0 | 1 | 1",
				"extender | kube-proxy | 1 | 0 | -1",
				"extender | all |  | 4.50 (4.00–5.00) | ",
			},
		},
		{
			// The plugin's configuration has rows of its own, after the
			// extender's; the extender process, which runs in neither the
			// plugin's phase nor alone, is not among them.
			name: "the scheduler plugin",
			raw: testHeader + `pkg: example.com/m/e2e
BenchmarkSchedulingThroughput/qps=500-2	1	2 cpu-ms/pod-kube-scheduler-alone	3 cpu-ms/pod-kube-scheduler-extender	1 cpu-ms/pod-extender-extender	2.5 cpu-ms/pod-kube-scheduler-plugin	200 pods/s-scheduler	100 pods/s-extender	180 pods/s-plugin
BenchmarkSchedulingThroughput/qps=500-2	1	2 cpu-ms/pod-kube-scheduler-alone	3 cpu-ms/pod-kube-scheduler-extender	1 cpu-ms/pod-extender-extender	3.5 cpu-ms/pod-kube-scheduler-plugin	200 pods/s-scheduler	100 pods/s-extender	160 pods/s-plugin
`,
			runs: 2,
			rows: []string{
				"extender | kube-scheduler | 2 | 3 | 1",
				"extender | extender | 0 | 1 | 1",
				"extender | all | 2 | 4 | 2",
				"scheduler plugin (gpushare-scheduler) | kube-scheduler | 2 | 3.00 (2.50–3.50) | 1.00 (0.500–1.50)",
				"scheduler plugin (gpushare-scheduler) | all | 2 | 3.00 (2.50–3.50) | 1.00 (0.500–1.50)",
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := Summarize([]File{parseTest(t, "raw/e2e.txt", tc.raw)}, "example.com/m")
			if err != nil {
				t.Fatal(err)
			}
			out := Markdown(res, Options{})
			_, table, ok := strings.Cut(out, "\n#### CPU per pod bound, by process\n\n")
			if !ok {
				t.Fatalf("no CPU table:\n%s", out)
			}
			want := "CPU time (user + system, from /proc) each process of the test bed spent during the burst, divided by the pods bound; " +
				"both phases are measured in each run, and the added cost is taken in each run and its median shown. The extender runs only in its configurations.\n\n" +
				"| benchmark | configuration | process | scheduler alone (CPU ms/pod) | with it (CPU ms/pod) | added by it (CPU ms/pod) | runs | machine | command |\n" +
				"|---|---|---|---|---|---|---|---|---|\n"
			for _, r := range tc.rows {
				want += fmt.Sprintf("| SchedulingThroughput/qps=500 | %s | %d | 2 cores, 1.0 GiB | %s |\n", r, tc.runs, rerun)
			}
			if table != want {
				t.Errorf("CPU table:\n%s\nwant\n%s", table, want)
			}
			// The CPU metrics neither add columns to the throughput table
			// nor push the benchmark into a table of its package.
			if strings.Contains(out, "#### `./e2e`") || strings.Count(out, "| SchedulingThroughput/qps=500 | extender | 2") != 1 {
				t.Errorf("the throughput benchmark is outside its table:\n%s", out)
			}
		})
	}
}
