// Command fake-cri serves the CRI fake runtime (k8s.io/cri-client/pkg/fake) on a unix socket.
// It stands where containerd stands on a real node: a separate process whose containers keep
// "running" while the kubelet restarts, so a restarted hollow-kubelet finds them, as a real kubelet
// does, and its device manager keeps their devices instead of re-admitting the pods.
//
// A container whose image name contains "exit-0" finishes with exit code 0 soon after it starts
// (the others run until stopped): tests use it for init containers that must run to completion
// before a pod's regular containers start.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	apitest "k8s.io/cri-api/pkg/apis/testing"
	fakeremote "k8s.io/cri-client/pkg/fake"
)

// exitMarker in an image name makes its containers finish by themselves.
const exitMarker = "exit-0"

// finishExiting ends, every period, the running containers whose image asks to: the fake runtime
// has no processes, so this is how a container "runs to completion".
func finishExiting(rs *apitest.FakeRuntimeService, period time.Duration, stop <-chan struct{}) {
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		rs.Lock()
		for _, c := range rs.Containers {
			if c.State == runtimeapi.ContainerState_CONTAINER_RUNNING && c.Image != nil && strings.Contains(c.Image.Image, exitMarker) {
				c.State = runtimeapi.ContainerState_CONTAINER_EXITED
				c.FinishedAt = time.Now().UnixNano()
				c.ExitCode = 0
				c.Reason = "Completed"
			}
		}
		rs.Unlock()
	}
}

func main() {
	endpoint := flag.String("endpoint", "", "unix:///path/to/socket to serve on (required)")
	flag.Parse()
	if !strings.HasPrefix(*endpoint, "unix://") {
		fmt.Fprintln(os.Stderr, "fake-cri: -endpoint must be unix:///path")
		os.Exit(1)
	}
	// A stale socket from a killed run would make the listen fail.
	_ = os.Remove(strings.TrimPrefix(*endpoint, "unix://"))
	runtime := fakeremote.NewFakeRemoteRuntime()
	// The kubelet's remote image client rejects images without a size (the in-process fake skips
	// that check): give every "pulled" image one, the size of the pause image.
	runtime.ImageService.SetFakeImageSize(300 << 10)
	if err := runtime.Start(*endpoint); err != nil {
		fmt.Fprintln(os.Stderr, "fake-cri:", err)
		os.Exit(1)
	}
	fmt.Println("fake-cri serving on", *endpoint)
	done := make(chan struct{})
	go finishExiting(runtime.RuntimeService, 50*time.Millisecond, done)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	<-stop
	close(done)
	runtime.Stop()
}
