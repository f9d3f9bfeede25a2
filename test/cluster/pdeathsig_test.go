package cluster

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

const envChild = "GPUSHARE_CLUSTER_TEST_CHILD"

// A component outlives nothing: when the process that started it is killed with SIGKILL (no
// cleanup can run), the kernel kills the component too.
func TestComponentsDieWithTheirParent(t *testing.T) {
	if os.Getenv(envChild) != "" {
		runChild(t)
		return
	}
	child := exec.Command(os.Args[0], "-test.run=^TestComponentsDieWithTheirParent$")
	child.Env = append(os.Environ(), envChild+"="+t.TempDir())
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	var pid int
	scanner := bufio.NewScanner(out)
	for scanner.Scan() {
		if v, ok := strings.CutPrefix(scanner.Text(), "component pid "); ok {
			pid, _ = strconv.Atoi(v)
			break
		}
	}
	if pid == 0 {
		child.Process.Kill()
		child.Wait()
		t.Fatal("child test never reported its component")
	}
	if err := child.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	child.Wait()
	if err := waitUntil(t.Context(), 10*time.Second, "component to die with its parent", nil, func(context.Context) (bool, error) {
		return !alive(pid), nil
	}); err != nil {
		syscall.Kill(pid, syscall.SIGKILL)
		t.Fatal(err)
	}
}

func runChild(t *testing.T) {
	p := newProcess("sleeper", "/bin/sleep", filepath.Join(os.Getenv(envChild), "sleeper.log"), []string{"300"})
	if err := p.start(); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("component pid %d\n", p.cmd.Process.Pid)
	<-make(chan struct{}) // until the parent test kills this process
}

// alive reports whether pid exists and is not a zombie (a zombie is dead, waiting to be reaped).
func alive(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	fields := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z"
}
