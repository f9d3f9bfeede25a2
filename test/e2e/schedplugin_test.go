//go:build e2e

package e2e

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/test/cluster"
	"github.com/gpushare/gpushare/test/localcluster/manifests"
)

// startPluginSystem is startSystem with gpushare-scheduler (kube-scheduler with the GPUShare
// plugin, configured as manifests/scheduler-plugin ships it) as the cluster's scheduler instead of
// kube-scheduler calling the extender. The extender
// still runs, uncalled, so the tests read its /inspect view of what the plugin placed.
func startPluginSystem(t testing.TB) *systemBed {
	t.Helper()
	cfg, dir := pluginScheduler(t)
	return startSystemWith(t, func(string) cluster.SchedulerConfig { return cfg },
		func(c *cluster.Cluster) { grantPluginRole(t, c, dir) })
}

// pluginScheduler builds gpushare-scheduler and returns its configuration on the bed (the shipped
// profile of manifests/scheduler-plugin under the default scheduler's name, client QPS 500) and
// the manifests' folder, for grantPluginRole.
func pluginScheduler(t testing.TB) (cluster.SchedulerConfig, string) {
	t.Helper()
	bin, err := cluster.BuildGPUShareScheduler(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	dir, err := manifests.Dir()
	if err != nil {
		t.Fatal(err)
	}
	profiles, err := manifests.PluginSchedulerProfiles(dir, corev1.DefaultSchedulerName)
	if err != nil {
		t.Fatal(err)
	}
	return cluster.SchedulerConfig{ClientQPS: 500, ClientBurst: 1000, Binary: bin, Profiles: profiles}, dir
}

// grantPluginRole gives the bed's scheduler user the one right the shipped manifests add to
// system:kube-scheduler for the plugin (its Role, bound to the user the bed's scheduler runs as).
func grantPluginRole(t testing.TB, c *cluster.Cluster, dir string) {
	t.Helper()
	objs, err := manifests.Load(filepath.Join(dir, manifests.PluginSchedulerDir))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.GetKind() != "Role" || o.GetName() != "gpushare-scheduler-unhealthy-gpus" {
			continue
		}
		var role rbacv1.Role
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &role); err != nil {
			t.Fatal(err)
		}
		ctx := t.Context()
		if _, err := c.Client().RbacV1().Roles(role.Namespace).Create(ctx, &role, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		rb := &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: role.Name, Namespace: role.Namespace},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "system:kube-scheduler"}},
		}
		if _, err := c.Client().RbacV1().RoleBindings(role.Namespace).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatalf("%s has no Role gpushare-scheduler-unhealthy-gpus", manifests.PluginSchedulerDir)
}

// TestPluginModeBurst is TestSystemBurst with the plugin in the scheduler: the same burst on one
// node of 8 H200s, every container's checkpoint env equal to its annotations, every GPU's total
// the same in annotations, checkpoints, inspector and the extender's view, and the hold-back rule
// exercised (the scheduler's events name the pods waited for).
func TestPluginModeBurst(t *testing.T) {
	t.Parallel()
	b := startPluginSystem(t)
	b.addNode(t, "h200", "simulated:dgxh200")
	specs := h200Burst()
	began := time.Now()
	pods := b.createBurst(t, specs)
	items := b.waitAllRunning(t, pods, systemWait)
	t.Logf("plugin mode: %d pods (%d GPU containers) created at once: all Running after %v", len(pods), containerCount(specs), time.Since(began).Round(time.Millisecond))
	v := b.verifySystem(t, items)
	checkSpread(t, v)
	if n := b.holdBacks(t); n == 0 {
		t.Error("the scheduler reported no hold-back: the burst did not exercise the race-free rule")
	} else {
		t.Logf("the scheduler reported %d hold-backs by the plugin's race-free rule", n)
	}
	b.compareViews(t, v)
}

// placementStream is a pod stream of one-, two- and four-GPU pods of repeated sizes (480 of 640
// units), created one at a time on one node of NVLink islands: its placements depend only on the
// policy and the order. One node, because kube-scheduler breaks ties between equally scored nodes
// at random in either mode.
func placementStream() []multiPod {
	var out []multiPod
	sizes := []struct {
		units int64
		count int
	}{{8, 0}, {16, 2}, {24, 0}, {32, 4}, {8, 0}, {40, 2}, {12, 0}, {64, 4}, {20, 0}, {16, 2}}
	for i := range 2 {
		for j, s := range sizes {
			out = append(out, multiPod{sysPod: sysPod{name: fmt.Sprintf("st-%d-%02d", i, j), sizes: []int64{s.units}}, count: s.count})
		}
	}
	return out
}

// runStream creates the stream's pods one at a time, each once the previous runs, and returns
// each pod's GPUs.
func (b *systemBed) runStream(t *testing.T, stream []multiPod) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, p := range stream {
		createAll(t, b.client, []*corev1.Pod{p.object()})
		got := b.waitAllRunning(t, map[string]*corev1.Pod{p.name: nil}, waitLong)[0]
		asg, _, err := gpushare.DecodePodAssignment(got.Annotations)
		if err != nil {
			t.Fatal(err)
		}
		set, err := asg.SetFor(gpushare.ContainerRequest{Name: "c0", Units: uint64(p.sizes[0])})
		if err != nil {
			t.Fatal(err)
		}
		out[p.name] = set.String()
	}
	return out
}

// TestModesPlaceAlike replays one pod stream through kube-scheduler with the extender and
// through gpushare-scheduler, each on a fresh node of the same machine: every pod gets the same
// GPUs in both modes.
func TestModesPlaceAlike(t *testing.T) {
	t.Parallel()
	stream := placementStream()
	got := map[string]map[string]string{}
	for _, mode := range []struct {
		name  string
		start func(testing.TB) *systemBed
	}{{"extender", startSystem}, {"plugin", startPluginSystem}} {
		t.Run(mode.name, func(t *testing.T) {
			b := mode.start(t)
			b.addNode(t, "alike", "simulated:dgxh100:topology=islands")
			got[mode.name] = b.runStream(t, stream)
		})
	}
	same := 0
	for _, p := range stream {
		if got["extender"][p.name] != got["plugin"][p.name] {
			t.Errorf("pod %s: GPUs %s in extender mode, %s in plugin mode", p.name, got["extender"][p.name], got["plugin"][p.name])
		} else {
			same++
		}
	}
	t.Logf("%d of %d pods placed alike in both modes", same, len(stream))
}
