package manager

import (
	"testing"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/inventory"
	"github.com/gpushare/gpushare/plugin/isolation"
	"github.com/gpushare/gpushare/plugin/nvml"
)

// A state change is written at once; a down tier whose reason alone changes
// is written again at most every reasonRefresh.
func TestSetTierWritesChangesAndThrottlesReasons(t *testing.T) {
	sim, err := nvml.NewSimulator(nil, "simulated:dgxa100")
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Shutdown()
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}})
	m, err := New(Config{Node: "n", Client: client, Library: sim})
	if err != nil {
		t.Fatal(err)
	}
	m.inv, err = inventory.New([]inventory.GPU{{Index: 0, UUID: "GPU-0", MemoryMiB: 81920}}, gpushare.GiB)
	if err != nil {
		t.Fatal(err)
	}
	w := newTierWatch(m.cfg.Isolation, zap.NewNop(), func() map[string]string { return nil })
	writes := func() int {
		n := 0
		for _, a := range client.Actions() {
			if a.GetVerb() == "patch" && a.GetSubresource() == "" {
				n++
			}
		}
		return n
	}
	published := func() gpushare.GPUInfo {
		node, err := client.CoreV1().Nodes().Get(t.Context(), "n", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		d, err := gpushare.DecodeNodeGPUs(node.Annotations[gpushare.AnnotationNodeGPUs])
		if err != nil {
			t.Fatal(err)
		}
		return d.GPUs[0]
	}
	down := func(reason string) isolation.Status {
		return isolation.Status{Tier: gpushare.IsolationMPS, Down: true, Reason: reason}
	}
	up := isolation.Status{Tier: gpushare.IsolationMPS}

	m.setTier(t.Context(), w, up) // the first probe: Run publishes it
	if n := writes(); n != 0 {
		t.Fatalf("%d writes for the first probe", n)
	}
	m.setTier(t.Context(), w, down("daemon (pid 7) exited"))
	if g := published(); writes() != 1 || g.Isolation != gpushare.IsolationNone || g.IsolationReason != "daemon (pid 7) exited" {
		t.Fatalf("after the tier went down: %d writes, %+v", writes(), g)
	}
	m.setTier(t.Context(), w, down("daemon (pid 7) exited; starting it again failed: busy"))
	m.setTier(t.Context(), w, down("daemon (pid 7) exited"))
	if n := writes(); n != 1 {
		t.Errorf("%d writes; a changed reason alone must wait %v", n, reasonRefresh)
	}
	m.mu.Lock()
	m.tierSince = time.Now().Add(-2 * reasonRefresh)
	m.mu.Unlock()
	m.setTier(t.Context(), w, down("daemon (pid 9) exited"))
	if g := published(); writes() != 2 || g.IsolationReason != "daemon (pid 9) exited" {
		t.Errorf("after %v: %d writes, %+v", reasonRefresh, writes(), g)
	}
	m.setTier(t.Context(), w, up)
	if g := published(); writes() != 3 || g.Isolation != gpushare.IsolationMPS || g.IsolationReason != "" {
		t.Errorf("after the tier came back: %d writes, %+v", writes(), g)
	}
}
