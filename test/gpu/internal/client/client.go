// Package client runs the real-GPU checks' CUDA client (test/gpu/alloc.cu,
// alloc.py, or fakeclient.sh in the dry run) with the environment a
// container would get, and explains its exit status.
package client

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/gpushare/gpushare/test/gpu/internal/report"
)

// The client's exit statuses; NotRun is this package's for a client that
// did not run to completion.
const (
	ExitAllocated   = 0
	ExitOutOfMemory = 2
	NotRun          = -1
)

// Client is the client command and what it allocates.
type Client struct {
	Cmd      []string // the command; the allocation size in GiB is appended
	AllocGiB int
	Timeout  time.Duration // how long one run may take
}

// New splits the command line cmd; an empty one is a Client without
// command (Built reports false).
func New(cmd string, allocGiB int, timeout time.Duration) Client {
	return Client{Cmd: strings.Fields(cmd), AllocGiB: allocGiB, Timeout: timeout}
}

// Built reports whether there is a client to run.
func (c Client) Built() bool { return len(c.Cmd) > 0 }

// Run runs the client with env ("NAME=value", what a container gets) over
// this process's environment and returns its exit status (NotRun when it
// did not complete), printing the command, its output and its exit.
func (c Client) Run(ctx context.Context, r *report.Report, env []string) int {
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	args := append(append([]string(nil), c.Cmd[1:]...), fmt.Sprint(c.AllocGiB))
	cmd := exec.CommandContext(ctx, c.Cmd[0], args...)
	cmd.Env = Env(os.Environ(), env)
	r.Say("$ %s %s", strings.Join(env, " "), strings.Join(cmd.Args, " "))
	t0 := time.Now()
	out, err := cmd.CombinedOutput()
	r.Say("%s", strings.TrimRight(string(out), "\n"))
	code := exitCode(err)
	if code == NotRun {
		r.Say("did not complete after %v: %v", time.Since(t0).Round(time.Millisecond), err)
	} else {
		r.Say("exit %d after %v", code, time.Since(t0).Round(time.Millisecond))
	}
	return code
}

// exitCode is the status of a finished command, NotRun when it did not exit.
func exitCode(err error) int {
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exit) && exit.Exited():
		return exit.ExitCode()
	}
	return NotRun
}

// Env is base without what would change which GPUs a client sees or its
// MPS settings (a container gets only what it is given) and without the
// names env sets, followed by env.
func Env(base, env []string) []string {
	set := map[string]bool{}
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		set[name] = true
	}
	var out []string
	for _, kv := range base {
		name, _, _ := strings.Cut(kv, "=")
		if !set[name] && name != "CUDA_VISIBLE_DEVICES" && !strings.HasPrefix(name, "CUDA_MPS_") {
			out = append(out, kv)
		}
	}
	return append(out, env...)
}

// ExitMeaning explains a client's exit status against the wanted one.
func ExitMeaning(code, want int) string {
	meaning := map[int]string{ExitAllocated: "allocated", 1: "failed otherwise", ExitOutOfMemory: "out of memory", NotRun: "did not run to completion"}
	return fmt.Sprintf("exit %d (%s), want %d (%s)", code, meaning[code], want, meaning[want])
}
