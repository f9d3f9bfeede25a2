package cluster

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
)

// BuildGPUShareScheduler puts cmd/gpushare-scheduler (kube-scheduler with the GPUShare plugin, a
// module of its own) built from this checkout into dir and returns the binary's path. The first
// call of a process builds it, with the bed's build cache and flags so the Kubernetes packages the
// bed built are reused (seconds when the bed is warm); later calls hard-link that binary. Tests
// that run in parallel would otherwise compile the same packages at once: Go's cache does not
// share work in progress.
func BuildGPUShareScheduler(dir string) (string, error) {
	built, err := schedulerBuild()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "gpushare-scheduler")
	return out, linkOrCopy(built, out)
}

var (
	schedulerMu    sync.Mutex
	schedulerBuilt string // this process's build of gpushare-scheduler
)

func schedulerBuild() (string, error) {
	schedulerMu.Lock()
	defer schedulerMu.Unlock()
	if schedulerBuilt != "" {
		return schedulerBuilt, nil
	}
	script, err := buildScript()
	if err != nil {
		return "", err
	}
	// In this process's own build directory, removed with the others by removeStaleOwnBuilds.
	dir, err := os.MkdirTemp("", fmt.Sprintf("%s%d-", ownPrefix, os.Getpid()))
	if err != nil {
		return "", err
	}
	src := filepath.Join(filepath.Dir(script), "..", "..", "cmd", "gpushare-scheduler")
	out := filepath.Join(dir, "gpushare-scheduler")
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly", "GOTOOLCHAIN=local", "GOCACHE="+bedGoCache())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		_ = os.RemoveAll(dir)
		return "", fmt.Errorf("build gpushare-scheduler in %s: %w\n%s", src, err, stderr.String())
	}
	schedulerBuilt = out
	return out, nil
}

// bedGoCache is the build cache test/bed/build.sh compiles with.
func bedGoCache() string {
	cache := os.Getenv("GPUSHARE_BED_CACHE")
	if cache == "" {
		base := os.Getenv("XDG_CACHE_HOME")
		if base == "" {
			home, _ := os.UserHomeDir()
			base = filepath.Join(home, ".cache")
		}
		cache = filepath.Join(base, "gpushare-bed")
	}
	return filepath.Join(cache, "gocache")
}
