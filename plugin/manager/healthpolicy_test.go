package manager_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/manager"
	"github.com/gpushare/gpushare/plugin/nvml"
)

// unhealthyIn lists the GPUs (as "3,5") with an unhealthy device in l.
func unhealthyIn(l *pluginapi.ListAndWatchResponse) string {
	var out []string
	for _, d := range l.Devices {
		g, _, _ := strings.Cut(d.ID, "-")
		if d.Health == pluginapi.Unhealthy && !slices.Contains(out, g) {
			out = append(out, g)
		}
	}
	return strings.Join(out, ",")
}

// recvUntil reads the stream until a list whose unhealthy GPUs are want.
func recvUntil(t *testing.T, stream pluginapi.DevicePlugin_ListAndWatchClient, want string) *pluginapi.ListAndWatchResponse {
	t.Helper()
	for {
		l, err := stream.Recv()
		if err != nil {
			t.Fatalf("ListAndWatch while waiting for unhealthy GPUs %q: %v", want, err)
		}
		if unhealthyIn(l) == want {
			return l
		}
	}
}

// waitNode polls the Node until cond holds; polling a real condition with a
// deadline, not a sleep standing in for synchronisation.
func waitNode(t *testing.T, e *env, what string, cond func(*corev1.Node) bool) *corev1.Node {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		node, err := e.client.CoreV1().Nodes().Get(t.Context(), nodeName, metav1.GetOptions{})
		if err == nil && cond(node) {
			return node
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node never %s (last: %v, %v)", what, node, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// nodeGPUs decodes the node's GPU description, or returns ok false.
func nodeGPUs(node *corev1.Node) (gpushare.NodeGPUs, bool) {
	d, err := gpushare.DecodeNodeGPUs(node.Annotations[gpushare.AnnotationNodeGPUs])
	return d, err == nil
}

// A fatal Xid keeps its GPU unhealthy after any quiet period, and the node
// says it is permanent; a transient Xid on another GPU heals meanwhile.
func TestFatalXidStaysUnhealthy(t *testing.T) {
	const quiet = 300 * time.Millisecond
	e := run(t, "simulated:dgxh100", func(c *manager.Config) { c.HealthQuietPeriod = quiet })
	e.kubelet.waitRegister(t)
	stream, err := e.plugin(t).ListAndWatch(t.Context(), &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.sim.InjectXid(3, 79); err != nil {
		t.Fatal(err)
	}
	recvUntil(t, stream, "3")
	node := waitNode(t, e, "showed GPU 3 permanently unhealthy", func(n *corev1.Node) bool {
		d, ok := nodeGPUs(n)
		return ok && !d.GPUs[3].Healthy
	})
	d, _ := nodeGPUs(node)
	if g := d.GPUs[3]; !g.Permanent || !strings.Contains(g.Reason, "Xid 79") || !strings.Contains(g.Reason, "permanent") {
		t.Errorf("GPU 3 published as %+v; want permanent, naming Xid 79", g)
	}

	// GPU 5's transient fault comes after GPU 3's fatal one: once GPU 5 is
	// healthy again, a whole quiet period has passed for GPU 3 as well.
	if err := e.sim.InjectXid(5, 62); err != nil {
		t.Fatal(err)
	}
	recvUntil(t, stream, "3,5")
	healed := time.Now()
	recvUntil(t, stream, "3")
	if time.Since(healed) > 10*time.Second {
		t.Fatal("GPU 5 took implausibly long to heal")
	}
	// A transient fault on GPU 3 now must not shorten its fatal one.
	if err := e.sim.InjectXid(3, 62); err != nil {
		t.Fatal(err)
	}
	if err := e.sim.InjectXid(5, 62); err != nil {
		t.Fatal(err)
	}
	recvUntil(t, stream, "3,5")
	recvUntil(t, stream, "3")
	node = waitNode(t, e, "kept GPU 3's permanent reason", func(n *corev1.Node) bool {
		d, ok := nodeGPUs(n)
		return ok && d.GPUs[5].Healthy
	})
	if d, _ := nodeGPUs(node); !d.GPUs[3].Permanent || !strings.Contains(d.GPUs[3].Reason, "Xid 79") {
		t.Errorf("GPU 3 after a later transient Xid = %+v; want still permanent for Xid 79", d.GPUs[3])
	}
}

// gatedWatch fails every WatchHealth until open is closed, as NVML does
// when it cannot create an event set.
type gatedWatch struct {
	nvml.Library
	open  chan struct{}
	calls atomic.Int32
}

func (g *gatedWatch) WatchHealth(ctx context.Context, o nvml.HealthOptions, ev chan<- nvml.HealthEvent) error {
	g.calls.Add(1)
	select {
	case <-g.open:
		return g.Library.WatchHealth(ctx, o, ev)
	default:
		return errors.New("watch GPU health: create event set: ERROR_UNKNOWN")
	}
}

// While the watch cannot be set up, every GPU's health is unknown, so every
// GPU is unhealthy; time alone does not heal them, the watch working does.
func TestHealthWatchUnavailableUntilItWorks(t *testing.T) {
	gate := make(chan struct{})
	var g *gatedWatch
	e := run(t, "simulated:dgxa100", func(c *manager.Config) {
		g = &gatedWatch{Library: c.Library, open: gate}
		c.Library = g
		c.HealthQuietPeriod = 50 * time.Millisecond // shorter than the retries: they must not heal anything
	})
	e.kubelet.waitRegister(t)
	stream, err := e.plugin(t).ListAndWatch(t.Context(), &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	all := "0,1,2,3,4,5,6,7"
	recvUntil(t, stream, all)
	node := waitNode(t, e, "showed every GPU unhealthy", func(n *corev1.Node) bool {
		d, ok := nodeGPUs(n)
		return ok && !slices.ContainsFunc(d.GPUs, isHealthy)
	})
	d, _ := nodeGPUs(node)
	for _, gpu := range d.GPUs {
		if !strings.Contains(gpu.Reason, "health watch unavailable") || gpu.Permanent {
			t.Errorf("GPU %d published as %+v; want the watch named, not permanent", gpu.Index, gpu)
		}
	}
	// Retries fail (10, 20, 40, 80 ms apart: MinBackoff 10ms) over three
	// quiet periods; nothing heals meanwhile.
	for deadline := time.Now().Add(20 * time.Second); g.calls.Load() < 5; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("only %d watch setups in 20s; want retries with backoff", g.calls.Load())
		}
	}
	node, err = e.client.CoreV1().Nodes().Get(t.Context(), nodeName, metav1.GetOptions{})
	if d, ok := nodeGPUs(node); err != nil || !ok || slices.ContainsFunc(d.GPUs, isHealthy) {
		t.Fatalf("after %d failed watch setups the node shows %+v, %v; want every GPU still unhealthy", g.calls.Load(), d, err)
	}
	close(gate)
	recvUntil(t, stream, "")
	waitNode(t, e, "showed the GPUs healthy again", func(n *corev1.Node) bool {
		d, ok := nodeGPUs(n)
		return ok && !slices.ContainsFunc(d.GPUs, isUnhealthy)
	})
	// The watch runs: a fatal Xid is seen.
	if err := e.sim.InjectXid(2, 95); err != nil {
		t.Fatal(err)
	}
	recvUntil(t, stream, "2")
}

func isHealthy(g gpushare.GPUInfo) bool   { return g.Healthy }
func isUnhealthy(g gpushare.GPUInfo) bool { return !g.Healthy }
