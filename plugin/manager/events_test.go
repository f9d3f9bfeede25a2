package manager_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/isolation"
	"github.com/gpushare/gpushare/plugin/manager"
)

// withEvents records e's events into a fake recorder with room for every
// event a test makes (a full one would block the plugin).
func withEvents(rec *events.FakeRecorder) func(*manager.Config) {
	return func(c *manager.Config) { c.Events = rec }
}

// waitEvent returns the first event rec gets that starts with prefix,
// failing after 20s.
func waitEvent(t *testing.T, rec *events.FakeRecorder, prefix string) string {
	t.Helper()
	deadline := time.NewTimer(20 * time.Second)
	defer deadline.Stop()
	var seen []string
	for {
		select {
		case ev := <-rec.Events:
			if strings.HasPrefix(ev, prefix) {
				return ev
			}
			seen = append(seen, ev)
		case <-deadline.C:
			t.Fatalf("no event %q in 20s; got %q", prefix, seen)
			return ""
		}
	}
}

func TestAllocateRefusedEvent(t *testing.T) {
	rec := events.NewFakeRecorder(100)
	e := run(t, "simulated:dgxh100", withEvents(rec))
	e.kubelet.waitRegister(t)
	_, err := e.plugin(t).Allocate(t.Context(), allocReq(4))
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Allocate with no pod = %v; want FailedPrecondition", err)
	}
	ev := waitEvent(t, rec, "Warning "+gpushare.EventReasonAllocateRefused+" ")
	if want := "Allocate of [4] units refused: "; !strings.Contains(ev, want) || !strings.Contains(ev, "no pod bound to node") {
		t.Errorf("event %q; want %q and the refusal's reason", ev, want)
	}
}

func TestIsolationRefusedEvent(t *testing.T) {
	rec := events.NewFakeRecorder(100)
	root := t.TempDir()
	daemon := &fakeMPS{pipe: filepath.Join(root, "pipe")}
	e := run(t, "simulated:dgxh100", func(c *manager.Config) {
		c.Events = rec
		c.Isolation = manager.IsolationConfig{Tier: gpushare.IsolationMPS, MPS: daemon, ProbeEvery: 100 * time.Millisecond,
			Paths: isolation.Config{MPSPipeDir: daemon.pipe, MPSShmDir: filepath.Join(root, "shm")}}
	})
	e.kubelet.waitRegister(t)
	daemon.kill(errors.New("fake: busy"))
	waitNode(t, e, "fell back to tier none", tiersOn(gpushare.IsolationNone, "does not answer"))
	if _, err := e.client.CoreV1().Pods("default").Create(t.Context(), withIsolation(gpuPod("q", 4, 2, 80), "mps", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.plugin(t).Allocate(t.Context(), reqOn(0, 4)); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Allocate with the tier down = %v; want FailedPrecondition", err)
	}
	ev := waitEvent(t, rec, "Warning "+gpushare.EventReasonAllocateRefused+" ")
	if !strings.Contains(ev, `isolation tier "mps", which is down`) || !strings.Contains(ev, "default/q/main") {
		t.Errorf("event %q; want the tier and the container", ev)
	}
}

func TestGPUHealthEvents(t *testing.T) {
	rec := events.NewFakeRecorder(100)
	e := run(t, "simulated:dgxh100", func(c *manager.Config) {
		c.Events = rec
		c.HealthQuietPeriod = 500 * time.Millisecond
	})
	e.kubelet.waitRegister(t)
	gpus, err := e.sim.Devices()
	if err != nil {
		t.Fatal(err)
	}
	if err := e.sim.InjectXid(3, 62); err != nil { // transient: healthy after the quiet period
		t.Fatal(err)
	}
	sick := waitEvent(t, rec, "Warning "+gpushare.EventReasonGPUUnhealthy+" ")
	if want := fmt.Sprintf("GPU 3 (%s) is unhealthy: ", gpus[3].UUID); !strings.Contains(sick, want) || !strings.Contains(sick, "62") {
		t.Errorf("event %q; want %q and the Xid", sick, want)
	}
	healed := waitEvent(t, rec, "Normal "+gpushare.EventReasonGPUHealthy+" ")
	if want := fmt.Sprintf("Normal GPUHealthy GPU 3 (%s) is healthy again", gpus[3].UUID); healed != want {
		t.Errorf("event %q; want %q", healed, want)
	}
}
