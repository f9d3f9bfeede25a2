// Package gpu holds the real-GPU check of the MPS tier and of the DRA
// driver in it (run.sh, with mpscheck, dracheck and the CUDA clients). These
// tests keep the script working on machines without a GPU: the dry run
// exercises every step against the simulated NVML backend and the fake MPS
// daemon, and the skip path is checked with an nvidia-smi that fails.
package gpu

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// runScript runs run.sh from the repository root with args and extra
// environment, and returns its output and error.
func runScript(t *testing.T, env []string, args ...string) (string, error) {
	t.Helper()
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("bash not found")
	}
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", append([]string{"test/gpu/run.sh"}, args...)...)
	cmd.Dir = root
	// The script builds its checks with go build. -race makes those builds reuse the compiles of
	// every dependency that make verify (vet -race) and the race-detector tests already did: on a
	// cold CI machine a plain build compiled the DRA driver's dependencies again and ran past the
	// step's timeout (TestDryRun failed there once, "FAIL: go build ./test/gpu/dracheck").
	cmd.Env = append(append(os.Environ(), "GOFLAGS=-race"), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestDryRun(t *testing.T) {
	out := t.TempDir()
	text, err := runScript(t, []string{"OUT=" + out}, "dry-run")
	if err != nil || !strings.Contains(text, "RESULT: PASS") {
		t.Fatalf("run.sh dry-run: %v\n%s", err, text)
	}
	for _, want := range []string{
		"DRY RUN",
		"[ok  ] Start",
		"[ok  ] compute mode while running: EXCLUSIVE_PROCESS",
		"=20480M",
		"exit 2 (out of memory), want 2",
		"=40960M",
		"exit 0 (allocated), want 0",
		"[ok  ] compute mode restored: DEFAULT (was DEFAULT)",
		// (e) DRA mode: the slice, the two claims' limits from their CDI
		// specifications, the client under each, the unprepare, and the
		// hami-core specification.
		"## (e) DRA mode: slices and two claims under MPS",
		"memory capacity 141Gi, isolation mps, uuid GPU-",
		"[ok  ] prepare claim-20gib (20 GiB): device gpu-",
		"  env   CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M",
		"[ok  ] claim-20gib CUDA_MPS_PINNED_DEVICE_MEM_LIMIT: CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M, want 0=20480M",
		"[ok  ] claim-40gib CUDA_MPS_PINNED_DEVICE_MEM_LIMIT: CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=40960M, want 0=40960M",
		"[ok  ] claim-20gib CUDA_VISIBLE_DEVICES: CUDA_VISIBLE_DEVICES=GPU-",
		"[ok  ] client under claim-20gib allocating 30 GiB: exit 2 (out of memory), want 2",
		"[ok  ] client under claim-40gib allocating 30 GiB: exit 0 (allocated), want 0",
		"[ok  ] unprepare claim-20gib: error \"\", CDI specification removed: true",
		"[ok  ] unprepare claim-40gib: error \"\", CDI specification removed: true",
		"isolation hami-core, uuid GPU-",
		"[ok  ] claim-20gib CUDA_DEVICE_MEMORY_LIMIT: CUDA_DEVICE_MEMORY_LIMIT=20480m, want 20480m",
		"DRA check:       PASS",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("dry-run output lacks %q:\n%s", want, text)
		}
	}
	saved, err := os.ReadFile(filepath.Join(out, "gpu-run.txt"))
	if err != nil || !strings.Contains(string(saved), "RESULT: PASS") {
		t.Errorf("$OUT/gpu-run.txt = %v, want the output", err)
	}
}

func TestSkipsWithoutDriver(t *testing.T) {
	bin := t.TempDir()
	smi := "#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'\nexit 9\n"
	if err := os.WriteFile(filepath.Join(bin, "nvidia-smi"), []byte(smi), 0o755); err != nil {
		t.Fatal(err)
	}
	text, err := runScript(t, []string{"PATH=" + bin + string(os.PathListSeparator) + os.Getenv("PATH")})
	if err != nil || !strings.Contains(text, "skipped: no NVIDIA driver (nvidia-smi failed: NVIDIA-SMI has failed") {
		t.Errorf("run.sh with a failing nvidia-smi: %v\n%s", err, text)
	}
}
