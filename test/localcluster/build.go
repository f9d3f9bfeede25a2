package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/gpushare/gpushare/test/cluster"
)

// quietCgoFlags are the C flags for building the device plugin when the caller set none: go's
// default ones, plus silence for go-nvml's header, which marks the NVML calls deprecated in CUDA 13
// that its bindings still wrap (hundreds of lines of -Wdeprecated-declarations on a cold build).
const quietCgoFlags = "-O2 -g -Wno-deprecated-declarations"

// buildEnv is the environment of our go builds: the caller's, with quietCgoFlags when it sets no
// CGO_CFLAGS (make demo exports its own).
func buildEnv() []string {
	env := os.Environ()
	if _, set := os.LookupEnv("CGO_CFLAGS"); !set {
		env = append(env, "CGO_CFLAGS="+quietCgoFlags)
	}
	return env
}

// buildPrograms builds ./cmd/... into binDir, its compiler output on our stderr.
func buildPrograms(ctx context.Context, root, binDir string) error {
	build := exec.CommandContext(ctx, "go", "build", "-o", binDir+string(filepath.Separator), "./cmd/...")
	build.Dir, build.Env, build.Stdout, build.Stderr = root, buildEnv(), os.Stdout, os.Stderr
	stopGroupOnCancel(build)
	if err := build.Run(); err != nil {
		return fmt.Errorf("go build ./cmd/...: %w", err)
	}
	return nil
}

// buildBed returns the test bed's binaries like cluster.Binaries, but lets test/bed/build.sh talk:
// a cold build takes minutes, and the script says on stderr which component it builds and how
// long it has taken, every 30 s. Its stdout's last line is the binaries' directory.
func buildBed(ctx context.Context, root string) (string, error) {
	if dir := os.Getenv(cluster.EnvBinDir); dir != "" {
		return dir, nil
	}
	var stdout bytes.Buffer
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, "test", "bed", "build.sh"))
	cmd.Stdout, cmd.Stderr = &stdout, os.Stderr
	stopGroupOnCancel(cmd)
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("build the test bed (test/bed/build.sh): %w", err)
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	return lines[len(lines)-1], nil
}

// stopGroupOnCancel runs cmd in its own process group and, when its context ends, sends SIGTERM
// to the whole group: a build is a tree (bash, go, compilers, the script's ticker), and killing
// only its root would leave the rest compiling after the demo has gone.
func stopGroupOnCancel(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
}
