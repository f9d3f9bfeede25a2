// Command fake-cri serves the CRI fake runtime (k8s.io/cri-client/pkg/fake) on a unix socket.
// It stands where containerd stands on a real node: a separate process whose containers keep
// "running" while the kubelet restarts, so a restarted hollow-kubelet finds them, as a real kubelet
// does, and its device manager keeps their devices instead of re-admitting the pods.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	fakeremote "k8s.io/cri-client/pkg/fake"
)

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
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	<-stop
	runtime.Stop()
}
