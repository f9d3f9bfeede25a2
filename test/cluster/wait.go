package cluster

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// pollInterval is short because every wait here is for a local process a few milliseconds away.
const pollInterval = 50 * time.Millisecond

// waitUntil polls ready until it reports true, the context ends, timeout passes, or proc (if not
// nil) exits. The last error from ready is part of the failure, so a timeout says why.
func waitUntil(ctx context.Context, timeout time.Duration, what string, proc *process, ready func(context.Context) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var exited <-chan struct{}
	if proc != nil {
		exited = proc.exited()
	}
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	var last error
	for {
		ok, err := ready(ctx)
		if ok {
			return nil
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %s (last error: %v)", what, timeout, last)
		case <-exited:
			return fmt.Errorf("%s: %w: %v", what, errExited, proc.exitErr())
		case <-tick.C:
		}
	}
}

// freePort asks the kernel for an unused loopback port. Another process could take it before the
// component binds it; then the component fails fast and its log says so.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// freePorts returns n distinct free ports, holding each until all are chosen.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	for range n {
		l, err := listenOutsideEphemeral()
		if err != nil {
			return nil, err
		}
		held = append(held, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// FreePort returns a loopback port that is free now and outside the kernel's ephemeral range,
// for a server a test starts (and restarts) at a fixed address.
func FreePort() (int, error) {
	l, err := listenOutsideEphemeral()
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// lowestPort is the bottom of the range free ports are drawn from: above the well-known and
// registered services a test machine may run.
const lowestPort = 10000

// listenOutsideEphemeral listens on a random loopback port below the kernel's ephemeral range.
// A port the kernel handed out (":0") comes from that range, where any outgoing connection may
// take it as its local port between the time it is chosen and the time the server listens on it
// (a 500-pod burst makes thousands of connections in that window: CI saw "address already in
// use"); ports below the range are only ever taken by listeners.
func listenOutsideEphemeral() (net.Listener, error) {
	low := ephemeralLow()
	for range 200 {
		if low <= lowestPort+1000 {
			break
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(lowestPort+rand.IntN(low-lowestPort)))
		if err == nil {
			return l, nil
		}
	}
	return net.Listen("tcp", "127.0.0.1:0")
}

// ephemeralLow is the first port of the kernel's ephemeral range (Linux's default when it
// cannot be read).
func ephemeralLow() int {
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil {
				return v
			}
		}
	}
	return 32768
}

// socketAnswers tells whether something accepts connections on a unix socket (a stale socket file
// left by a dead process does not).
func socketAnswers(path string) bool {
	c, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// Poll calls cond every 50ms until it reports true, ctx ends or timeout passes; the error names
// what and the last error cond returned. Tests use it instead of sleeping.
func Poll(ctx context.Context, timeout time.Duration, what string, cond func(context.Context) (bool, error)) error {
	return waitUntil(ctx, timeout, what, nil, cond)
}
