package cluster

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseStatCPU(t *testing.T) {
	// Fields 14 (utime) and 15 (stime) are 250 and 37 ticks; the name holds ") (" to trip a
	// parser that splits on the first ')'.
	line := "4242 (odd) (name) S 1 4242 4242 0 -1 4194560 120 0 0 0 250 37 0 0 20 0 3 0 1000 1000000 300 18446744073709551615\n"
	got, err := parseStatCPU([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	if want := 2870 * time.Millisecond; got != want {
		t.Errorf("parseStatCPU = %v, want %v", got, want)
	}
	for _, bad := range []string{"", "4242 no-parens S 1", "4242 (x) S 1 2 3", "4242 (x) S 1 4242 4242 0 -1 4194560 120 0 0 0 -5 37 0"} {
		if _, err := parseStatCPU([]byte(bad)); err == nil {
			t.Errorf("parseStatCPU(%q) did not fail", bad)
		}
	}
}

// A busy process's CPU time grows; a stopped one has none to report.
func TestProcessCPU(t *testing.T) {
	p := newProcess("busy", "/bin/sh", filepath.Join(t.TempDir(), "p.log"), []string{"-c", "while :; do :; done"})
	if err := p.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.stop(time.Second) })
	if err := waitUntil(t.Context(), time.Minute, "50 ms of CPU", p, func(context.Context) (bool, error) {
		d, err := p.cpu()
		return d >= 50*time.Millisecond, err
	}); err != nil {
		t.Fatal(err)
	}
	p.stop(time.Second)
	if _, err := p.cpu(); err == nil || !strings.Contains(err.Error(), "not running") {
		t.Errorf("cpu of a stopped process: %v", err)
	}
}
