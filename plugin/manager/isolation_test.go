package manager_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/isolation"
	"github.com/gpushare/gpushare/plugin/manager"
	"github.com/gpushare/gpushare/plugin/nvml"
)

// fakeMPS is an MPS control daemon whose health the test toggles.
type fakeMPS struct {
	pipe string

	mu            sync.Mutex
	running       bool
	startErr      error // Start fails with it while set
	starts, stops int
}

func (d *fakeMPS) Start(context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.starts++
	if d.startErr != nil {
		return d.startErr
	}
	d.running = true
	return nil
}

func (d *fakeMPS) Healthy(context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.running {
		return errors.New("fake: the control daemon does not run")
	}
	return nil
}

func (d *fakeMPS) Stop(context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stops++
	d.running = false
	return nil
}

func (d *fakeMPS) PipeDir() string { return d.pipe }

// kill makes the daemon die, and every later start fail with err (nil: succeed).
func (d *fakeMPS) kill(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.running, d.startErr = false, err
}

func (d *fakeMPS) counts() (starts, stops int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.starts, d.stops
}

// tiersOn reports whether every GPU of the node is published with tier and
// a reason containing reason ("" for none).
func tiersOn(tier gpushare.Isolation, reason string) func(*corev1.Node) bool {
	return func(n *corev1.Node) bool {
		d, ok := nodeGPUs(n)
		if !ok || len(d.GPUs) == 0 {
			return false
		}
		for _, g := range d.GPUs {
			if g.Isolation != tier || (reason == "") != (g.IsolationReason == "") || !strings.Contains(g.IsolationReason, reason) {
				return false
			}
		}
		return true
	}
}

// withIsolation annotates p with a required tier and a compute share ("" leaves them out).
func withIsolation(p *corev1.Pod, tier, percent string) *corev1.Pod {
	if tier != "" {
		p.Annotations[gpushare.AnnotationIsolation] = tier
	}
	if percent != "" {
		p.Annotations[gpushare.AnnotationComputePercent] = percent
	}
	return p
}

// stopped ends e's manager and returns what Run returned, leaving it for
// the cleanup of run to find.
func (e *env) stopped(t *testing.T) error {
	t.Helper()
	e.cancel()
	select {
	case err := <-e.errc:
		e.errc <- err
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return after cancel")
		return nil
	}
}

// The mps tier end to end with a fake daemon: the plugin starts it, answers
// with the pinned limit on the GPU's UUID, publishes mps; when the daemon
// dies the node falls back to none within seconds and every Allocate is
// refused at once, naming why; the plugin restarts the daemon (backing off
// while starts fail), and stops it on exit.
func TestMPSTierFailsClosedAndRecovers(t *testing.T) {
	ctx := t.Context()
	root := t.TempDir()
	daemon := &fakeMPS{pipe: filepath.Join(root, "pipe")}
	e := run(t, "simulated:dgxh100", func(c *manager.Config) {
		c.AllocateWait = 10 * time.Second // a refusal must not wait for it
		c.Isolation = manager.IsolationConfig{Tier: gpushare.IsolationMPS, MPS: daemon, ProbeEvery: 100 * time.Millisecond,
			Paths: isolation.Config{MPSPipeDir: daemon.pipe, MPSShmDir: filepath.Join(root, "shm")}}
	})
	e.kubelet.waitRegister(t)
	if starts, _ := daemon.counts(); starts != 1 {
		t.Errorf("%d daemon starts before serving; want 1", starts)
	}
	waitNode(t, e, "published tier mps", tiersOn(gpushare.IsolationMPS, ""))
	gpus, err := e.sim.Devices()
	if err != nil {
		t.Fatal(err)
	}

	c := e.plugin(t)
	if _, err := e.client.CoreV1().Pods("default").Create(ctx, withIsolation(gpuPod("p", 8, 3, 80), "mps", "30"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	resp, err := c.Allocate(ctx, reqOn(0, 8))
	if err != nil {
		t.Fatal(err)
	}
	r := resp.ContainerResponses[0]
	wantEnv := gpushare.ContainerEnv{GPUIndex: 3, PodUnits: 8, ContainerUnits: 8, DevUnits: 80, Isolation: gpushare.IsolationMPS, ComputePercent: 30}
	if got, err := gpushare.ParseContainerEnv(r.Envs); err != nil || got != wantEnv {
		t.Errorf("env reads back as %+v, %v; want %+v", got, err, wantEnv)
	}
	if r.Envs["CUDA_VISIBLE_DEVICES"] != gpus[3].UUID || r.Envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] != "0=8192M" || r.Envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] != "30" ||
		r.Envs["CUDA_MPS_PIPE_DIRECTORY"] != daemon.pipe {
		t.Errorf("MPS variables %v; want GPU 3's UUID %s visible, pinned to 8192M, 30%%, pipe %s", r.Envs, gpus[3].UUID, daemon.pipe)
	}
	if len(r.Mounts) != 2 || r.Mounts[0].HostPath != daemon.pipe || r.Mounts[1].ContainerPath != "/dev/shm" || r.Mounts[1].HostPath != filepath.Join(root, "shm") {
		t.Errorf("mounts %v; want the pipe directory and the daemon's /dev/shm", r.Mounts)
	}
	if rec, err := gpushare.DecodeContainerEnvs(waitAssigned(t, e.client, "p")[gpushare.AnnotationContainerEnv]); err != nil || rec["main"] != wantEnv {
		t.Errorf("record %v, %v; want main: %+v, as answered", rec, err, wantEnv)
	}

	// The daemon dies and cannot be started again for now.
	daemon.kill(errors.New("fake: all CUDA-capable devices are busy"))
	died := time.Now()
	node := waitNode(t, e, "fell back to tier none", tiersOn(gpushare.IsolationNone, "does not answer"))
	if took := time.Since(died); took > 5*time.Second {
		t.Errorf("the node showed the fallback %v after the daemon died; want seconds", took)
	} else {
		t.Logf("the node showed the fallback %v after the daemon died", took)
	}
	if d, _ := nodeGPUs(node); !strings.Contains(d.GPUs[0].IsolationReason, "starting it again failed: fake: all CUDA-capable devices are busy") {
		t.Errorf("published reason %q; want the failed restart's error too", d.GPUs[0].IsolationReason)
	}
	if _, err := e.client.CoreV1().Pods("default").Create(ctx, gpuPod("q", 4, 2, 80), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	_, err = c.Allocate(ctx, reqOn(0, 4))
	if st, _ := status.FromError(err); st.Code() != codes.FailedPrecondition || !strings.Contains(st.Message(), `isolation tier "mps", which is down`) ||
		!strings.Contains(st.Message(), "does not answer") || !strings.Contains(st.Message(), "default/q/main") {
		t.Errorf("Allocate while the daemon is down = %v; want FailedPrecondition naming the tier, why and the container", err)
	}
	if took := time.Since(began); took > 5*time.Second {
		t.Errorf("refused after %v: a refusal must not wait for the 10s allocate-wait", took)
	}
	if starts, _ := daemon.counts(); starts < 2 {
		t.Errorf("%d starts; the plugin must try to start a dead daemon again", starts)
	}

	// Starts work again: the plugin restarts the daemon, the tier is back.
	daemon.kill(nil)
	waitNode(t, e, "published tier mps again", tiersOn(gpushare.IsolationMPS, ""))
	resp, err = c.Allocate(ctx, reqOn(0, 4))
	if err != nil || resp.ContainerResponses[0].Envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] != "0=4096M" ||
		resp.ContainerResponses[0].Envs["CUDA_VISIBLE_DEVICES"] != gpus[2].UUID {
		t.Errorf("Allocate after the restart = %v, %v", resp, err)
	}
	if err := e.stopped(t); err != nil {
		t.Errorf("Run = %v", err)
	}
	if _, stops := daemon.counts(); stops != 1 {
		t.Errorf("%d daemon stops at exit; want 1", stops)
	}
}

// hamiHost lays out an installed HAMi-core under root, leaving the lock and
// cache directories for the plugin to create.
func hamiHost(t *testing.T, root string) isolation.Config {
	t.Helper()
	c := isolation.Config{HAMiLibrary: filepath.Join(root, "libvgpu.so.v2"), HAMiPreload: filepath.Join(root, "ld.so.preload"),
		HAMiLockDir: filepath.Join(root, "vgpulock"), HAMiCacheRoot: filepath.Join(root, "cache")}
	if err := os.WriteFile(c.HAMiLibrary, []byte("\x7fELF fake"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(c.HAMiPreload, []byte(gpushare.HAMiContainerLibrary+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return c
}

// setLabel sets (or with value "" removes) the node's isolation label.
func setLabel(t *testing.T, e *env, value string) {
	t.Helper()
	patch := `{"metadata":{"labels":{"gpushare.io/isolation":null}}}`
	if value != "" {
		patch = `{"metadata":{"labels":{"gpushare.io/isolation":"` + value + `"}}}`
	}
	if _, err := e.client.CoreV1().Nodes().Patch(t.Context(), nodeName, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// The node label overrides the flag, both ways; hami-core answers mount a
// fresh cache directory per answer (two pods of one signature get equal
// answers but for that directory); a missing library, or a label that names
// no tier, fences the node.
func TestHAMiCoreTierByNodeLabel(t *testing.T) {
	ctx := t.Context()
	paths := hamiHost(t, t.TempDir())
	e := run(t, "simulated:dgxh100", func(c *manager.Config) {
		c.AllocateWait = 10 * time.Second
		c.Isolation = manager.IsolationConfig{Paths: paths, ProbeEvery: 100 * time.Millisecond}
	})
	e.kubelet.waitRegister(t)
	waitNode(t, e, "published tier none (the flag's)", tiersOn(gpushare.IsolationNone, ""))
	setLabel(t, e, "hami-core")
	waitNode(t, e, "published tier hami-core (the label's)", tiersOn(gpushare.IsolationHAMiCore, ""))
	for dir, mode := range map[string]os.FileMode{paths.HAMiLockDir: 0o777, paths.HAMiCacheRoot: 0o755} {
		if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != mode {
			t.Errorf("%s: %v, %v; want a directory of mode %v created by the plugin", dir, fi, err, mode)
		}
	}

	c := e.plugin(t)
	var answers []*pluginapi.ContainerAllocateResponse
	for _, name := range []string{"a", "b"} {
		if _, err := e.client.CoreV1().Pods("default").Create(ctx, withIsolation(gpuPod(name, 10, 1, 80), "hami-core", "50"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		resp, err := c.Allocate(ctx, reqOn(0, 10))
		if err != nil {
			t.Fatal(err)
		}
		answers = append(answers, resp.ContainerResponses[0])
	}
	a, b := answers[0], answers[1]
	if a.Envs["CUDA_DEVICE_MEMORY_LIMIT"] != "10240m" || a.Envs["CUDA_DEVICE_SM_LIMIT"] != "50" ||
		a.Envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"] != gpushare.HAMiContainerCacheFile || a.Envs[gpushare.EnvIsolation] != "hami-core" {
		t.Errorf("hami-core variables %v", a.Envs)
	}
	if len(a.Mounts) != 4 || len(b.Mounts) != 4 {
		t.Fatalf("mounts %v and %v; want 4 each", a.Mounts, b.Mounts)
	}
	for i := range 3 { // library, preload file, lock directory: the same for everyone
		if a.Mounts[i].String() != b.Mounts[i].String() {
			t.Errorf("mount %d differs between two answers of one signature: %v, %v", i, a.Mounts[i], b.Mounts[i])
		}
	}
	cacheA, cacheB := a.Mounts[3].HostPath, b.Mounts[3].HostPath
	if cacheA == cacheB || filepath.Dir(cacheA) != paths.HAMiCacheRoot || a.Mounts[3].ContainerPath != gpushare.HAMiContainerCacheDir {
		t.Errorf("cache mounts %v and %v; want two fresh directories under %s", a.Mounts[3], b.Mounts[3], paths.HAMiCacheRoot)
	}
	for _, dir := range []string{cacheA, cacheB} {
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o777 {
			t.Errorf("cache directory %s: %v, %v; want a directory any container user can write", dir, fi, err)
		}
	}

	// The library goes: the node is fenced within seconds.
	if err := os.Remove(paths.HAMiLibrary); err != nil {
		t.Fatal(err)
	}
	waitNode(t, e, "fell back to none for the missing library", tiersOn(gpushare.IsolationNone, "library"))
	if _, err := e.client.CoreV1().Pods("default").Create(ctx, gpuPod("c", 10, 1, 80), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Allocate(ctx, reqOn(0, 10)); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "hami-core") {
		t.Errorf("Allocate without the library = %v; want FailedPrecondition", err)
	}
	// A label naming no tier fences the node too, rather than fall back to the flag.
	setLabel(t, e, "hami")
	waitNode(t, e, "fell back to none for the bad label", tiersOn(gpushare.IsolationNone, `gpushare.io/isolation="hami"`))
	if _, err := c.Allocate(ctx, reqOn(0, 10)); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), `"hami" is not one of`) {
		t.Errorf("Allocate with a bad label = %v; want FailedPrecondition naming it", err)
	}
	// Without the label the flag's tier none serves again.
	setLabel(t, e, "")
	waitNode(t, e, "published the flag's tier none", tiersOn(gpushare.IsolationNone, ""))
	resp, err := c.Allocate(ctx, reqOn(0, 10))
	if err != nil || resp.ContainerResponses[0].Envs[gpushare.EnvIsolation] != "none" || len(resp.ContainerResponses[0].Mounts) != 0 {
		t.Errorf("Allocate on tier none = %v, %v", resp, err)
	}
}

// Clients must be sent to the daemon's own pipe directory, and a node's
// tier is never "any".
func TestNewChecksIsolation(t *testing.T) {
	sim, err := nvml.NewSimulator(nil, "simulated:dgxa100")
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Shutdown()
	base := manager.Config{Node: nodeName, Client: fake.NewClientset(), Library: sim}
	for _, tt := range []struct {
		iso  manager.IsolationConfig
		want string
	}{
		{manager.IsolationConfig{Tier: gpushare.IsolationMPS, MPS: &fakeMPS{pipe: "/run/a"}, Paths: isolation.Config{MPSPipeDir: "/run/b"}}, "pipe directory"},
		{manager.IsolationConfig{Tier: gpushare.IsolationAny}, "not one of none, mps, hami-core"},
		{manager.IsolationConfig{Tier: "cgpu"}, "not one of none, mps, hami-core"},
	} {
		cfg := base
		cfg.Isolation = tt.iso
		if _, err := manager.New(cfg); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("New(%+v) = %v; want an error naming %q", tt.iso, err, tt.want)
		}
	}
	cfg := base
	cfg.Isolation = manager.IsolationConfig{Tier: gpushare.IsolationMPS, MPS: &fakeMPS{pipe: "/run/a"}, Paths: isolation.Config{MPSPipeDir: "/run/a"}}
	if _, err := manager.New(cfg); err != nil {
		t.Errorf("New with matching pipe directories = %v", err)
	}
}
