package cluster

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestParseStatusRSS(t *testing.T) {
	status := "Name:\tgpushare\nVmPeak:\t 2000000 kB\nVmHWM:\t  307200 kB\nVmRSS:\t  204800 kB\nRssAnon:\t  200000 kB\nThreads:\t12\n"
	cur, peak, err := parseStatusRSS([]byte(status))
	if err != nil {
		t.Fatal(err)
	}
	if cur != 200<<20 || peak != 300<<20 {
		t.Errorf("parseStatusRSS = %d, %d; want %d, %d", cur, peak, 200<<20, 300<<20)
	}
	for _, bad := range []string{
		"",
		"Name:\tz\nState:\tZ (zombie)\n",  // a zombie has no memory lines
		"VmRSS:\t 1 kB\n",                 // no peak
		"VmHWM:\t 1 kB\nVmRSS:\t x kB\n",  // not a number
		"VmHWM:\t 1 kB\nVmRSS:\t 1 MB\n",  // not kB
		"VmHWM:\t 1 kB\nVmRSS:\t -1 kB\n", // negative
		"VmHWM:\t 1 kB\nVmRSS:\t 1\n",     // no unit
		"VmHWM:\t 1 kB\nVmRSS:\t 99999999999999999999 kB\n", // overflows
	} {
		if _, _, err := parseStatusRSS([]byte(bad)); err == nil {
			t.Errorf("parseStatusRSS(%q) did not fail", bad)
		}
	}
}

// The test process's own RSS grows by what it touches, and its peak is never
// below it.
func TestReadRSSSelf(t *testing.T) {
	before, peakBefore, err := readRSS(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if before == 0 || peakBefore < before {
		t.Fatalf("before: RSS %d, peak %d", before, peakBefore)
	}
	const size = 64 << 20
	buf := make([]byte, size)
	for i := 0; i < size; i += 4096 { // make every page resident
		buf[i] = 1
	}
	after, peakAfter, err := readRSS(os.Getpid())
	runtime.KeepAlive(buf)
	if err != nil {
		t.Fatal(err)
	}
	// The runtime may hand some other memory back meanwhile: ask for half.
	if after < before+size/2 {
		t.Errorf("RSS %d MiB after touching 64 MiB, was %d MiB", after>>20, before>>20)
	}
	if peakAfter < after || peakAfter < peakBefore {
		t.Errorf("peak %d below RSS %d or the earlier peak %d", peakAfter, after, peakBefore)
	}
}

// A running program reports its memory; a stopped one has none to report.
func TestProgramRSS(t *testing.T) {
	p := &Program{proc: newProcess("sleeper", "/bin/sh", filepath.Join(t.TempDir(), "p.log"), []string{"-c", "exec sleep 60"})}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop(time.Second) })
	cur, peak, err := p.RSS()
	if err != nil {
		t.Fatal(err)
	}
	if cur == 0 || peak < cur {
		t.Errorf("RSS %d, peak %d", cur, peak)
	}
	p.Stop(time.Second)
	if _, _, err := p.RSS(); err == nil || !strings.Contains(err.Error(), "not running") {
		t.Errorf("RSS of a stopped program: %v", err)
	}
}
