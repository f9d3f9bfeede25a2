//go:build e2e

package e2e

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/isolation"
	"github.com/gpushare/gpushare/plugin/manager"
	"github.com/gpushare/gpushare/plugin/mps"
	"github.com/gpushare/gpushare/plugin/nvml"
	"github.com/gpushare/gpushare/plugin/server"
	"github.com/gpushare/gpushare/test/cluster"
	"github.com/gpushare/gpushare/test/fakemps"
)

// tierLastNode is a hollow kubelet with one simulated GPU whose plugin enforces tier, restarted
// once per device-list strategy.
type tierLastNode struct {
	tier       gpushare.Isolation
	kubelet    *cluster.Kubelet
	lib        nvml.Library
	gpu        nvml.GPU
	units      uint64 // the GPU's units (GiB)
	paths      isolation.Config
	controlBin string // mps: the fake control daemon
	mpsLogDir  string
	plugin     *runningPlugin
}

// start runs the node's plugin with the device-list strategies list; a CDI strategy writes its
// specification in cdiDir (empty: the one fake-cri reads, <root>/cdi).
func (n *tierLastNode) start(t *testing.T, c *cluster.Cluster, list, cdiDir string) {
	t.Helper()
	if n.plugin != nil {
		n.plugin.stop(t)
		// Until the kubelet has seen the old plugin go, its capacity is the old plugin's, and a pod
		// admitted in between fails Allocate on the stopped endpoint.
		if _, err := c.WaitForNode(t.Context(), n.kubelet.Name(), waitLong, "drops capacity without the plugin",
			cluster.Allocatable(gpushare.ResourceName, 0)); err != nil {
			t.Fatal(err)
		}
	}
	dl := server.DeviceList{Strategies: strategiesOf(t, list)}
	if dl.Strategies.Includes(gpushare.DeviceListCDICRI) || dl.Strategies.Includes(gpushare.DeviceListCDIAnnotations) {
		if cdiDir == "" {
			cdiDir = filepath.Join(n.kubelet.RootDir(), "cdi")
		}
		limits, err := server.NewLimitSpecs(server.LimitSpecsConfig{Dir: cdiDir, Checkpoint: n.kubelet.CheckpointPath(),
			Logger: zaptest.NewLogger(t).Named("cdi")})
		if err != nil {
			t.Fatal(err)
		}
		dl.Limits = limits
	}
	iso := manager.IsolationConfig{Tier: n.tier, Paths: n.paths, ProbeEvery: 200 * time.Millisecond}
	if n.tier == gpushare.IsolationMPS {
		iso.MPS = mps.New(mps.Config{ControlBin: n.controlBin, PipeDir: n.paths.MPSPipeDir, LogDir: n.mpsLogDir,
			GPUs: []string{n.gpu.UUID}, Lib: n.lib, Logger: zaptest.NewLogger(t).Named("mps")})
	}
	n.plugin = startPluginWith(t, c.Client(), n.kubelet, n.lib, 10*time.Second, func(cfg *manager.Config) {
		cfg.DeviceList, cfg.Isolation = dl, iso
	})
	n.plugin.waitRegistered(t)
	waitCapacity(t, c, n.kubelet.Name(), int64(n.units))
}

func strategiesOf(t *testing.T, list string) gpushare.DeviceListStrategies {
	t.Helper()
	s, err := gpushare.ParseDeviceListStrategies(list)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// tierLastShare is the compute share of the pods that set their variables in env, so that the
// tier's compute variable is in the answer too.
const tierLastShare = 40

// pluginValues is what the plugin answers for a container of units on n's GPU with share: the
// tier's variables (plugin/isolation), written out independently here.
func (n *tierLastNode) pluginValues(units uint64, share int) map[string]string {
	mib := strconv.FormatUint(units*1024, 10)
	switch n.tier {
	case gpushare.IsolationMPS:
		v := map[string]string{
			gpushare.EnvMPSPipeDirectory:        n.paths.MPSPipeDir,
			gpushare.EnvCUDAVisibleDevices:      n.gpu.UUID,
			gpushare.EnvMPSPinnedDeviceMemLimit: "0=" + mib + "M",
		}
		if share > 0 {
			v[gpushare.EnvMPSActiveThreadPercentage] = strconv.Itoa(share)
		}
		return v
	default:
		v := map[string]string{
			gpushare.EnvHAMiMemoryLimit:        mib + "m",
			gpushare.EnvHAMiMemoryLimit + "_0": mib + "m",
			gpushare.EnvHAMiSharedCache:        gpushare.HAMiContainerCacheFile,
			gpushare.EnvHAMiDisableControl:     "false",
			gpushare.EnvHAMiCorePolicy:         "default",
		}
		if share > 0 {
			v[gpushare.EnvHAMiSMLimit] = strconv.Itoa(share)
		}
		return v
	}
}

// lifted is what a tenant sets to lift each of tier's variables (and NVIDIA_VISIBLE_DEVICES).
func lifted(tier gpushare.Isolation) map[string]string {
	if tier == gpushare.IsolationMPS {
		return map[string]string{
			gpushare.EnvMPSPipeDirectory:          "/tmp/my-own-mps",
			gpushare.EnvCUDAVisibleDevices:        "0,1,2,3",
			gpushare.EnvMPSPinnedDeviceMemLimit:   "0=1000000M",
			gpushare.EnvMPSActiveThreadPercentage: "100",
			gpushare.EnvVisibleDevices:            "all",
		}
	}
	return map[string]string{
		gpushare.EnvHAMiMemoryLimit:        "200g",
		gpushare.EnvHAMiMemoryLimit + "_0": "200g",
		gpushare.EnvHAMiSharedCache:        "/tmp/my-own.cache",
		gpushare.EnvHAMiSMLimit:            "100",
		gpushare.EnvHAMiDisableControl:     "true",
		gpushare.EnvHAMiCorePolicy:         "disable",
		gpushare.EnvVisibleDevices:         "all",
	}
}

// tierLastPods are one phase's pods on n: one that sets every variable of the tier in env (with a
// compute share, so the compute variable is answered), one that sets them through envFrom of the
// ConfigMap lift-<tier>. Sizes are unique on the node across phases.
func (n *tierLastNode) tierLastPods(prefix string, phase int) []*corev1.Pod {
	var out []*corev1.Pod
	for k, how := range []string{"env", "envfrom"} {
		units := int64(1 + 2*phase + k)
		p := podSpec{name: prefix + "-" + how, sizes: []int64{units}, gpus: []int{0}}.object(n.kubelet.Name(), n.units, time.Now())
		ctr := &p.Spec.Containers[0]
		if how == "env" {
			p.Annotations[gpushare.AnnotationComputePercent] = strconv.Itoa(tierLastShare)
			own := lifted(n.tier)
			for _, k := range slices.Sorted(maps.Keys(own)) {
				ctr.Env = append(ctr.Env, corev1.EnvVar{Name: k, Value: own[k]})
			}
		} else {
			ctr.EnvFrom = []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "lift-" + string(n.tier)}}}}
		}
		out = append(out, p)
	}
	return out
}

// The tier's variables are delivered so that the runtime applies them last. The kubelet puts a
// device plugin's variables before the container's own env and envFrom, and the runtime keeps the
// later value, so a container on an mps or hami-core node that sets CUDA_DEVICE_MEMORY_LIMIT=200g,
// CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, CUDA_VISIBLE_DEVICES, the compute limits or the shared-cache
// path itself would lift its limit. Under cdi-cri and cdi-annotations the plugin names, beside the
// GPU's CDI device, a device of its own CDI specification whose edits are the tier's variables,
// and a CDI runtime applies those after the container's env: on a node per tier (one simulated
// GPU; the mps node drives the fake MPS control daemon, the hami-core node has fake library
// files) the plugin runs with cdi-cri, then cdi-annotations, then envvar, then volume-mounts, and
// each time a pod sets every tier variable in env, and another sets them through envFrom. fake-cri
// applies CDI devices as containerd does (test/bed/cmd/fake-cri) and records the environment each
// container runs with:
//
//   - cdi-cri and cdi-annotations: every tier variable has the plugin's value, and the limits
//     device applied is the one named after those variables (NVIDIA_VISIBLE_DEVICES is the NVIDIA
//     specification's void, writeNVIDIASpec);
//   - envvar and volume-mounts: the container's own values win, as documented: these strategies
//     have no channel the runtime applies after the container's env, and the admission policy
//     gpushare-tenant-env is what refuses such pods there.
//
// The answer's env keeps the variables too (the CRI request has the plugin's value first). Last,
// a plugin whose CDI specification cannot be written refuses Allocate with the reason, and the pod
// fails rather than run with a limit it could lift.
func TestTierVariablesAppliedLast(t *testing.T) {
	t.Parallel()
	c := cluster.StartT(t, cluster.Config{NoScheduler: true})
	// MPS pipe paths are bounded by the unix socket path limit: a short directory of our own.
	dir, err := os.MkdirTemp("", "gslast")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	controlBin, err := fakemps.Build(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var nodes []*tierLastNode
	for _, nd := range []struct {
		name, backend string
		tier          gpushare.Isolation
	}{{"last-mps", "simulated:dgxh200", gpushare.IsolationMPS}, {"last-hami", "simulated:dgxa100", gpushare.IsolationHAMiCore}} {
		kubelet, err := c.AddKubelet(t.Context(), nd.name, cluster.KubeletOptions{Labels: map[string]string{gpushare.LabelGPUShare: gpushare.LabelValueTrue}})
		if err != nil {
			t.Fatal(err)
		}
		lib := oneGPU{simulator(t, nd.backend)}
		gpus, err := lib.Devices()
		if err != nil {
			t.Fatal(err)
		}
		writeNVIDIASpec(t, kubelet, gpus)
		n := &tierLastNode{tier: nd.tier, kubelet: kubelet, lib: lib, gpu: gpus[0], units: gpus[0].MemoryMiB / 1024}
		if nd.tier == gpushare.IsolationMPS {
			n.paths = isolation.Config{MPSPipeDir: filepath.Join(dir, "pipe"), MPSShmDir: filepath.Join(dir, "shm")}
			n.controlBin, n.mpsLogDir = controlBin, filepath.Join(dir, "log")
		} else {
			n.paths = hamiFiles(t, filepath.Join(dir, "hami"))
		}
		nodes = append(nodes, n)
	}
	for _, tier := range []gpushare.Isolation{gpushare.IsolationMPS, gpushare.IsolationHAMiCore} {
		data := lifted(tier)
		delete(data, gpushare.EnvVisibleDevices)
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "lift-" + string(tier), Namespace: "default"}, Data: data}
		if _, err := c.Client().CoreV1().ConfigMaps("default").Create(t.Context(), cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	type served struct {
		node *tierLastNode
		list gpushare.DeviceListStrategies
		pod  *corev1.Pod
	}
	var all []served
	for phase, list := range []string{"cdi-cri", "cdi-annotations", "envvar", "volume-mounts"} {
		var objs []*corev1.Pod
		for _, n := range nodes {
			n.start(t, c, list, "")
			for _, p := range n.tierLastPods(fmt.Sprintf("%s-%s", strings.ReplaceAll(list, "-", ""), n.tier), phase) {
				objs = append(objs, p)
				all = append(all, served{node: n, list: strategiesOf(t, list), pod: p})
			}
		}
		pods := createAll(t, c.Client(), objs)
		waitRunning(t, c, pods)
		t.Logf("%s: %d pods running", list, len(pods))
	}

	recorded := map[string][]criContainer{}
	for _, n := range nodes {
		maps.Copy(recorded, criContainers(t, n.kubelet))
	}
	checked := 0
	for _, s := range all {
		key := "default/" + s.pod.Name + "/c0"
		if len(recorded[key]) == 0 {
			t.Errorf("%s: no container reached the runtime", key)
			continue
		}
		units := uint64(s.pod.Spec.Containers[0].Resources.Limits.Name(gpushare.ResourceName, "").Value())
		share := 0
		if s.pod.Annotations[gpushare.AnnotationComputePercent] != "" {
			share = tierLastShare
		}
		for _, ctr := range recorded[key] {
			for _, problem := range tierLastProblems(ctr, s.node, s.list, units, share) {
				t.Errorf("%s (%s, %s): %s", key, s.node.tier, s.list, problem)
			}
			checked++
		}
	}
	t.Logf("%d containers checked at the CRI", checked)

	// A specification that cannot be written: refused, never started without its limit.
	n := nodes[1]
	broken := filepath.Join(dir, "cdi-broken")
	n.start(t, c, "cdi-cri", broken)
	if err := os.WriteFile(broken, nil, 0o644); err != nil { // a file where the directory should be
		t.Fatal(err)
	}
	p := podSpec{name: "unwritable", sizes: []int64{3}, gpus: []int{0}}.object(n.kubelet.Name(), n.units, time.Now())
	createAll(t, c.Client(), []*corev1.Pod{p})
	got, err := c.WaitForPod(t.Context(), "default", "unwritable", waitLong, "refused by Allocate", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodRunning
	})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status.Phase != corev1.PodFailed || !strings.Contains(got.Status.Message, "cannot reach the runtime as CDI device gpushare.io/limits=hami-core-") {
		t.Errorf("a pod whose limits cannot be written: phase %s, %q; want Failed naming the CDI device", got.Status.Phase, got.Status.Message)
	} else {
		t.Logf("with the CDI specification unwritable: %s", got.Status.Message)
	}
}

// tierLastProblems lists how the container ctr, as fake-cri created it, differs from what list
// makes of n's tier for a container of units with share: the plugin's values win under a CDI
// strategy, the container's own under the others.
func tierLastProblems(ctr criContainer, n *tierLastNode, list gpushare.DeviceListStrategies, units uint64, share int) []string {
	var out []string
	if ctr.EffectiveEnv == nil {
		return []string{"fake-cri recorded no effective environment (a test bed built before it applied CDI?)"}
	}
	plugin := n.pluginValues(units, share)
	own := lifted(n.tier) // the env pod's; the envFrom pod (no share) has the ConfigMap's, all but NVIDIA_VISIBLE_DEVICES
	if share == 0 {
		delete(own, gpushare.EnvVisibleDevices)
	}
	cdi := list.Includes(gpushare.DeviceListCDICRI) || list.Includes(gpushare.DeviceListCDIAnnotations)
	for _, k := range slices.Sorted(maps.Keys(plugin)) {
		// The answer keeps the variable: the kubelet sends the plugin's value first.
		if raw := ctr.env(k); len(raw) == 0 || raw[0] != plugin[k] {
			out = append(out, fmt.Sprintf("the CRI request's %s = %q; want the plugin's %q first", k, raw, plugin[k]))
		}
	}
	names := slices.Sorted(maps.Keys(plugin))
	for k := range own {
		if _, ok := plugin[k]; !ok && k != gpushare.EnvVisibleDevices {
			names = append(names, k) // a tier variable the plugin does not answer here (no share)
		}
	}
	for _, k := range names {
		got, _ := ctr.effective(k)
		want, whose := plugin[k], "the plugin's"
		if _, set := own[k]; set && (!cdi || plugin[k] == "") {
			want, whose = own[k], "the container's own"
		}
		if got != want {
			out = append(out, fmt.Sprintf("runs with %s=%q; want %s %q", k, got, whose, want))
		}
	}
	if v, set := own[gpushare.EnvVisibleDevices]; set {
		want := v
		if cdi {
			want = gpushare.VisibleDevicesVoid // the NVIDIA specification's edit
		}
		if got, _ := ctr.effective(gpushare.EnvVisibleDevices); got != want {
			out = append(out, fmt.Sprintf("runs with %s=%q; want %q", gpushare.EnvVisibleDevices, got, want))
		}
	}
	var wantInjected []string
	if cdi {
		edits := gpushare.CDILimitsEnv(plugin)
		limits := gpushare.CDILimitsDevice(gpushare.CDILimitsDeviceName(n.tier, edits))
		wantInjected = []string{"nvidia.com/gpu=" + n.gpu.UUID, limits}
	}
	if !slices.Equal(ctr.InjectedCDI, wantInjected) {
		out = append(out, fmt.Sprintf("CDI devices applied %q; want %q", ctr.InjectedCDI, wantInjected))
	}
	return out
}
