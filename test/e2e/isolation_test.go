//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/isolation"
	"github.com/gpushare/gpushare/plugin/manager"
	"github.com/gpushare/gpushare/plugin/mps"
	"github.com/gpushare/gpushare/test/cluster"
	"github.com/gpushare/gpushare/test/fakemps"
)

// tieredPod is a burst pod with its isolation requirement and compute share (0: none).
type tieredPod struct {
	sysPod
	tier    gpushare.Isolation
	percent int
}

func (p tieredPod) object() *corev1.Pod {
	o := p.sysPod.object()
	o.Annotations = map[string]string{}
	if p.tier != "" {
		o.Annotations[gpushare.AnnotationIsolation] = string(p.tier)
	}
	if p.percent > 0 {
		o.Annotations[gpushare.AnnotationComputePercent] = strconv.Itoa(p.percent)
	}
	return o
}

// tierBurst mixes every requirement: pods that need mps, hami-core or none, pods that take any,
// and pods with a compute share (which only mps and hami-core can limit), sizes repeating across
// tiers and shares so the hold-back rule has work to do.
func tierBurst() []tieredPod {
	pod := func(name string, tier gpushare.Isolation, percent int, sizes ...int64) tieredPod {
		return tieredPod{sysPod: sysPod{name: name, sizes: sizes}, tier: tier, percent: percent}
	}
	return []tieredPod{
		pod("mps-a", gpushare.IsolationMPS, 0, 4), pod("mps-b", gpushare.IsolationMPS, 50, 8), pod("mps-c", gpushare.IsolationMPS, 0, 6),
		pod("hami-a", gpushare.IsolationHAMiCore, 30, 4), pod("hami-b", gpushare.IsolationHAMiCore, 30, 4),
		pod("hami-c", gpushare.IsolationHAMiCore, 0, 12), pod("hami-d", gpushare.IsolationHAMiCore, 0, 8, 4),
		pod("none-a", gpushare.IsolationNone, 0, 4), pod("none-b", gpushare.IsolationNone, 0, 8), pod("none-c", gpushare.IsolationNone, 0, 12),
		pod("any-a", "", 0, 4), pod("any-b", gpushare.IsolationAny, 0, 8), pod("any-c", "", 0, 20), pod("any-d", "", 0, 6),
		pod("share-a", "", 25, 10), pod("share-b", gpushare.IsolationAny, 25, 10),
	}
}

// tierBed is a system bed with one node per tier: mps (one H200, our MPS management driving the
// fake control daemon), hami-core (fake library files) and none.
type tierBed struct {
	*systemBed
	mpsPaths, hamiPaths isolation.Config
	controlBin          string
	mpsUUID             string
}

func startTierBed(t *testing.T) *tierBed {
	t.Helper()
	tb := &tierBed{systemBed: startSystem(t)}
	// MPS pipe paths are bounded by the unix socket path limit: a short directory of our own.
	dir, err := os.MkdirTemp("", "gsiso")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if tb.controlBin, err = fakemps.Build(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	// One H200 (140 units): room for the whole burst, so whatever lands there, the pod bound by
	// hand after the fence fits and only the tier can refuse it.
	lib := oneGPU{simulator(t, "simulated:dgxh200")}
	devs, err := lib.Devices()
	if err != nil {
		t.Fatal(err)
	}
	tb.mpsUUID = devs[0].UUID
	tb.mpsPaths = isolation.Config{MPSPipeDir: filepath.Join(dir, "pipe"), MPSShmDir: filepath.Join(dir, "shm")}
	daemon := mps.New(mps.Config{ControlBin: tb.controlBin, PipeDir: tb.mpsPaths.MPSPipeDir, LogDir: filepath.Join(dir, "log"),
		GPUs: []string{tb.mpsUUID}, Lib: lib, Logger: zaptest.NewLogger(t).Named("mps")})
	tb.addNodeWith(t, "tier-mps", lib, func(c *manager.Config) {
		c.Isolation = manager.IsolationConfig{Tier: gpushare.IsolationMPS, Paths: tb.mpsPaths, MPS: daemon, ProbeEvery: 200 * time.Millisecond}
	})
	tb.hamiPaths = hamiFiles(t, dir)
	tb.addNodeWith(t, "tier-hami", simulator(t, "simulated:dgxa100"), func(c *manager.Config) {
		c.Isolation = manager.IsolationConfig{Tier: gpushare.IsolationHAMiCore, Paths: tb.hamiPaths, ProbeEvery: 200 * time.Millisecond}
	})
	tb.addNode(t, "tier-none", "simulated:dgxa100")
	for name, want := range map[string]gpushare.Isolation{"tier-mps": gpushare.IsolationMPS, "tier-hami": gpushare.IsolationHAMiCore, "tier-none": gpushare.IsolationNone} {
		for _, g := range tb.nodes[name].gpus.GPUs {
			if g.Isolation.OrNone() != want || g.IsolationReason != "" {
				t.Fatalf("node %s GPU %d publishes tier %q (%q), want %s", name, g.Index, g.Isolation, g.IsolationReason, want)
			}
		}
	}
	return tb
}

// hamiFiles lays out what a hami-core node has: the library, a preload file naming it where
// containers get it, the lock directory and the cache root.
func hamiFiles(t *testing.T, dir string) isolation.Config {
	t.Helper()
	c := isolation.Config{HAMiLibrary: filepath.Join(dir, "libvgpu.so"), HAMiPreload: filepath.Join(dir, "ld.so.preload"),
		HAMiLockDir: filepath.Join(dir, "vgpulock"), HAMiCacheRoot: filepath.Join(dir, "hami-cache")}
	for _, d := range []string{c.HAMiLockDir, c.HAMiCacheRoot} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for path, data := range map[string]string{c.HAMiLibrary: "not really a library\n", c.HAMiPreload: gpushare.HAMiContainerLibrary + "\n"} {
		if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// TestIsolationTiers: a burst of pods of mixed sizes, tiers and compute shares on three nodes, one
// per tier. Every pod lands on a node whose tier it accepts, every container's checkpoint entry
// carries exactly its signature (tier and share included) and its tier's limits and mounts, and
// the race-free checks of the system test hold. Then the MPS control daemon dies: the node's
// GPU falls back to none in gpushare.io/gpus, a pod that needs mps is not placed, and a pod bound
// there by hand is refused by Allocate rather than run without its limit.
func TestIsolationTiers(t *testing.T) {
	t.Parallel()
	tb := startTierBed(t)
	burst := tierBurst()
	objs := make([]*corev1.Pod, 0, len(burst))
	want := map[string]tieredPod{}
	for _, p := range burst {
		objs = append(objs, p.object())
		want[p.name] = p
	}
	start := time.Now()
	items := tb.waitAllRunning(t, createAll(t, tb.client, objs), 2*waitLong)
	t.Logf("%d pods of mixed tiers Running and recorded in %v", len(items), time.Since(start).Round(time.Millisecond))
	tb.verifySystem(t, items)
	tierOf := map[string]gpushare.Isolation{"tier-mps": gpushare.IsolationMPS, "tier-hami": gpushare.IsolationHAMiCore, "tier-none": gpushare.IsolationNone}
	for _, p := range items {
		w, tier := want[p.Name], tierOf[p.Spec.NodeName]
		req := w.tier
		if req == "" {
			req = gpushare.IsolationAny
		}
		if !tier.Offers(req) || (w.percent > 0 && !tier.Limits()) {
			t.Errorf("pod %s (isolation %q, compute %d%%) runs on %s, tier %s", p.Name, w.tier, w.percent, p.Spec.NodeName, tier)
		}
	}
	tb.checkTierAnswers(t, items)
	tb.fenceMPS(t)
}

// checkTierAnswers checks each container's checkpoint entry for its node's tier: the limit in its
// tier's own variable, the mounts that make the tier work, nothing of another tier.
func (tb *tierBed) checkTierAnswers(t *testing.T, items []corev1.Pod) {
	t.Helper()
	caches := map[string]string{}
	for _, p := range items {
		cp, err := tb.nodes[p.Spec.NodeName].kubelet.Checkpoint()
		if err != nil {
			t.Fatal(err)
		}
		reqs, err := gpushare.ContainerRequests(&p)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range reqs {
			e := findEntry(cp, string(p.UID), r.Name)
			if e == nil {
				t.Errorf("pod %s container %s: no checkpoint entry", p.Name, r.Name)
				continue
			}
			mib := strconv.FormatUint(r.Units*1024, 10)
			for _, problem := range tb.tierProblems(p.Spec.NodeName, e, mib, caches, p.Name+"/"+r.Name) {
				t.Errorf("pod %s container %s on %s: %s", p.Name, r.Name, p.Spec.NodeName, problem)
			}
		}
	}
}

func (tb *tierBed) tierProblems(node string, e *cluster.CheckpointEntry, mib string, caches map[string]string, who string) []string {
	var out []string
	expect := func(key, want string) {
		if got := e.Envs[key]; got != want {
			out = append(out, fmt.Sprintf("%s=%q, want %q", key, got, want))
		}
	}
	absent := func(keys ...string) {
		for _, k := range keys {
			if v, ok := e.Envs[k]; ok {
				out = append(out, fmt.Sprintf("%s=%q set on a node without that tier", k, v))
			}
		}
	}
	switch node {
	case "tier-mps":
		expect(gpushare.EnvIsolation, string(gpushare.IsolationMPS))
		expect(gpushare.EnvMPSPipeDirectory, tb.mpsPaths.MPSPipeDir)
		expect(gpushare.EnvMPSPinnedDeviceMemLimit, "0="+mib+"M")
		expect(gpushare.EnvCUDAVisibleDevices, tb.mpsUUID)
		out = append(out, mountProblems(e.Mounts, map[string]string{tb.mpsPaths.MPSPipeDir: tb.mpsPaths.MPSPipeDir, gpushare.MPSContainerShmDir: tb.mpsPaths.MPSShmDir})...)
		absent(gpushare.EnvHAMiMemoryLimit)
	case "tier-hami":
		expect(gpushare.EnvIsolation, string(gpushare.IsolationHAMiCore))
		expect(gpushare.EnvHAMiMemoryLimit, mib+"m")
		out = append(out, mountProblems(e.Mounts, map[string]string{gpushare.HAMiContainerLibrary: tb.hamiPaths.HAMiLibrary, gpushare.HAMiContainerPreload: tb.hamiPaths.HAMiPreload})...)
		for _, m := range e.Mounts {
			if strings.HasPrefix(m.HostPath, tb.hamiPaths.HAMiCacheRoot+"/") {
				if other, dup := caches[m.HostPath]; dup {
					out = append(out, "shares its HAMi-core cache directory with "+other)
				}
				caches[m.HostPath] = who
			}
		}
		absent(gpushare.EnvMPSPinnedDeviceMemLimit, gpushare.EnvCUDAVisibleDevices)
	default:
		expect(gpushare.EnvIsolation, string(gpushare.IsolationNone))
		absent(gpushare.EnvMPSPinnedDeviceMemLimit, gpushare.EnvCUDAVisibleDevices, gpushare.EnvHAMiMemoryLimit, gpushare.EnvComputePercent)
	}
	return out
}

// mountProblems checks that mounts map each container path of want to its host path.
func mountProblems(mounts []*pluginapi.Mount, want map[string]string) []string {
	var out []string
	for ctr, host := range want {
		i := slices.IndexFunc(mounts, func(m *pluginapi.Mount) bool { return m.ContainerPath == ctr })
		if i < 0 || mounts[i].HostPath != host {
			out = append(out, fmt.Sprintf("no mount of %s at %s (mounts %v)", host, ctr, mounts))
		}
	}
	return out
}

// fenceMPS kills the MPS control daemon (with its binary gone, so the plugin cannot restart it)
// and checks that the node fails closed.
func (tb *tierBed) fenceMPS(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	if err := os.Rename(tb.controlBin, tb.controlBin+".gone"); err != nil {
		t.Fatal(err)
	}
	pid, err := fakemps.ReadPID(tb.mpsPaths.MPSPipeDir)
	if err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	node, err := tb.c.WaitForNode(ctx, "tier-mps", waitLong, "its GPU falls back from mps", func(n *corev1.Node) bool {
		gpus, err := gpushare.DecodeNodeGPUs(n.Annotations[gpushare.AnnotationNodeGPUs])
		return err == nil && len(gpus.GPUs) == 1 && gpus.GPUs[0].Isolation.OrNone() == gpushare.IsolationNone && gpus.GPUs[0].IsolationReason != ""
	})
	if err != nil {
		t.Fatal(err)
	}
	gpus, _ := gpushare.DecodeNodeGPUs(node.Annotations[gpushare.AnnotationNodeGPUs])
	t.Logf("MPS daemon killed: gpushare.io/gpus fell back %v later: %q", time.Since(killed).Round(time.Millisecond), gpus.GPUs[0].IsolationReason)

	// A pod that needs mps has nowhere to go.
	needy := tieredPod{sysPod: sysPod{name: "mps-after", sizes: []int64{2}}, tier: gpushare.IsolationMPS}.object()
	bound := (sysPod{name: "mps-by-hand", sizes: []int64{2}}).object()
	bound.Spec.NodeName = "tier-mps" // bypasses the scheduler: only the plugin can refuse it
	createAll(t, tb.client, []*corev1.Pod{needy, bound})
	p, err := tb.c.WaitForPod(ctx, "default", "mps-after", waitLong, "unschedulable, naming mps", func(p *corev1.Pod) bool {
		return strings.Contains(unschedulable(p), "mps")
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("a pod that needs mps: %s", unschedulable(p))
	// The hand-bound pod is refused at admission, with the reason, never run without its limit.
	p, err = tb.c.WaitForPod(ctx, "default", "mps-by-hand", waitLong, "refused by Allocate", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodRunning
	})
	if err != nil {
		t.Fatal(err)
	}
	if p.Status.Phase != corev1.PodFailed || !strings.Contains(strings.ToLower(p.Status.Message), "mps") {
		t.Errorf("a pod bound by hand to the fenced node: phase %s, %q; want Failed naming the MPS tier", p.Status.Phase, p.Status.Message)
	} else {
		t.Logf("a pod bound by hand: %s", p.Status.Message)
	}
}
