package benchreport

import (
	"reflect"
	"strings"
	"testing"
)

const testHeader = `# benchreport command: go test -run='^$' -bench=. -count=2 ./...
# benchreport date: 2026-05-01T10:00:00Z
# benchreport revision: abc+modified
# benchreport cpu-model: Test CPU @ 2.0GHz
# benchreport cores: 2
# benchreport memory-bytes: 1073741824
# benchreport os: linux
# benchreport arch: amd64
# benchreport go: go1.26.8
`

func TestParse(t *testing.T) {
	raw := testHeader + `goos: linux
goarch: amd64
pkg: example.com/m/a
cpu: Test CPU @ 2.0GHz
BenchmarkFilter
BenchmarkFilter/nodes=1000-2   	    4063	    294666 ns/op	    239204 p50-ns	  131004 B/op	    1073 allocs/op
    bench_test.go:12: a log line
Benchmarking is not a result
BenchmarkAllocate/simple-fake-2	     853	   1268919 ns/op	       963.0 p50-µs	      4293 p99-µs
PASS
ok  	example.com/m/a	14.963s
pkg: example.com/m/b
BenchmarkFFD 	   12280	     97395 ns/op
BenchmarkFill/bestfit/random-16	10	1.5e+08 ns/op	15468 ns/placement
BenchmarkThroughput/qps=50-2	1	134.1 pods/s-extender	62.20 pods/s-scheduler	2.156 ratio
`
	f, err := Parse("raw.txt", strings.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	wantHeader := Header{
		Command: "go test -run='^$' -bench=. -count=2 ./...", Date: "2026-05-01T10:00:00Z", Revision: "abc+modified",
		Machine: Machine{CPU: "Test CPU @ 2.0GHz", Cores: 2, MemoryBytes: 1 << 30, OS: "linux", Arch: "amd64", Go: "go1.26.8"},
	}
	if f.Header != wantHeader {
		t.Errorf("header %+v, want %+v", f.Header, wantHeader)
	}
	want := []Result{
		{Pkg: "example.com/m/a", Name: "BenchmarkFilter/nodes=1000", Procs: 2, Iters: 4063, Line: 15,
			Value: []Value{{294666, "ns/op"}, {239204, "p50-ns"}, {131004, "B/op"}, {1073, "allocs/op"}}},
		{Pkg: "example.com/m/a", Name: "BenchmarkAllocate/simple-fake", Procs: 2, Iters: 853, Line: 18,
			Value: []Value{{1268919, "ns/op"}, {963, "p50-µs"}, {4293, "p99-µs"}}},
		{Pkg: "example.com/m/b", Name: "BenchmarkFFD", Procs: 1, Iters: 12280, Line: 22,
			Value: []Value{{97395, "ns/op"}}},
		{Pkg: "example.com/m/b", Name: "BenchmarkFill/bestfit/random", Procs: 16, Iters: 10, Line: 23,
			Value: []Value{{1.5e8, "ns/op"}, {15468, "ns/placement"}}},
		{Pkg: "example.com/m/b", Name: "BenchmarkThroughput/qps=50", Procs: 2, Iters: 1, Line: 24,
			Value: []Value{{134.1, "pods/s-extender"}, {62.2, "pods/s-scheduler"}, {2.156, "ratio"}}},
	}
	if !reflect.DeepEqual(f.Results, want) {
		t.Errorf("results:\n%+v\nwant\n%+v", f.Results, want)
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct{ name, raw, want string }{
		{"no header", "pkg: p\nBenchmarkA-2 1 2 ns/op\n", `no "# benchreport command: " header line`},
		{"header missing a key", strings.Replace(testHeader, "# benchreport cores: 2\n", "", 1), `"# benchreport cores: "`},
		{"bad header value", strings.Replace(testHeader, "cores: 2", "cores: two", 1), "raw.txt:5: header cores"},
		{"unknown header key", testHeader + "# benchreport colour: red\n", `unknown header key "colour"`},
		{"unit without value", testHeader + "pkg: p\nBenchmarkA-2 1 2 ns/op 3\n", "raw.txt:11: BenchmarkA-2: want value-unit pairs"},
		{"no values", testHeader + "pkg: p\nBenchmarkA-2 100\n", "want value-unit pairs"},
		{"bad iterations", testHeader + "pkg: p\nBenchmarkA-2 many 2 ns/op\n", `iteration count "many"`},
		{"bad value", testHeader + "pkg: p\nBenchmarkA-2 1 fast ns/op\n", `value "fast"`},
		{"failed benchmark", testHeader + "--- FAIL: BenchmarkA/x\n", "raw.txt:10: a benchmark failed"},
		{"failed package", testHeader + "FAIL\texample.com/m/a\t1.0s\n", "a benchmark failed"},
		{"no pkg line", testHeader + "BenchmarkA-2 1 2 ns/op\n", `raw.txt:10: a result before any "pkg:" line`},
		{"interrupted line", testHeader + "pkg: p\nBenchmarkA-2   \t\nsome log output\n    4063\t 294666 ns/op\nBenchmarkB-2 1 2 ns/op\n",
			"raw.txt:11: BenchmarkA has no result: did output interrupt its line?"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("raw.txt", strings.NewReader(tc.raw))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestHeaderRoundTrip(t *testing.T) {
	h := Header{
		Command: QuoteCommand([]string{"go", "test", "-run=^$", "-bench=.", "-count", "5", "./..."}),
		Date:    "2026-05-01T10:00:00Z", Revision: "0123",
		Machine: Machine{CPU: "Some CPU: model 7", Cores: 16, MemoryBytes: 64 << 30, OS: "linux", Arch: "arm64", Go: "go1.26.8"},
	}
	f, err := Parse("raw.txt", strings.NewReader(FormatHeader(h)+"pkg: p\nBenchmarkA-16 1 2 ns/op\n"))
	if err != nil {
		t.Fatal(err)
	}
	if f.Header != h {
		t.Fatalf("read back %+v, want %+v", f.Header, h)
	}
	if got := h.Machine.String(); got != "Some CPU: model 7, 16 cores, 64.0 GiB, linux/arm64, go1.26.8" {
		t.Errorf("machine line %q", got)
	}
}

func TestSplitProcs(t *testing.T) {
	for _, tc := range []struct {
		in    string
		name  string
		procs int
	}{
		{"BenchmarkA-2", "BenchmarkA", 2},
		{"BenchmarkA", "BenchmarkA", 1},
		{"BenchmarkA/simple-fake-8", "BenchmarkA/simple-fake", 8},
		{"BenchmarkA/simple-fake", "BenchmarkA/simple-fake", 1},
	} {
		if name, procs := splitProcs(tc.in); name != tc.name || procs != tc.procs {
			t.Errorf("splitProcs(%q) = %q, %d; want %q, %d", tc.in, name, procs, tc.name, tc.procs)
		}
	}
}
