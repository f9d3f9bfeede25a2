package benchreport

import (
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{7}, 7},
		{[]float64{3, 1, 2}, 2},          // odd: the middle one
		{[]float64{4, 1, 3, 2}, 2.5},     // even: the mean of the two middle ones
		{[]float64{10, 10, 1, 1000}, 10}, // even, equal middles
		{[]float64{5, 1, 4, 2, 3}, 3},
	} {
		in := append([]float64(nil), tc.in...)
		if got := Median(tc.in); got != tc.want {
			t.Errorf("Median(%v) = %v, want %v", tc.in, got, tc.want)
		}
		if !reflect.DeepEqual(in, tc.in) {
			t.Errorf("Median reordered its input: %v", tc.in)
		}
	}
}

func TestUnitOf(t *testing.T) {
	for metric, want := range map[string]string{
		"ns/op": "ns", "B/op": "B", "allocs/op": "allocs", "MB/s": "MB/s",
		"p50-ns": "ns", "p99-µs": "µs", "p50-ms": "ms", "cache-MiB": "MiB", "pod-objects-MiB": "MiB",
		"bytes/msg": "bytes", "ns/placement": "ns",
		"pods/s-scheduler": "pods/s", "pods/s-extender": "pods/s", "pods/s": "pods/s",
		"ratio": "ratio", "devices": "devices",
		// CPU per pod: the process names are not units, even where a
		// segment reads as one ("s", "B").
		"cpu-ms/pod-kube-apiserver-alone": "ms/pod", "cpu-ms/pod-extender-extender": "ms/pod",
		"cpu-ms/pod-s-alone": "ms/pod", "cpu-ms/pod-B-extender": "ms/pod",
	} {
		if got := UnitOf(metric); got != want {
			t.Errorf("UnitOf(%q) = %q, want %q", metric, got, want)
		}
	}
}

func TestQuoteAndSplitCommand(t *testing.T) {
	args := []string{"go", "test", "-p=1", "-run=^$", "-bench=^BenchmarkA$/^x=1$", "-count", "5", "it's", "a b", `"q"`, "", "./..."}
	line := QuoteCommand(args)
	if want := `go test -p=1 -run='^$' -bench='^BenchmarkA$/^x=1$' -count 5 'it'\''s' 'a b' '"q"' '' ./...`; line != want {
		t.Errorf("QuoteCommand = %s\nwant          %s", line, want)
	}
	back, err := SplitCommand(line)
	if err != nil || !reflect.DeepEqual(back, args) {
		t.Errorf("SplitCommand(%s) = %q, %v; want %q", line, back, err, args)
	}
	got, err := SplitCommand(`a\ b "c \"d\" \$e" 'f'g`)
	if want := []string{"a b", `c "d" $e`, "fg"}; err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("SplitCommand = %q, %v; want %q", got, err, want)
	}
	for _, bad := range []string{"a 'b", `a "b`, `a\`} {
		if _, err := SplitCommand(bad); err == nil {
			t.Errorf("SplitCommand(%s): no error", bad)
		}
	}
}

func TestRerun(t *testing.T) {
	const module = "github.com/gpushare/gpushare"
	for _, tc := range []struct{ command, pkg, name, want string }{
		{
			"go test -p=1 -run='^$' -bench=. -benchmem -count=5 -benchtime=1s ./...",
			module + "/extender/server", "BenchmarkFilter/nodes=1000",
			"go test -p=1 -run='^$' -bench='^BenchmarkFilter$/^nodes=1000$' -benchmem -count=5 -benchtime=1s ./extender/server",
		},
		{ // value flags written apart keep their values; other packages are dropped
			"/usr/local/go/bin/go test -tags e2e -bench SchedulingThroughput -count 3 ./test/e2e ./plugin/...",
			module + "/test/e2e", "BenchmarkSchedulingThroughput/qps=50",
			"/usr/local/go/bin/go test -tags e2e -bench='^BenchmarkSchedulingThroughput$/^qps=50$' -count 3 ./test/e2e",
		},
		{ // a package outside the module keeps its import path; -args stays last
			"go test -bench=. -benchmem example.com/x -args -v", "example.com/x", "BenchmarkFFD",
			"go test -bench='^BenchmarkFFD$' -benchmem example.com/x -args -v",
		},
		{ // regexp characters in names are quoted
			"go test -bench=. .", module, "BenchmarkFill/bestfit/random(1)",
			`go test -bench='^BenchmarkFill$/^bestfit$/^random\(1\)$' .`,
		},
	} {
		got, err := Rerun(tc.command, tc.pkg, tc.name, module)
		if err != nil || got != tc.want {
			t.Errorf("Rerun(%s, %s, %s)\n = %s, %v\nwant %s", tc.command, tc.pkg, tc.name, got, err, tc.want)
		}
	}
	for _, bad := range []string{"go vet ./...", "go test ./...", "go test -bench='x"} {
		if _, err := Rerun(bad, module, "BenchmarkA", module); err == nil {
			t.Errorf("Rerun(%s): no error", bad)
		}
	}
}

func parseTest(t *testing.T, path, raw string) File {
	t.Helper()
	f, err := Parse(path, strings.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestSummarize(t *testing.T) {
	a := parseTest(t, "raw/a.txt", testHeader+`pkg: example.com/m/p
BenchmarkX/n=1-2	10	300 ns/op	8 B/op
BenchmarkY-2	10	5 ns/op
BenchmarkX/n=1-2	10	100 ns/op	8 B/op	7 extra-ms
BenchmarkX/n=1-2	10	200 ns/op	8 B/op
BenchmarkX/n=1-2	10	400 ns/op	8 B/op
`)
	b := parseTest(t, "raw/b.txt", testHeader+`pkg: example.com/m/q
BenchmarkZ-2	1	2.5 ratio
`)
	res, err := Summarize([]File{a, b}, "example.com/m")
	if err != nil {
		t.Fatal(err)
	}
	const cmdA = "go test -run='^$' -bench=. -count=2 ./..."
	rerunX := "go test -run='^$' -bench='^BenchmarkX$/^n=1$' -count=2 ./p"
	x := Stat{Source: "raw/a.txt", Package: "example.com/m/p", Name: "BenchmarkX/n=1", Procs: 2, Command: cmdA, Rerun: rerunX}
	stat := func(s Stat, metric, unit string, median, lo, hi float64, values ...float64) Stat {
		s.Metric, s.Unit, s.N, s.Median, s.Min, s.Max, s.Values = metric, unit, len(values), median, lo, hi, values
		return s
	}
	y := Stat{Source: "raw/a.txt", Package: "example.com/m/p", Name: "BenchmarkY", Procs: 2, Command: cmdA, Rerun: "go test -run='^$' -bench='^BenchmarkY$' -count=2 ./p"}
	z := Stat{Source: "raw/b.txt", Package: "example.com/m/q", Name: "BenchmarkZ", Procs: 2, Command: cmdA, Rerun: "go test -run='^$' -bench='^BenchmarkZ$' -count=2 ./q"}
	want := []Stat{
		stat(x, "ns/op", "ns", 250, 100, 400, 300, 100, 200, 400),
		stat(x, "B/op", "B", 8, 8, 8, 8, 8, 8, 8),
		stat(x, "extra-ms", "ms", 7, 7, 7, 7),
		stat(y, "ns/op", "ns", 5, 5, 5, 5),
		stat(z, "ratio", "ratio", 2.5, 2.5, 2.5, 2.5),
	}
	if !reflect.DeepEqual(res.Benchmarks, want) {
		t.Errorf("benchmarks:\n%+v\nwant\n%+v", res.Benchmarks, want)
	}
	if res.Module != "example.com/m" || res.Machine != a.Header.Machine || len(res.Sources) != 2 || res.Sources[1] != (Source{"raw/b.txt", cmdA, "2026-05-01T10:00:00Z", "abc+modified"}) {
		t.Errorf("results %+v", res)
	}

	other := b
	other.Header.Machine.Cores = 4
	if _, err := Summarize([]File{a, other}, "example.com/m"); err == nil || !strings.Contains(err.Error(), "one machine") {
		t.Errorf("two machines: %v", err)
	}
	rebooted := b
	rebooted.Header.Machine.MemoryBytes += 70 << 10
	if _, err := Summarize([]File{a, rebooted}, "example.com/m"); err != nil {
		t.Errorf("one machine, rebooted: %v", err)
	}
	again := a
	again.Path = "raw/c.txt"
	if _, err := Summarize([]File{a, again}, "example.com/m"); err == nil || !strings.Contains(err.Error(), "is in both raw/a.txt and raw/c.txt") {
		t.Errorf("a benchmark in two files: %v", err)
	}
	empty := parseTest(t, "raw/empty.txt", testHeader+"PASS\n")
	if _, err := Summarize([]File{a, empty}, "example.com/m"); err == nil || !strings.Contains(err.Error(), "no benchmark results") {
		t.Errorf("a file without results: %v", err)
	}
	if _, err := Summarize(nil, "example.com/m"); err == nil {
		t.Error("no files: no error")
	}
}

// TestSummarizeCPU checks that results.json carries each CPU metric of the
// throughput benchmark, every run's value in ms/pod, besides the table.
func TestSummarizeCPU(t *testing.T) {
	res, err := Summarize([]File{parseTest(t, "raw/e2e.txt", cpuRaw)}, "example.com/m")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Stat{}
	for _, s := range res.Benchmarks {
		if s.Name == "BenchmarkSchedulingThroughput/qps=500" {
			got[s.Metric] = s
		}
	}
	for metric, values := range map[string][]float64{
		"cpu-ms/pod-kube-apiserver-alone":    {6.12, 6.00, 7.00},
		"cpu-ms/pod-kube-apiserver-extender": {8.05, 9.00, 8.20},
		"cpu-ms/pod-etcd-alone":              {3.10, 3.00, 3.30},
		"cpu-ms/pod-etcd-extender":           {1.52, 3.40, 3.80},
		"cpu-ms/pod-kube-scheduler-alone":    {2.14, 2.00, 2.30},
		"cpu-ms/pod-kube-scheduler-extender": {4.66, 4.00, 4.10},
		"cpu-ms/pod-extender-extender":       {2.20, 2.50, 1.90},
	} {
		s, ok := got[metric]
		if !ok || s.Unit != "ms/pod" || !reflect.DeepEqual(s.Values, values) {
			t.Errorf("%s: %+v, want unit ms/pod and values %v", metric, s, values)
		}
	}
	if _, ok := got["cpu-ms/pod-extender-alone"]; ok || len(got) != 11 {
		t.Errorf("metrics %v: want the 7 reported CPU ones and ns/op, both rates and the ratio", slices.Sorted(maps.Keys(got)))
	}
}
