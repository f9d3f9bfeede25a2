//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gpushare/gpushare/plugin/dra/slice"
	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/test/cluster"
	"github.com/gpushare/gpushare/webhook/translate"
)

// throughputDRANamespace is the namespace the webhook serves in BenchmarkSchedulingThroughput's
// dra-webhook rounds.
const throughputDRANamespace = "gpushare-dra"

// draThroughput is BenchmarkSchedulingThroughput's DRA side on the same nodes: each node's
// ResourceSlice as our driver publishes it (8 × 80 GiB), the DeviceClass, the template the
// webhook makes for a pod of 4 GiB, and the webhook for the rounds that translate.
type draThroughput struct {
	c        *cluster.Cluster
	template string
	web      *draWebhook
}

// setupDRAThroughput publishes the nodes' slices (as the cluster's admin: no kubelet runs here,
// and the scheduler reads only the slices), applies manifests/dra's DeviceClass and RBAC, makes
// the 4 GiB template in default, opts throughputDRANamespace in and starts the webhook, then stops
// it until its rounds.
func setupDRAThroughput(b *testing.B, c *cluster.Cluster, nodes []cluster.NodeSpec) *draThroughput {
	ctx := context.Background()
	applyDRAObjects(b, c)
	for i, n := range nodes {
		if err := publishBenchSlice(ctx, c, n.Name, i); err != nil {
			b.Fatal(err)
		}
	}
	shape := translate.Shape{MiB: []uint64{4096}, Count: 1, Isolation: gpushare.IsolationAny}
	if _, err := c.Client().ResourceV1().ResourceClaimTemplates("default").Create(ctx, shape.Template("default"), metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: throughputDRANamespace,
		Labels: map[string]string{gpushare.LabelNamespaceDRA: gpushare.LabelValueDRA}}}
	if _, err := c.Client().CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	d := &draThroughput{c: c, template: shape.Name(), web: startWebhook(b, c, nodes[0].Name)}
	d.web.waitServing(b, c, throughputDRANamespace)
	d.web.prog.Stop(10 * time.Second)
	return d
}

// publishBenchSlice writes node's ResourceSlice of eight simulated H100 80GB, built by the
// driver's own slice package.
func publishBenchSlice(ctx context.Context, c *cluster.Cluster, node string, n int) error {
	gpus := make([]slice.GPU, 8)
	for i := range gpus {
		gpus[i] = slice.GPU{Index: i, UUID: fmt.Sprintf("GPU-%08x-0000-4000-8000-%012x", n, i), Model: "NVIDIA H100 80GB HBM3",
			MemoryMiB: 81920, NUMANode: -1, NVLinkDomain: "bench-" + strconv.Itoa(n), Tier: gpushare.IsolationNone, Simulated: true}
	}
	devices, err := slice.Devices(gpus, gpushare.GiB)
	if err != nil {
		return err
	}
	s := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: node + "-" + "gpu-mem"},
		Spec: resourceapi.ResourceSliceSpec{Driver: gpushare.DRADriverName, NodeName: ptr.To(node), Devices: devices,
			Pool: resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1}}}
	_, err = c.Client().ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{})
	return err
}

// claimPodOf is a pod of one container holding the claim made from template, in default.
func (d *draThroughput) claimPodOf(name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{
			ResourceClaims: []corev1.PodResourceClaim{{Name: gpushare.DRAPodClaimName, ResourceClaimTemplateName: ptr.To(d.template)}},
			Containers: []corev1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10",
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: gpushare.DRAPodClaimName, Request: translate.Request(0)}}}}},
		},
	}
}

// webhookPodOf is the extender rounds' pod (4 GiB of aliyun.com/gpu-mem), in the namespace the
// webhook serves.
func webhookPodOf(name string) *corev1.Pod {
	p := throughputPod(name)
	p.Namespace = throughputDRANamespace
	return p
}

// rounds runs, with kube-controller-manager (its ResourceClaim controller makes the claims)
// running for them only: a round of claim-template pods and one of pods through the webhook with
// the controller manager's default client limits (--kube-api-qps 20, burst 30, per controller), then
// a round of claim-template pods with the controller manager at the scheduler's own limits
// (dra-kcm-qps), which shows what the default limits cost. Each round's rate and CPU per pod are
// recorded as round does.
func (d *draThroughput) rounds(b *testing.B, cfg, scored cluster.SchedulerConfig, i int, record func(config string, rate float64, perPod map[string]float64)) {
	d.startControllerManager(b)
	rate, perPod := burstRateOf(b, d.c, cfg, fmt.Sprintf("dra-%d", i), d.claimPodOf, draProfileWindow)
	record("dra", rate, perPod)
	d.waitClaimsGone(b, "default")
	b.StopTimer()
	if err := d.web.prog.Start(); err != nil {
		b.Fatal(err)
	}
	d.web.waitServing(b, d.c, throughputDRANamespace)
	b.StartTimer()
	rate, perPod = burstRateOf(b, d.c, cfg, fmt.Sprintf("web-%d", i), webhookPodOf, draProfileWindow)
	record("dra-webhook", rate, perPod)
	d.waitClaimsGone(b, throughputDRANamespace)
	b.StopTimer()
	d.web.prog.Stop(10 * time.Second)
	b.StartTimer()
	d.startControllerManager(b, fmt.Sprintf("--kube-api-qps=%g", cfg.ClientQPS), fmt.Sprintf("--kube-api-burst=%d", cfg.ClientBurst))
	rate, perPod = burstRateOf(b, d.c, cfg, fmt.Sprintf("dra-kcm-%d", i), d.claimPodOf, draProfileWindow)
	record("dra-kcm-qps", rate, perPod)
	d.waitClaimsGone(b, "default")
	// The same with gpushare-scheduler, whose DRA score rates every node for each claim.
	rate, perPod = burstRateOf(b, d.c, scored, fmt.Sprintf("dra-scored-%d", i), d.claimPodOf, draProfileWindow)
	record("dra-scored", rate, perPod)
	d.waitClaimsGone(b, "default")
	b.StopTimer()
	d.c.StopControllerManager()
	b.StartTimer()
}

// draProfileWindow is how long a DRA round's scheduler profile runs (-throughput-profile).
const draProfileWindow = 6 * time.Second

// startControllerManager (re)starts kube-controller-manager with extra flags, off the clock.
func (d *draThroughput) startControllerManager(b *testing.B, extra ...string) {
	b.StopTimer()
	defer b.StartTimer()
	if err := d.c.StartControllerManager(context.Background(), extra...); err != nil {
		b.Fatal(err)
	}
}

// waitClaimsGone waits until the controller manager removed the claims of the round's deleted
// pods, so the next round starts on empty GPUs.
func (d *draThroughput) waitClaimsGone(b *testing.B, ns string) {
	b.StopTimer()
	defer b.StartTimer()
	if err := cluster.Poll(context.Background(), 2*time.Minute, "claims of "+ns+" deleted", func(ctx context.Context) (bool, error) {
		list, err := d.c.Client().ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
		return err == nil && len(list.Items) == 0, err
	}); err != nil {
		b.Fatal(err)
	}
}

// waitServing waits until the webhook admits a gpu-mem pod in ns (a dry run: nothing is made), so
// a round starts with it answering.
func (w *draWebhook) waitServing(t testing.TB, c *cluster.Cluster, ns string) {
	t.Helper()
	probe := throughputPod("probe")
	probe.Namespace = ns
	if err := cluster.Poll(context.Background(), time.Minute, "the webhook serving", func(ctx context.Context) (bool, error) {
		if !w.prog.Running() {
			return false, fmt.Errorf("the webhook exited:\n%s", w.prog.LogTail(20))
		}
		_, err := c.Client().CoreV1().Pods(ns).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil, nil
	}); err != nil {
		t.Fatal(err)
	}
}
