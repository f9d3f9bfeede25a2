//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/manager"
	"github.com/gpushare/gpushare/plugin/nvml"
	"github.com/gpushare/gpushare/plugin/server"
	"github.com/gpushare/gpushare/test/cluster"
)

// criContainer is one container as it reached the container runtime: fake-cri's record
// (test/bed/cmd/fake-cri, containerRecord), in <kubelet root>/cri-containers/<id>.json.
type criContainer struct {
	ID          string            `json:"id"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	Envs        []struct {
		Key   string `json:"key"`
		Value string `json:"value"`
	} `json:"envs"`
	Mounts []struct {
		ContainerPath string `json:"containerPath"`
		HostPath      string `json:"hostPath"`
	} `json:"mounts"`
	CDIDevices []string `json:"cdiDevices"`
	// InjectedCDI are the CDI devices fake-cri applied (annotations' first), as containerd does.
	InjectedCDI []string `json:"injectedCDI"`
	// EffectiveEnv is the environment the container runs with: its own (a later value of a name
	// replacing an earlier one) with the CDI devices' env edits applied after it.
	EffectiveEnv []struct {
		Key   string `json:"key"`
		Value string `json:"value"`
	} `json:"effectiveEnv"`
}

// effective returns key's value in the environment the container runs with.
func (c criContainer) effective(key string) (string, bool) {
	for _, e := range c.EffectiveEnv {
		if e.Key == key {
			return e.Value, true
		}
	}
	return "", false
}

// writeNVIDIASpec writes, in the CDI specification directory fake-cri reads for kubelet
// (<root>/cdi, test/bed/cmd/fake-cri), a specification of kind nvidia.com/gpu for gpus shaped
// like the one nvidia-ctk cdi generate writes: every GPU by index and by UUID with its device node,
// and NVIDIA_VISIBLE_DEVICES=void for any container given one of them. Without it fake-cri, as
// containerd, refuses a container naming nvidia.com/gpu devices ("unresolvable CDI devices").
func writeNVIDIASpec(t *testing.T, kubelet *cluster.Kubelet, gpus []nvml.GPU) {
	t.Helper()
	type edits struct {
		Env         []string            `json:"env,omitempty"`
		DeviceNodes []map[string]string `json:"deviceNodes,omitempty"`
	}
	type device struct {
		Name           string `json:"name"`
		ContainerEdits edits  `json:"containerEdits"`
	}
	spec := struct {
		Version        string   `json:"cdiVersion"`
		Kind           string   `json:"kind"`
		Devices        []device `json:"devices"`
		ContainerEdits edits    `json:"containerEdits"`
	}{Version: "0.5.0", Kind: gpushare.CDIKind, ContainerEdits: edits{Env: []string{gpushare.EnvVisibleDevices + "=" + gpushare.VisibleDevicesVoid},
		DeviceNodes: []map[string]string{{"path": "/dev/nvidiactl"}}}}
	for _, g := range gpus {
		node := edits{DeviceNodes: []map[string]string{{"path": "/dev/nvidia" + strconv.Itoa(g.Index)}}}
		spec.Devices = append(spec.Devices, device{Name: strconv.Itoa(g.Index), ContainerEdits: node}, device{Name: g.UUID, ContainerEdits: node})
	}
	data, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(kubelet.RootDir(), "cdi")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "nvidia.com-gpu.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// env returns every value key has in the container's environment, in order (a runtime keeps
// the last).
func (c criContainer) env(key string) []string {
	var out []string
	for _, e := range c.Envs {
		if e.Key == key {
			out = append(out, e.Value)
		}
	}
	return out
}

// criContainers reads fake-cri's records of kubelet's containers, keyed by namespace/pod/container.
func criContainers(t testing.TB, kubelet *cluster.Kubelet) map[string][]criContainer {
	t.Helper()
	dir := filepath.Join(kubelet.RootDir(), "cri-containers")
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]criContainer{}
	for _, f := range files {
		if strings.HasPrefix(filepath.Base(f), ".") {
			continue // a record being written
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var c criContainer
		if err := json.Unmarshal(data, &c); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		key := c.Labels["io.kubernetes.pod.namespace"] + "/" + c.Labels["io.kubernetes.pod.name"] + "/" + c.Labels["io.kubernetes.container.name"]
		out[key] = append(out[key], c)
	}
	if len(out) == 0 {
		t.Fatalf("fake-cri recorded no container in %s (a test bed built before it recorded them?)", dir)
	}
	return out
}

// dlPhase is one run of the plugin with one device-list configuration and the pods created under it.
type dlPhase struct {
	list, ids string // the flags' values
	specs     []podSpec
	bypass    string // a pod (in specs) whose container sets NVIDIA_VISIBLE_DEVICES=all itself
}

// The device-list strategies on the real kubelet: the plugin runs with
// -device-list-strategy=volume-mounts, then is restarted with cdi-cri, then with
// cdi-annotations and -device-id-strategy=index, on one simulated 8 × H100 node; each phase
// creates pods the extender placed (one container, split over two GPUs, and one that sets
// NVIDIA_VISIBLE_DEVICES=all itself). What each container got is read from the CRI
// CreateContainer request (fake-cri's record): the mount /var/run/nvidia-container-devices/<UUID>
// of /dev/null with NVIDIA_VISIBLE_DEVICES pointing at that directory; the CDI device
// nvidia.com/gpu=<UUID> with NVIDIA_VISIBLE_DEVICES=void; the annotation
// cdi.k8s.io/gpushare-device-plugin_<index> = nvidia.com/gpu=<index> — each naming the GPU its
// pod's annotations name, with the UUID the simulated NVML gave it, and the gpushare variables
// the contract's. Then the kubelet's checkpoint agrees with every pod's record and no GPU is
// over-committed (checkEnvs), across the restarts that switched strategies. fake-cri resolves the
// CDI devices, as containerd does, against an nvidia.com/gpu specification shaped like
// nvidia-ctk's (writeNVIDIASpec): the container that sets NVIDIA_VISIBLE_DEVICES=all runs with
// that specification's void under cdi-cri, and with its own all under volume-mounts (where the
// runtime must read the mount and ignore the variable).
func TestPluginDeviceListStrategies(t *testing.T) {
	t.Parallel()
	c, kubelet, sim, devUnits := gpuNode(t, "simulated:dgxh100")
	gpus, err := sim.Devices()
	if err != nil {
		t.Fatal(err)
	}
	writeNVIDIASpec(t, kubelet, gpus)
	phases := []dlPhase{
		{list: "volume-mounts", ids: "uuid", bypass: "vm-bypass", specs: []podSpec{
			{name: "vm-one", sizes: []int64{10}, gpus: []int{3}},
			{name: "vm-split", sizes: []int64{5, 7}, gpus: []int{1, 6}},
			{name: "vm-bypass", sizes: []int64{4}, gpus: []int{2}},
		}},
		{list: "cdi-cri", ids: "uuid", bypass: "cri-bypass", specs: []podSpec{
			{name: "cri-one", sizes: []int64{10}, gpus: []int{3}},
			{name: "cri-split", sizes: []int64{6, 3}, gpus: []int{0, 7}},
			{name: "cri-bypass", sizes: []int64{4}, gpus: []int{2}},
		}},
		{list: "cdi-annotations", ids: "index", specs: []podSpec{
			{name: "ann-one", sizes: []int64{9}, gpus: []int{5}},
		}},
	}
	all := map[string]*corev1.Pod{}
	listOf := map[string]server.DeviceList{} // pod name → the configuration it was served under
	var p *runningPlugin
	for i, ph := range phases {
		list := server.DeviceList{}
		if list.Strategies, err = gpushare.ParseDeviceListStrategies(ph.list); err != nil {
			t.Fatal(err)
		}
		if list.IDs, err = gpushare.ParseDeviceIDStrategy(ph.ids); err != nil {
			t.Fatal(err)
		}
		if p != nil {
			// Until the kubelet has seen the old plugin go, its capacity is the old plugin's, and a
			// pod admitted in between fails Allocate on the stopped endpoint.
			p.stop(t)
			if _, err := c.WaitForNode(t.Context(), kubelet.Name(), waitLong, "drops capacity without the plugin",
				cluster.Allocatable(gpushare.ResourceName, 0)); err != nil {
				t.Fatal(err)
			}
		}
		p = startPluginWith(t, c.Client(), kubelet, sim, 10*time.Second, func(cfg *manager.Config) { cfg.DeviceList = list })
		p.waitRegistered(t)
		waitCapacity(t, c, kubelet.Name(), int64(8*devUnits))
		var objs []*corev1.Pod
		for j, s := range ph.specs {
			o := s.object(kubelet.Name(), devUnits, time.Now().Add(time.Duration(i*10+j)*time.Millisecond))
			if s.name == ph.bypass {
				o.Spec.Containers[0].Env = []corev1.EnvVar{{Name: gpushare.EnvVisibleDevices, Value: "all"}}
			}
			objs = append(objs, o)
			listOf[s.name] = list
		}
		pods := createAll(t, c.Client(), objs)
		waitRunning(t, c, pods)
		maps.Copy(all, pods)
		t.Logf("phase %d (%s): %d pods running", i, list, len(pods))
	}
	checkEnvs(t, c.Client(), kubelet, all, devUnits)

	recorded := criContainers(t, kubelet)
	checked := 0
	for _, name := range slices.Sorted(maps.Keys(all)) {
		pod, err := c.Client().CoreV1().Pods("default").Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		reqs, err := gpushare.ContainerRequests(pod)
		if err != nil {
			t.Fatal(err)
		}
		asg, _, err := gpushare.DecodePodAssignment(pod.Annotations)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range reqs {
			gpu, err := asg.GPUFor(r)
			if err != nil {
				t.Fatal(err)
			}
			want := expectedEnv(pod, reqs, r, gpushare.NewGPUSet(gpu), devUnits, gpushare.IsolationNone)
			key := "default/" + name + "/" + r.Name
			if len(recorded[key]) == 0 {
				t.Errorf("%s: no container reached the runtime", key)
				continue
			}
			for _, ctr := range recorded[key] {
				for _, problem := range dlMismatches(ctr, listOf[name], gpus[gpu], want, name == "vm-bypass" || name == "cri-bypass") {
					t.Errorf("%s (%s): %s", key, listOf[name], problem)
				}
				checked++
			}
		}
	}
	t.Logf("%d containers checked at the CRI", checked)
}

// dlMismatches lists how the container ctr, as the runtime got it, differs from what list says
// for env on gpu. bypass marks a container whose spec sets NVIDIA_VISIBLE_DEVICES=all.
func dlMismatches(ctr criContainer, list server.DeviceList, gpu nvml.GPU, env gpushare.ContainerEnv, bypass bool) []string {
	var out []string
	if !strings.HasPrefix(gpu.UUID, "GPU-") {
		return []string{fmt.Sprintf("simulated GPU %d has UUID %q", gpu.Index, gpu.UUID)}
	}
	id := gpu.UUID
	if list.IDs == gpushare.DeviceIDIndex {
		id = strconv.Itoa(gpu.Index)
	}
	want := env.Map()
	s := list.Strategies
	switch {
	case s.Includes(gpushare.DeviceListVolumeMounts):
		want[gpushare.EnvVisibleDevices] = "/var/run/nvidia-container-devices"
	case s.OnlyCDI():
		want[gpushare.EnvVisibleDevices] = "void"
	}
	for _, k := range slices.Sorted(maps.Keys(want)) {
		got := ctr.env(k)
		wantVals := []string{want[k]}
		if k == gpushare.EnvVisibleDevices && bypass {
			// The kubelet puts the device plugin's variables first and the pod's own after them:
			// the pod's value is what an unprivileged container's runtime would read, unless the
			// runtime ignores the variable from unprivileged containers (docs/device-plugin.md).
			wantVals = append(wantVals, "all")
		}
		if !slices.Equal(got, wantVals) {
			out = append(out, fmt.Sprintf("env %s = %q; want %q", k, got, wantVals))
		}
	}
	var mounts []string
	for _, m := range ctr.Mounts {
		if strings.HasPrefix(m.ContainerPath, "/var/run/nvidia-container-devices") {
			mounts = append(mounts, m.ContainerPath+"<-"+m.HostPath)
		}
	}
	var wantMounts []string
	if s.Includes(gpushare.DeviceListVolumeMounts) {
		wantMounts = []string{"/var/run/nvidia-container-devices/" + id + "<-/dev/null"}
	}
	if !slices.Equal(mounts, wantMounts) {
		out = append(out, fmt.Sprintf("device mounts %q; want %q", mounts, wantMounts))
	}
	var wantCDI []string
	if s.Includes(gpushare.DeviceListCDICRI) {
		wantCDI = []string{"nvidia.com/gpu=" + id}
	}
	if !slices.Equal(ctr.CDIDevices, wantCDI) {
		out = append(out, fmt.Sprintf("CDI devices %q; want %q", ctr.CDIDevices, wantCDI))
	}
	var wantInjected []string
	if s.Includes(gpushare.DeviceListCDIAnnotations) || s.Includes(gpushare.DeviceListCDICRI) {
		wantInjected = []string{"nvidia.com/gpu=" + id}
	}
	if !slices.Equal(ctr.InjectedCDI, wantInjected) {
		out = append(out, fmt.Sprintf("CDI devices applied %q; want %q", ctr.InjectedCDI, wantInjected))
	}
	// What the container runs with: the pod's own value where it sets one, unless a CDI device's
	// edit (the NVIDIA specification's void) comes after it.
	wantVisible := want[gpushare.EnvVisibleDevices]
	switch {
	case len(wantInjected) > 0:
		wantVisible = gpushare.VisibleDevicesVoid
	case bypass:
		wantVisible = "all"
	}
	if got, _ := ctr.effective(gpushare.EnvVisibleDevices); got != wantVisible {
		out = append(out, fmt.Sprintf("runs with %s=%q; want %q", gpushare.EnvVisibleDevices, got, wantVisible))
	}
	cdiAnn := map[string]string{}
	for k, v := range ctr.Annotations {
		if strings.HasPrefix(k, "cdi.k8s.io/") {
			cdiAnn[k] = v
		}
	}
	wantAnn := map[string]string{}
	if s.Includes(gpushare.DeviceListCDIAnnotations) {
		wantAnn["cdi.k8s.io/gpushare-device-plugin_"+strconv.Itoa(gpu.Index)] = "nvidia.com/gpu=" + id
	}
	if !maps.Equal(cdiAnn, wantAnn) {
		out = append(out, fmt.Sprintf("CDI annotations %v; want %v", cdiAnn, wantAnn))
	}
	return out
}
