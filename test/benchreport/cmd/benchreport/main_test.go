package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpushare/gpushare/test/benchreport"
)

// TestRunAndReport records a stand-in benchmark command with run, then
// reports it into JSON and a markdown file.
func TestRunAndReport(t *testing.T) {
	dir := t.TempDir()
	raw := filepath.Join(dir, "raw", "go.txt")
	script := "printf 'pkg: example.com/m/p\\nBenchmarkA-2\\t10\\t100 ns/op\\t3 p50-ms\\nBenchmarkA-2\\t10\\t300 ns/op\\t5 p50-ms\\n'"
	// "test" and -bench make it look like go test to Rerun.
	if err := run([]string{"-o", raw, "--", "sh", "-c", script, "test", "-bench=."}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(raw)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(b), "# benchreport command: sh -c ") || !strings.Contains(string(b), "\nBenchmarkA-2\t10\t300 ns/op\t5 p50-ms\n") {
		t.Fatalf("raw file:\n%s", b)
	}

	md := filepath.Join(dir, "b.md")
	if err := os.WriteFile(md, []byte("x\n"+benchreport.BeginMarker+" -->\nold\n"+benchreport.EndMarker+"\ny\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "results.json")
	if err := report([]string{"-module", "example.com/m", "-json", out, "-md", md, raw}); err != nil {
		t.Fatal(err)
	}
	var res benchreport.Results
	if b, err = os.ReadFile(out); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Benchmarks) != 2 || res.Benchmarks[0].Median != 200 || res.Benchmarks[1].Unit != "ms" || res.Machine.Cores == 0 {
		t.Fatalf("results: %s", b)
	}
	if b, err = os.ReadFile(md); err != nil {
		t.Fatal(err)
	}
	if s := string(b); !strings.HasPrefix(s, "x\n") || !strings.HasSuffix(s, "\ny\n") || strings.Contains(s, "old") || !strings.Contains(s, "| A | 200 ns (100–300) | 4.00 ms (3.00–5.00) | 2 |") {
		t.Fatalf("markdown:\n%s", b)
	}

	// A failing command leaves the last good raw file as it was.
	if err := run([]string{"-o", raw, "--", "sh", "-c", "echo BenchmarkB-2 1 1 ns/op; exit 3"}); err == nil {
		t.Fatal("a failing command: no error")
	}
	if after, _ := os.ReadFile(raw); !strings.Contains(string(after), "BenchmarkA-2") {
		t.Fatalf("the failed run replaced the raw file:\n%s", after)
	}
	if _, err := os.Stat(raw + ".partial"); !os.IsNotExist(err) {
		t.Fatalf("partial file left behind: %v", err)
	}
}
