package cluster

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// BuildGPUShareScheduler builds cmd/gpushare-scheduler (kube-scheduler with the GPUShare plugin,
// a module of its own) from this checkout into dir and returns the binary's path. It compiles
// with the bed's build cache and flags, so the Kubernetes packages the bed built are reused and
// only the plugin and the link are new (seconds when the bed is warm).
func BuildGPUShareScheduler(dir string) (string, error) {
	script, err := buildScript()
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
		return "", fmt.Errorf("build gpushare-scheduler in %s: %w\n%s", src, err, stderr.String())
	}
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
