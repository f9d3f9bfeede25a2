package benchreport

import (
	"bytes"
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
	if !strings.Contains(string(got), "| SchedulingThroughput/qps=50 | 60.0 (56.0–62.2) | 134 (120–140) | 2.16 (2.00–2.50) | 2.16, 2.00, 2.50 | 3 |") {
		t.Error("the qps=50 row does not show the median of the per-run ratios")
	}
}
