// Package gpu holds the real-GPU check of the MPS tier (run.sh, with
// mpscheck and the CUDA clients). These tests keep the script working on
// machines without a GPU: the dry run exercises every step against the
// simulated NVML backend and the fake MPS daemon, and the skip path is
// checked with an nvidia-smi that fails.
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
	cmd.Env = append(os.Environ(), env...)
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
