package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRun replays the smallest committed workload end to end: JSON, plots
// and the markdown section, twice, to check a rerun changes nothing.
func TestRun(t *testing.T) {
	dir := t.TempDir()
	md := filepath.Join(dir, "b.md")
	if err := os.WriteFile(md, []byte("# B\n\nbefore\n"+beginMarker+"\nold\n"+endMarker+"\nafter\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "p.json")
	args := []string{"-data", "../../testdata", "-only", "small-uniform", "-out", out, "-plots", dir, "-md", md}
	var log bytes.Buffer
	if err := run(args, &log); err != nil {
		t.Fatal(err)
	}
	first, err := os.ReadFile(md)
	if err != nil {
		t.Fatal(err)
	}
	// The rerun leaves the JSON and plots out (drawing is the slow part
	// under -race); only the command line it names may differ.
	if err := run([]string{"-data", "../../testdata", "-only", "small-uniform", "-md", md}, &log); err != nil {
		t.Fatal(err)
	}
	second, _ := os.ReadFile(md)
	if a, b := withoutCommand(first), withoutCommand(second); a != b {
		t.Fatalf("a rerun changed the markdown:\n%s\n---\n%s", a, b)
	}
	s := string(first)
	if !strings.Contains(s, "before\n") || !strings.Contains(s, "after\n") || strings.Contains(s, "\nold\n") || !strings.Contains(s, "| small-uniform |") ||
		!strings.Contains(s, "| | dra |") || !strings.Contains(s, "| | dra/lowest |") {
		t.Fatalf("markdown:\n%s", s)
	}
	var res Results
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &res); err != nil || len(res.Reports) != 1 || len(res.Reports[0].Churn) == 0 {
		t.Fatalf("results: %v %+v", err, res)
	}
	for _, f := range []string{"packing-allocated.png", "packing-fragmentation.png", "packing-stranded.png", "p-series.jsonl.gz"} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
	if err := run([]string{"-data", dir, "-only", "small-uniform"}, &log); err == nil {
		t.Error("a missing workload file was not an error")
	}
}

func withoutCommand(md []byte) string {
	var keep []string
	for _, l := range strings.Split(string(md), "\n") {
		if !strings.HasPrefix(l, "Command: ") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}
