package nvml

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/gpushare/gpushare/plugin/topology"
)

// TestRealNVML checks the real library on a GPU machine and skips itself
// where libnvidia-ml.so.1 is absent. Run it alone with
//
//	go test -run TestRealNVML -v ./plugin/nvml/
func TestRealNVML(t *testing.T) {
	lib, err := New(zaptest.NewLogger(t), BackendNVML)
	if errors.Is(err, ErrLibraryNotFound) {
		t.Skipf("no real NVML here: %v", err)
	}
	if err != nil {
		t.Fatalf("New(%q): %v", BackendNVML, err)
	}
	defer func() {
		if err := lib.Shutdown(); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	}()
	if lib.Simulated() || lib.Name() != BackendNVML {
		t.Errorf("Simulated()=%v Name()=%q, want false %q", lib.Simulated(), lib.Name(), BackendNVML)
	}
	if _, ok := lib.(XidInjector); ok {
		t.Errorf("the real backend can inject events")
	}

	gpus, err := lib.Devices()
	if err != nil {
		t.Fatalf("Devices: %v", err)
	}
	t.Logf("real NVML reports %d GPU(s)", len(gpus))
	if len(gpus) == 0 {
		t.Fatalf("no GPUs")
	}
	seen := map[string]bool{}
	for i, g := range gpus {
		t.Logf("GPU index=%d uuid=%s model=%q memory=%d MiB (%.1f GiB) minor=%d pci=%s",
			g.Index, g.UUID, g.Model, g.MemoryMiB, float64(g.MemoryMiB)/1024, g.Minor, g.PCIBusID)
		if g.Index != i {
			t.Errorf("GPU %d has index %d", i, g.Index)
		}
		if !strings.HasPrefix(g.UUID, "GPU-") || seen[g.UUID] {
			t.Errorf("GPU %d: bad or duplicate UUID %q", i, g.UUID)
		}
		seen[g.UUID] = true
		if g.MemoryMiB == 0 {
			t.Errorf("GPU %d: no memory", i)
		}
		if g.Model == "" {
			t.Errorf("GPU %d: no model name", i)
		}
		// Read only: changing the mode is the MPS tier's job, checked by
		// test/gpu/run.sh, which restores it.
		mode, err := lib.ComputeMode(g.UUID)
		if err != nil {
			t.Errorf("GPU %d: ComputeMode: %v", i, err)
		} else {
			t.Logf("GPU index=%d compute mode %v", g.Index, mode)
		}
	}

	// The topology: one entry per GPU, one pair per two GPUs; scored links
	// logged for comparison with nvidia-smi topo -m.
	r, err := lib.Topology()
	if err != nil {
		t.Errorf("Topology: %v", err)
	} else {
		if len(r.GPUs) != len(gpus) || len(r.Pairs) != len(gpus)*(len(gpus)-1)/2 {
			t.Errorf("Topology: %d GPUs, %d pairs for %d GPUs", len(r.GPUs), len(r.Pairs), len(gpus))
		}
		for _, g := range r.GPUs {
			t.Logf("GPU index=%d bus=%s numa=%d nvswitch-links=%d", g.Index, g.PCIBusID, g.NUMANode, g.SwitchLinks)
		}
		for _, l := range topology.Links(r) {
			t.Logf("GPUs %d-%d: nvlinks=%d score=%d", l.A, l.B, l.NVLinks, l.Score)
		}
	}

	// A short health watch proves event registration and waiting work on
	// this driver: each GPU is reported watched (CauseWatched, no fault),
	// and a healthy idle GPU raises nothing else.
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	events := make(chan HealthEvent, 4*len(gpus))
	start := time.Now()
	if err := lib.WatchHealth(ctx, HealthOptions{WaitTimeout: 500 * time.Millisecond}, events); err != nil {
		t.Fatalf("WatchHealth: %v", err)
	}
	t.Logf("health watch ran %v and stopped on cancellation", time.Since(start).Round(time.Millisecond))
	close(events)
	watched := map[string]bool{}
	for ev := range events {
		if ev.Cause == CauseWatched {
			watched[ev.UUID] = true
			continue
		}
		t.Errorf("health event on an idle GPU: %+v", ev)
	}
	for _, g := range gpus {
		if !watched[g.UUID] {
			t.Errorf("GPU %d (%s) was never reported watched", g.Index, g.UUID)
		}
	}
}
