package manager_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/manager"
	"github.com/gpushare/gpushare/plugin/nvml"
	"github.com/gpushare/gpushare/plugin/server"
)

// published reports whether node shows count GPUs in status and our GPU description.
func published(count int64) func(*corev1.Node) bool {
	return func(n *corev1.Node) bool {
		c, a := n.Status.Capacity[gpushare.ResourceCount], n.Status.Allocatable[gpushare.ResourceCount]
		d, ok := nodeGPUs(n)
		return ok && c.Value() == count && a.Value() == count && len(d.GPUs) == int(count) && c.String() != "" && a.String() != ""
	}
}

// wipe removes what the plugin publishes from the Node, as a re-created
// Node object or a kubelet resetting extended resources would.
func wipe(t *testing.T, e *env) {
	t.Helper()
	ctx := t.Context()
	nodes := e.client.CoreV1().Nodes()
	node, err := nodes.Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	delete(node.Annotations, gpushare.AnnotationNodeGPUs)
	delete(node.Annotations, gpushare.AnnotationSkippedGPUs)
	if node, err = nodes.Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	delete(node.Status.Capacity, gpushare.ResourceCount)
	delete(node.Status.Allocatable, gpushare.ResourceCount)
	if _, err := nodes.UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// restartKubelet stops the fake kubelet, wipes the plugin sockets and starts
// a new one, as a kubelet restart does.
func restartKubelet(t *testing.T, e *env) *fakeKubelet {
	t.Helper()
	e.kubelet.srv.Stop()
	for _, f := range []string{server.KubeletSocket, gpushare.DevicePluginSocket} {
		if err := os.Remove(filepath.Join(e.dir, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
	}
	k := startFakeKubelet(t, e.dir)
	e.kubelet = k
	return k
}

// nodePatches counts the PATCHes of the Node so far.
func nodePatches(c *fake.Clientset) int {
	n := 0
	for _, a := range c.Actions() {
		if a.GetVerb() == "patch" && a.GetResource().Resource == "nodes" {
			n++
		}
	}
	return n
}

// Each registration publishes the node again, even when nothing on the Node
// changed (a restarted kubelet may reset it right after).
func TestRepublishAfterEveryRegistration(t *testing.T) {
	e := run(t, "simulated:dgxa100", func(c *manager.Config) { c.HealthCheck = false })
	e.kubelet.waitRegister(t)
	e.waitRegistered(t)
	waitNode(t, e, "was published", published(8))
	// The first registration's publication: status and annotations.
	for deadline := time.Now().Add(20 * time.Second); nodePatches(e.client) < 4; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d node PATCHes; want Run's two and the registration's two", nodePatches(e.client))
		}
	}
	before := nodePatches(e.client)
	restartKubelet(t, e).waitRegister(t)
	e.waitRegistered(t)
	for deadline := time.Now().Add(20 * time.Second); nodePatches(e.client) < before+2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no node PATCH after re-registering (%d before, %d now)", before, nodePatches(e.client))
		}
	}
}

// A kubelet restart that reset the node's capacity and annotation, with the
// API refusing the first writes: the plugin re-registers, and the Node gets
// everything back, retried in the background.
func TestRepublishAfterKubeletRestartWipedTheNode(t *testing.T) {
	var refuse atomic.Int32
	e := run(t, "simulated:mixed", func(c *manager.Config) {
		c.HealthCheck = false
		// Installed before Run: the fake's reactor chain is not safe to change while the manager calls it.
		c.Client.(*fake.Clientset).PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
			if refuse.Add(-1) >= 0 {
				return true, nil, apierrors.NewServiceUnavailable("apiserver restarting")
			}
			return false, nil, nil
		})
	})
	e.kubelet.waitRegister(t)
	e.waitRegistered(t)
	waitNode(t, e, "was published", published(4))
	refuse.Store(3)
	wipe(t, e)
	restartKubelet(t, e).waitRegister(t)
	e.waitRegistered(t)
	waitNode(t, e, "got its GPU count and description back", published(4))
	if n := refuse.Load(); n >= 0 {
		t.Errorf("%d refusals left; the writes were not retried after failing", n+1)
	}
}

// A Node deleted and created again (no kubelet restart, no re-registration)
// gets the publications back from the node watch.
func TestRepublishWhenNodeRecreated(t *testing.T) {
	e := run(t, "simulated:dgxh100", func(c *manager.Config) { c.HealthCheck = false })
	e.kubelet.waitRegister(t)
	waitNode(t, e, "was published", published(8))
	ctx := t.Context()
	if err := e.client.CoreV1().Nodes().Delete(ctx, nodeName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitNode(t, e, "got its publications back after being re-created", published(8))
	// And an edit of the annotation by someone else is undone.
	wipe(t, e)
	waitNode(t, e, "got its publications back after a wipe", published(8))
}

// A GPU in MIG mode is neither advertised nor counted, and the node says why.
func TestMIGGPUSkipped(t *testing.T) {
	e := run(t, "simulated:mixed:mig=1", nil)
	e.kubelet.waitRegister(t)
	stream, err := e.plugin(t).ListAndWatch(t.Context(), &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	list, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range list.Devices {
		if strings.HasPrefix(d.ID, "1-") {
			t.Fatalf("device %s of the MIG GPU is advertised", d.ID)
		}
	}
	node := waitNode(t, e, "named the skipped GPU", func(n *corev1.Node) bool {
		_, ok := n.Annotations[gpushare.AnnotationSkippedGPUs]
		return ok && published(3)(n)
	})
	d, _ := nodeGPUs(node)
	if _, ok := d.GPU(1); ok || uint64(len(list.Devices)) != d.TotalUnits() {
		t.Errorf("node description %+v with %d devices advertised; want GPUs 0, 2, 3 and all their units", d, len(list.Devices))
	}
	skipped, err := gpushare.DecodeSkippedGPUs(node.Annotations[gpushare.AnnotationSkippedGPUs])
	want := e.sim.Skipped()
	if err != nil || len(skipped) != 1 || len(want) != 1 || skipped[0].Index != 1 || skipped[0].UUID != want[0].UUID || skipped[0].Reason != nvml.ReasonMIG {
		t.Errorf("skipped GPUs = %+v, %v; want GPU 1 (%+v) for MIG", skipped, err, want)
	}
}

// Every GPU in MIG mode: the plugin still runs and registers, advertises
// nothing, and the node says why.
func TestAllGPUsMIG(t *testing.T) {
	e := run(t, "simulated:mixed:mig=0,1,2,3", nil)
	e.kubelet.waitRegister(t)
	stream, err := e.plugin(t).ListAndWatch(t.Context(), &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	if list, err := stream.Recv(); err != nil || len(list.Devices) != 0 {
		t.Fatalf("ListAndWatch = %v, %v; want no device", list, err)
	}
	node := waitNode(t, e, "named the skipped GPUs", func(n *corev1.Node) bool {
		_, ok := n.Annotations[gpushare.AnnotationSkippedGPUs]
		return ok && published(0)(n)
	})
	if s, err := gpushare.DecodeSkippedGPUs(node.Annotations[gpushare.AnnotationSkippedGPUs]); err != nil || len(s) != 4 {
		t.Errorf("skipped GPUs = %+v, %v; want all four", s, err)
	}
}

// A skipped-GPU annotation left by an earlier run (MIG since turned off)
// is removed.
func TestStaleSkippedAnnotationRemoved(t *testing.T) {
	e := run(t, "simulated:dgxa100", func(c *manager.Config) {
		// Before Run: the Node as the earlier run left it.
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName,
			Annotations: map[string]string{gpushare.AnnotationSkippedGPUs: `[{"index":3,"reason":"MIG"}]`}}}
		if _, err := c.Client.CoreV1().Nodes().Update(t.Context(), node, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	})
	e.kubelet.waitRegister(t)
	waitNode(t, e, "lost the stale skipped-GPU annotation", func(n *corev1.Node) bool {
		_, ok := n.Annotations[gpushare.AnnotationSkippedGPUs]
		return !ok && published(8)(n)
	})
}
