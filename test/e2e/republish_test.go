//go:build e2e

package e2e

import (
	"context"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/nvml"
	"github.com/gpushare/gpushare/test/cluster"
)

// nodePublished is a WaitForNode condition: the node shows gpus GPUs in
// status aliyun.com/gpu-count (capacity and allocatable) and in its
// gpushare.io/gpus description, and units of aliyun.com/gpu-mem.
func nodePublished(gpus, units int64) func(*corev1.Node) bool {
	return func(n *corev1.Node) bool {
		c, okC := n.Status.Capacity[gpushare.ResourceCount]
		a, okA := n.Status.Allocatable[gpushare.ResourceCount]
		desc, err := gpushare.DecodeNodeGPUs(n.Annotations[gpushare.AnnotationNodeGPUs])
		return okC && okA && c.Value() == gpus && a.Value() == gpus && err == nil && int64(len(desc.GPUs)) == gpus &&
			cluster.Allocatable(gpushare.ResourceName, units)(n)
	}
}

// wipeNode removes the plugin's GPU count from the node's status and its
// annotations, as a kubelet resetting extended resources or a re-created
// Node object would, and returns the node as the last write stored it.
func wipeNode(ctx context.Context, client kubernetes.Interface, name string) (*corev1.Node, error) {
	nodes := client.CoreV1().Nodes()
	var wiped *corev1.Node
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := nodes.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		delete(n.Annotations, gpushare.AnnotationNodeGPUs)
		delete(n.Annotations, gpushare.AnnotationSkippedGPUs)
		if n, err = nodes.Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			return err
		}
		delete(n.Status.Capacity, gpushare.ResourceCount)
		delete(n.Status.Allocatable, gpushare.ResourceCount)
		wiped, err = nodes.UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
	return wiped, err
}

// The node's aliyun.com/gpu-count and gpushare.io/gpus are wiped, the
// kubelet restarts: the plugin registers again and both come back, without
// restarting the plugin.
func TestPluginRepublishesNodeAfterKubeletRestart(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	c, kubelet, sim, devUnits := gpuNode(t, "simulated:dgxa100")
	units := int64(8 * devUnits)
	p := startPlugin(t, c.Client(), kubelet, sim, 10*time.Second)
	p.waitRegistered(t)
	if _, err := c.WaitForNode(ctx, kubelet.Name(), waitLong, "is published", nodePublished(8, units)); err != nil {
		t.Fatal(err)
	}

	kubelet.Stop()
	// The node as the wipe stored it, not a later read: the plugin's own
	// watch of its Node may republish it at any moment after the wipe.
	n, err := wipeNode(ctx, c.Client(), kubelet.Name())
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := n.Annotations[gpushare.AnnotationNodeGPUs]; ok || nodePublished(8, units)(n) {
		t.Fatal("the wipe left the node published; the test proves nothing")
	}
	restarted := time.Now()
	if err := kubelet.Start(ctx); err != nil {
		t.Fatal(err)
	}
	registered := p.waitRegistered(t)
	if _, err := c.WaitForNode(ctx, kubelet.Name(), waitLong, "has its GPU count and description back", nodePublished(8, units)); err != nil {
		t.Fatal(err)
	}
	t.Logf("kubelet restart: registered again %v and node published %v after the restart began",
		registered.Sub(restarted), time.Since(restarted))
}

// A GPU in MIG mode is not advertised, not counted, and the node names it.
func TestPluginSkipsMIGGPU(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	c := cluster.StartT(t, cluster.Config{NoScheduler: true})
	kubelet, err := c.AddKubelet(ctx, "mig-0", cluster.KubeletOptions{Labels: map[string]string{gpushare.LabelGPUShare: gpushare.LabelValueTrue}})
	if err != nil {
		t.Fatal(err)
	}
	sim := simulator(t, "simulated:mixed:mig=1")
	gpus, err := sim.Devices()
	if err != nil {
		t.Fatal(err)
	}
	var units int64
	for _, g := range gpus {
		units += int64(g.MemoryMiB / 1024)
	}
	p := startPlugin(t, c.Client(), kubelet, sim, 10*time.Second)
	p.waitRegistered(t)
	node, err := c.WaitForNode(ctx, kubelet.Name(), waitLong, "advertises the three GPUs not in MIG mode and names the fourth",
		func(n *corev1.Node) bool {
			_, ok := n.Annotations[gpushare.AnnotationSkippedGPUs]
			return ok && nodePublished(3, units)(n)
		})
	if err != nil {
		t.Fatal(err)
	}
	desc, _ := gpushare.DecodeNodeGPUs(node.Annotations[gpushare.AnnotationNodeGPUs])
	var indices []int
	for _, g := range desc.GPUs {
		indices = append(indices, g.Index)
	}
	if !slices.Equal(indices, []int{0, 2, 3}) {
		t.Errorf("gpushare.io/gpus has GPUs %v; want 0, 2, 3", indices)
	}
	skipped, err := gpushare.DecodeSkippedGPUs(node.Annotations[gpushare.AnnotationSkippedGPUs])
	want := sim.Skipped()
	if err != nil || len(skipped) != 1 || len(want) != 1 || skipped[0].Index != 1 || skipped[0].UUID != want[0].UUID || skipped[0].Reason != nvml.ReasonMIG {
		t.Errorf("gpushare.io/skipped-gpus = %+v, %v; want GPU 1 (%+v) for MIG", skipped, err, want)
	}
}
