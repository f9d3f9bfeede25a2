//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/manager"
	"github.com/gpushare/gpushare/plugin/nvml"
	"github.com/gpushare/gpushare/test/cluster"
)

// runningPlugin is our device plugin's manager running in-process against a hollow kubelet.
type runningPlugin struct {
	cancel     context.CancelFunc
	errc       chan error
	registered chan time.Time
	lib        nvml.Library
}

// gpuNode starts a control plane without a scheduler and one hollow kubelet "gpu-0" labelled for
// gpushare, and a simulator of backend for its plugin; devUnits is the size of its first GPU in GiB.
func gpuNode(t *testing.T, backend string) (*cluster.Cluster, *cluster.Kubelet, *nvml.Simulator, uint64) {
	t.Helper()
	c := cluster.StartT(t, cluster.Config{NoScheduler: true})
	kubelet, err := c.AddKubelet(t.Context(), "gpu-0", cluster.KubeletOptions{Labels: map[string]string{gpushare.LabelGPUShare: gpushare.LabelValueTrue}})
	if err != nil {
		t.Fatal(err)
	}
	sim := simulator(t, backend)
	gpus, err := sim.Devices()
	if err != nil {
		t.Fatal(err)
	}
	return c, kubelet, sim, gpus[0].MemoryMiB / 1024
}

// startPlugin runs the manager with lib against kubelet until stop or the test's end.
func startPlugin(t *testing.T, client kubernetes.Interface, kubelet *cluster.Kubelet, lib nvml.Library, wait time.Duration) *runningPlugin {
	t.Helper()
	return startPluginWith(t, client, kubelet, lib, wait, nil)
}

// startPluginWith is startPlugin with the manager's configuration changed by mutate (nil: none).
func startPluginWith(t testing.TB, client kubernetes.Interface, kubelet *cluster.Kubelet, lib nvml.Library, wait time.Duration, mutate func(*manager.Config)) *runningPlugin {
	t.Helper()
	p := &runningPlugin{errc: make(chan error, 1), registered: make(chan time.Time, 100), lib: lib}
	cfg := manager.Config{
		Node: kubelet.Name(), Client: client, Library: lib, DevicePluginDir: kubelet.DevicePluginDir(),
		PodResourcesSocket: kubelet.PodResourcesSocket(),
		HealthCheck:        true, AllocateWait: wait, Logger: zaptest.NewLogger(t).Named(kubelet.Name()),
		Health:       nvml.HealthOptions{WaitTimeout: 100 * time.Millisecond},
		OnRegistered: func() { p.registered <- time.Now() },
	}
	if mutate != nil {
		mutate(&cfg)
	}
	m, err := manager.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	go func() { p.errc <- m.Run(ctx) }()
	t.Cleanup(func() { p.stop(t) })
	return p
}

// stop ends the manager and waits for it; repeated calls are no-ops.
func (p *runningPlugin) stop(t testing.TB) {
	t.Helper()
	if p.cancel == nil {
		return
	}
	p.cancel()
	p.cancel = nil
	select {
	case err := <-p.errc:
		if err != nil {
			t.Errorf("plugin Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Error("plugin did not stop")
	}
}

// waitRegistered returns when the plugin next registers with the kubelet.
func (p *runningPlugin) waitRegistered(t testing.TB) time.Time {
	t.Helper()
	select {
	case at := <-p.registered:
		return at
	case err := <-p.errc:
		t.Fatalf("plugin stopped: %v", err)
	case <-time.After(waitLong):
		t.Fatal("plugin did not register")
	}
	return time.Time{}
}

func simulator(t testing.TB, backend string) *nvml.Simulator {
	t.Helper()
	sim, err := nvml.NewSimulator(zaptest.NewLogger(t), backend)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Shutdown() })
	return sim
}

// oneGPU shows only a simulated machine's first GPU: no simulated backend has a single GPU.
type oneGPU struct{ nvml.Library }

func (o oneGPU) Devices() ([]nvml.GPU, error) {
	gpus, err := o.Library.Devices()
	if err != nil {
		return nil, err
	}
	return gpus[:1], nil
}

// podSpec describes one test pod: container sizes and, for each, its GPU.
type podSpec struct {
	name   string
	sizes  []int64 // regular containers c0, c1, ...
	gpus   []int   // GPU of each regular container
	init   int64   // units of a sidecar init container "setup" (0: none); it runs on gpus[0]
	noAnno bool    // leave the extender's annotations off
	set    []int   // a multi-GPU pod's GPUs, ascending: every container splits its units over them (gpus unused)
}

// object builds the pod bound to node with the annotations the extender writes at bind.
func (s podSpec) object(node string, devUnits uint64, assume time.Time) *corev1.Pod {
	limits := func(u int64) corev1.ResourceRequirements {
		return corev1.ResourceRequirements{Limits: corev1.ResourceList{gpushare.ResourceName: *resource.NewQuantity(u, resource.DecimalSI)}}
	}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: "default"},
		Spec:       corev1.PodSpec{NodeName: node},
	}
	if s.init > 0 {
		// A sidecar: the fake runtime never finishes a plain init container.
		always := corev1.ContainerRestartPolicyAlways
		p.Spec.InitContainers = []corev1.Container{{Name: "setup", Image: "registry.k8s.io/pause:3.10", Resources: limits(s.init), RestartPolicy: &always}}
	}
	alloc := gpushare.Allocation{}
	for i, u := range s.sizes {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: fmt.Sprintf("c%d", i), Image: "registry.k8s.io/pause:3.10", Resources: limits(u)})
		if len(s.set) > 0 {
			alloc[i] = gpushare.GPUUnits{}
			for _, g := range s.set {
				alloc[i][g] = uint64(u) / uint64(len(s.set))
			}
			continue
		}
		alloc[i] = gpushare.GPUUnits{s.gpus[i]: uint64(u)}
	}
	if s.noAnno {
		return p
	}
	reqs, err := gpushare.ContainerRequests(p)
	if err != nil {
		panic(err)
	}
	first := append(slices.Clone(s.set), s.gpus...)[0]
	a := gpushare.PodAssignment{GPUIndex: first, PodUnits: gpushare.PodUnits(reqs), DevUnits: devUnits,
		AssumeTime: assume.UnixNano(), Allocation: alloc}
	ann, err := a.Encode()
	if err != nil {
		panic(err)
	}
	p.Annotations = ann
	return p
}

// createAll creates the pods at once, as a burst of binds would.
func createAll(t testing.TB, client kubernetes.Interface, pods []*corev1.Pod) map[string]*corev1.Pod {
	t.Helper()
	var mu sync.Mutex
	out := map[string]*corev1.Pod{}
	var wg sync.WaitGroup
	errs := make(chan error, len(pods))
	for _, p := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			created, err := client.CoreV1().Pods("default").Create(context.Background(), p, metav1.CreateOptions{})
			if err != nil {
				errs <- err
				return
			}
			mu.Lock()
			out[created.Name] = created
			mu.Unlock()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return out
}

// waitRunning waits for every pod to run.
func waitRunning(t *testing.T, c *cluster.Cluster, pods map[string]*corev1.Pod) {
	t.Helper()
	for _, name := range slices.Sorted(maps.Keys(pods)) {
		if _, err := c.WaitForPod(t.Context(), "default", name, 2*waitLong, "running with the plugin's record", runningAndRecorded); err != nil {
			t.Fatal(err)
		}
	}
}

// checkEnvs proves, from the kubelet's checkpoint, that every GPU container of pods got exactly
// the GPU and limits its pod's annotations name, and as many device IDs as it asked for
// (envMismatches), that no GPU runs more than it has (checkpointOvercommit: TestNegativeControl
// shows both checks fail when the rules are off); and that the pod carries our record of it and
// ASSIGNED=true. It returns the device IDs per pod/container.
func checkEnvs(t *testing.T, client kubernetes.Interface, kubelet *cluster.Kubelet, pods map[string]*corev1.Pod, devUnits uint64) map[string][]string {
	t.Helper()
	cp, err := kubelet.Checkpoint()
	if err != nil {
		t.Fatal(err)
	}
	devices := map[string][]string{}
	var live []*corev1.Pod
	for _, name := range slices.Sorted(maps.Keys(pods)) {
		pod, err := client.CoreV1().Pods("default").Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		live = append(live, pod)
		for _, m := range envMismatches(cp, pod, devUnits) {
			t.Error(m)
		}
		asg, _, _ := gpushare.DecodePodAssignment(pod.Annotations)
		if !asg.Assigned {
			t.Errorf("pod %s: %s is not true", name, gpushare.AnnotationAssigned)
		}
		record, err := gpushare.DecodeContainerEnvs(pod.Annotations[gpushare.AnnotationContainerEnv])
		if err != nil {
			t.Errorf("pod %s: container-env record: %v", name, err)
		}
		reqs, _ := gpushare.ContainerRequests(pod)
		for _, r := range reqs {
			entry := findEntry(cp, string(pod.UID), r.Name)
			if entry == nil {
				continue // reported by envMismatches
			}
			if got, err := gpushare.ParseContainerEnv(entry.Envs); err == nil && record[r.Name] != got {
				t.Errorf("pod %s container %s: recorded env %+v; the checkpoint's %+v", name, r.Name, record[r.Name], got)
			}
			devices[name+"/"+r.Name] = entry.DeviceIDs
		}
	}
	for _, o := range checkpointOvercommit(cp, live, devUnits) {
		t.Error(o)
	}
	return devices
}

// waitCapacity waits until the node advertises units of gpu-mem and returns when it saw that.
func waitCapacity(t *testing.T, c *cluster.Cluster, node string, units int64) time.Time {
	t.Helper()
	if _, err := c.WaitForNode(t.Context(), node, waitLong, "advertises our devices", cluster.Allocatable(gpushare.ResourceName, units)); err != nil {
		t.Fatal(err)
	}
	return time.Now()
}

// Many pods of three sizes, created at once on one node with 8 GPUs, plus multi-container pods
// (split across GPUs, on one GPU, with an init container): all run, and the kubelet's checkpoint
// shows every container with exactly the GPU its pod's annotations name. The annotations obey the
// extender's rule: among in-flight pods, equal container sizes have equal signatures.
func TestPluginManyPodsRaceFree(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	c, kubelet, sim, devUnits := gpuNode(t, "simulated:dgxh100")
	p := startPlugin(t, c.Client(), kubelet, sim, 10*time.Second)
	p.waitRegistered(t)
	waitCapacity(t, c, kubelet.Name(), int64(8*devUnits))
	node, err := c.Client().CoreV1().Nodes().Get(ctx, kubelet.Name(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if q := node.Status.Capacity[gpushare.ResourceCount]; q.Value() != 8 {
		t.Errorf("node capacity %s = %s; want 8", gpushare.ResourceCount, q.String())
	}
	if desc, err := gpushare.DecodeNodeGPUs(node.Annotations[gpushare.AnnotationNodeGPUs]); err != nil || len(desc.GPUs) != 8 || !desc.Simulated {
		t.Errorf("node GPU description %+v, %v", desc, err)
	}

	var specs []podSpec
	for i := range 19 {
		specs = append(specs, podSpec{name: fmt.Sprintf("s4-%02d", i), sizes: []int64{4}, gpus: []int{0}})
	}
	for i := range 9 {
		specs = append(specs, podSpec{name: fmt.Sprintf("s8-%02d", i), sizes: []int64{8}, gpus: []int{1}})
	}
	for i := range 6 {
		specs = append(specs, podSpec{name: fmt.Sprintf("s12-%02d", i), sizes: []int64{12}, gpus: []int{2}})
	}
	for i := range 4 {
		specs = append(specs, podSpec{name: fmt.Sprintf("split-%02d", i), sizes: []int64{2, 3}, gpus: []int{3, 4}})
	}
	for i := range 3 {
		specs = append(specs, podSpec{name: fmt.Sprintf("pair-%02d", i), sizes: []int64{5, 6}, gpus: []int{5, 5}})
	}
	for i := range 2 {
		specs = append(specs, podSpec{name: fmt.Sprintf("init-%02d", i), sizes: []int64{7}, gpus: []int{6}, init: 1})
	}
	var objs []*corev1.Pod
	now := time.Now()
	for i, s := range specs {
		objs = append(objs, s.object(kubelet.Name(), devUnits, now.Add(time.Duration(i)*time.Millisecond)))
	}
	began := time.Now()
	pods := createAll(t, c.Client(), objs)
	waitRunning(t, c, pods)
	t.Logf("%d pods (%d GPU containers) created at once ran after %v", len(pods), countContainers(specs), time.Since(began))
	checkEnvs(t, c.Client(), kubelet, pods, devUnits)
}

func countContainers(specs []podSpec) int {
	n := 0
	for _, s := range specs {
		n += len(s.sizes)
		if s.init > 0 {
			n++
		}
	}
	return n
}

// A kubelet restart mid-way: the plugin notices kubelet.sock re-created and registers again
// (timed), capacity comes back, running pods keep their devices, and the rest still start. Then a
// plugin restart: nothing is lost and new pods still start right.
func TestPluginKubeletAndPluginRestart(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	c, kubelet, sim, devUnits := gpuNode(t, "simulated:dgxa100")
	total := int64(8 * devUnits)
	p := startPlugin(t, c.Client(), kubelet, sim, 10*time.Second)
	p.waitRegistered(t)
	waitCapacity(t, c, kubelet.Name(), total)

	// Each wave puts sizes 2, 4 and 6 on GPUs base+1..base+3 (18 units of 40 on the fullest); the
	// third wave shares the first's GPUs, which then hold 36 units at most: within their size, or
	// the plugin would rightly refuse the surplus.
	wave := func(prefix string, n, base int) map[string]*corev1.Pod {
		var objs []*corev1.Pod
		for i := range n {
			size := []int64{2, 4, 6}[i%3]
			s := podSpec{name: fmt.Sprintf("%s-%02d", prefix, i), sizes: []int64{size}, gpus: []int{base + int(size/2)}}
			objs = append(objs, s.object(kubelet.Name(), devUnits, time.Now()))
		}
		return createAll(t, c.Client(), objs)
	}
	first := wave("before", 9, 0)
	waitRunning(t, c, first)
	held := checkEnvs(t, c.Client(), kubelet, first, devUnits)

	restarted := time.Now()
	if err := kubelet.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	registered := p.waitRegistered(t)
	back := waitCapacity(t, c, kubelet.Name(), total)
	t.Logf("kubelet restart: plugin registered again %v after the restart began, capacity back after %v",
		registered.Sub(restarted), back.Sub(restarted))

	second := wave("after-kubelet", 9, 4)
	waitRunning(t, c, second)
	checkEnvs(t, c.Client(), kubelet, second, devUnits)
	again := checkEnvs(t, c.Client(), kubelet, first, devUnits)
	for k, ids := range held {
		if !slices.Equal(again[k], ids) {
			t.Errorf("%s held %v before the kubelet restart and %v after", k, ids, again[k])
		}
	}
	assertRunning(t, c.Client(), first)

	// Plugin restart: a new process with a fresh NVML view.
	p.stop(t)
	if _, err := c.WaitForNode(ctx, kubelet.Name(), waitLong, "drops capacity without the plugin",
		cluster.Allocatable(gpushare.ResourceName, 0)); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	p2 := startPlugin(t, c.Client(), kubelet, simulator(t, "simulated:dgxa100"), 10*time.Second)
	reg2 := p2.waitRegistered(t)
	waitCapacity(t, c, kubelet.Name(), total)
	t.Logf("plugin restart: registered %v after starting", reg2.Sub(stopped))
	third := wave("after-plugin", 9, 0)
	waitRunning(t, c, third)
	checkEnvs(t, c.Client(), kubelet, third, devUnits)
	final := checkEnvs(t, c.Client(), kubelet, first, devUnits)
	for k, ids := range held {
		if !slices.Equal(final[k], ids) {
			t.Errorf("%s held %v at first and %v after the plugin restart", k, ids, final[k])
		}
	}
	assertRunning(t, c.Client(), first)
	assertRunning(t, c.Client(), second)
}

func assertRunning(t *testing.T, client kubernetes.Interface, pods map[string]*corev1.Pod) {
	t.Helper()
	for name := range pods {
		p, err := client.CoreV1().Pods("default").Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			t.Error(err)
		} else if p.Status.Phase != corev1.PodRunning {
			t.Errorf("pod %s is %s, want Running", name, p.Status.Phase)
		}
	}
}

// The seed behaviour (one GPU, no extender annotations) works, and a pod that matches nothing
// fails with the kubelet's UnexpectedAdmissionError carrying our message, never a bogus device.
func TestPluginSeedAndNoMatch(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	c := cluster.StartT(t, cluster.Config{NoScheduler: true})
	labels := map[string]string{gpushare.LabelGPUShare: gpushare.LabelValueTrue}
	single, err := c.AddKubelet(ctx, "one-gpu", cluster.KubeletOptions{Labels: labels})
	if err != nil {
		t.Fatal(err)
	}
	multi, err := c.AddKubelet(ctx, "eight-gpus", cluster.KubeletOptions{Labels: labels})
	if err != nil {
		t.Fatal(err)
	}
	sim := simulator(t, "simulated:dgxh100")
	gpus, _ := sim.Devices()
	devUnits := gpus[0].MemoryMiB / 1024
	startPlugin(t, c.Client(), single, oneGPU{sim}, 2*time.Second).waitRegistered(t)
	startPlugin(t, c.Client(), multi, simulator(t, "simulated:dgxh100"), 2*time.Second).waitRegistered(t)
	waitCapacity(t, c, single.Name(), int64(devUnits))
	waitCapacity(t, c, multi.Name(), int64(8*devUnits))

	seed := podSpec{name: "seed", sizes: []int64{6}, gpus: []int{0}, noAnno: true}.object(single.Name(), devUnits, time.Time{})
	lost := podSpec{name: "lost", sizes: []int64{6}, gpus: []int{0}, noAnno: true}.object(multi.Name(), devUnits, time.Time{})
	created := createAll(t, c.Client(), []*corev1.Pod{seed, lost})

	if _, err := c.WaitForPod(ctx, "default", "seed", waitLong, "running with the plugin's record", runningAndRecorded); err != nil {
		t.Fatal(err)
	}
	checkEnvs(t, c.Client(), single, map[string]*corev1.Pod{"seed": created["seed"]}, devUnits)

	failed, err := c.WaitForPod(ctx, "default", "lost", waitLong, "failed", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
	if err != nil {
		t.Fatal(err)
	}
	if failed.Status.Reason != "UnexpectedAdmissionError" || !strings.Contains(failed.Status.Message, "scheduler extender") ||
		!strings.Contains(failed.Status.Message, "default/lost cannot be served") {
		t.Errorf("failed pod status: reason %q message %q", failed.Status.Reason, failed.Status.Message)
	}
	t.Logf("the kubelet's message: %s", failed.Status.Message)
	cp, err := multi.Checkpoint()
	if err != nil {
		t.Fatal(err)
	}
	if e := findEntry(cp, string(failed.UID), "c0"); e != nil {
		t.Errorf("the refused container has a checkpoint entry: %+v", e)
	}
}
