// Package fakemps builds and inspects the fake MPS control daemon
// (cmd/fake-mps-control), which stands in for NVIDIA's
// nvidia-cuda-mps-control in tests of the MPS isolation tier: plugin/mps's
// unit tests, and end-to-end tests that need an MPS node without a GPU.
package fakemps

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
)

const (
	// PIDFile is the file in the pipe directory that holds the daemon's PID,
	// named as NVIDIA's daemon names it.
	PIDFile = "nvidia-cuda-mps-control.pid"
	// Socket is the daemon's control socket in the pipe directory.
	Socket = "control"
	// BinaryName is the file Build writes.
	BinaryName = "fake-mps-control"
)

// Build compiles the fake into dir and returns its path. The Go build cache
// makes repeated calls cheap.
func Build(dir string) (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("cannot locate the repository")
	}
	root := filepath.Join(filepath.Dir(file), "..", "..")
	out := filepath.Join(dir, BinaryName)
	cmd := exec.Command("go", "build", "-o", out, "./test/fakemps/cmd/fake-mps-control")
	cmd.Dir = root
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build fake-mps-control: %w\n%s", err, log.String())
	}
	return out, nil
}

// ReadPID returns the PID the daemon serving pipeDir wrote, so a test can
// kill it as a crash would.
func ReadPID(pipeDir string) (int, error) {
	data, err := os.ReadFile(filepath.Join(pipeDir, PIDFile))
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return 0, fmt.Errorf("%s: %w", PIDFile, err)
	}
	return pid, nil
}
