//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpushare/gpushare/extender/cache"
	"github.com/gpushare/gpushare/inspector/collect"
	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/manager"
	"github.com/gpushare/gpushare/plugin/nvml"
	"github.com/gpushare/gpushare/test/cluster"
)

// The system tests run everything together on the bed: the real kube-apiserver and kube-scheduler
// with our extender wired into the scheduler's configuration (filter, prioritize, bind,
// nodeCacheCapable), our device plugin on hollow kubelets (the real kubelet device manager) with
// simulated GPUs, and our inspector. Pods are created as users create them, without annotations
// and without a node: every placement is the extender's, every environment the plugin's, and the
// kubelet's checkpoint is the ground truth of what each container got.

// systemWait bounds a whole burst: on the 2-core machine with -race, 46 pods take about 30 s.
const systemWait = 4 * time.Minute

// systemBed is the control plane, the scheduler with our extender and the GPU nodes.
type systemBed struct {
	c       *cluster.Cluster
	client  kubernetes.Interface
	extAddr string
	nodes   map[string]*systemNode
	// kubeletAPILimits starts the nodes' kubelets at the real kubelet's API limits.
	kubeletAPILimits bool
}

// systemNode is a hollow kubelet with our device plugin on simulated GPUs.
type systemNode struct {
	kubelet *cluster.Kubelet
	plugin  *runningPlugin
	gpus    gpushare.NodeGPUs // as the plugin published it on the Node
	total   int64             // units advertised to the kubelet
}

// startSystem starts the control plane, our extender in process and kube-scheduler configured to
// call it for every pod asking for gpu-mem. Everything stops when the test ends.
func startSystem(t testing.TB) *systemBed {
	t.Helper()
	return startSystemWith(t, func(extAddr string) cluster.SchedulerConfig {
		return cluster.SchedulerConfig{ClientQPS: 500, ClientBurst: 1000, Extenders: []cluster.Extender{ourExtender("http://" + extAddr)}}
	})
}

// startSystemWith starts the control plane, our extender in process and the scheduler sched
// returns for the extender's address, after running each of before on the cluster.
func startSystemWith(t testing.TB, sched func(extAddr string) cluster.SchedulerConfig, before ...func(*cluster.Cluster)) *systemBed {
	t.Helper()
	addr := "127.0.0.1:" + freeLoopbackPort(t)
	c := cluster.StartT(t, cluster.Config{NoScheduler: true})
	for _, f := range before {
		f(c)
	}
	b := &systemBed{c: c, client: c.Client(), extAddr: addr, nodes: map[string]*systemNode{}}
	ext := startExtender(t, addr, b.client)
	t.Cleanup(func() { ext.stop(t) })
	if err := c.StartScheduler(t.Context(), sched(addr)); err != nil {
		t.Fatal(err)
	}
	return b
}

// addNode starts a hollow kubelet named name and our device plugin on the simulated backend, and
// returns once the node advertises every unit, publishes its GPUs and is in the extender's view.
func (b *systemBed) addNode(t testing.TB, name, backend string) *systemNode {
	t.Helper()
	return b.addNodeWith(t, name, simulator(t, backend), nil)
}

// addNodeWith is addNode on lib, with the plugin's configuration changed by mutate (nil: none).
func (b *systemBed) addNodeWith(t testing.TB, name string, sim nvml.Library, mutate func(*manager.Config)) *systemNode {
	t.Helper()
	ctx := t.Context()
	kubelet, err := b.c.AddKubelet(ctx, name, cluster.KubeletOptions{
		Labels: map[string]string{gpushare.LabelGPUShare: gpushare.LabelValueTrue}, KubeAPILimits: b.kubeletAPILimits,
	})
	if err != nil {
		t.Fatal(err)
	}
	devs, err := sim.Devices()
	if err != nil {
		t.Fatal(err)
	}
	n := &systemNode{kubelet: kubelet}
	for _, d := range devs {
		n.total += int64(d.MemoryMiB / 1024)
	}
	// The plugin's own client, at the limits the binary ships with: the bed's shared client allows
	// far more, which hid the plugin's old 5 queries per second.
	client, err := b.c.ClientWithLimits(manager.DefaultKubeAPIQPS, manager.DefaultKubeAPIBurst)
	if err != nil {
		t.Fatal(err)
	}
	n.plugin = startPluginWith(t, client, kubelet, sim, 10*time.Second, mutate)
	n.plugin.waitRegistered(t)
	node, err := b.c.WaitForNode(ctx, name, waitLong, "advertises our devices and publishes its GPUs", func(node *corev1.Node) bool {
		desc, err := gpushare.DecodeNodeGPUs(node.Annotations[gpushare.AnnotationNodeGPUs])
		return err == nil && len(desc.GPUs) == len(devs) && desc.TotalUnits() == uint64(n.total) &&
			cluster.Allocatable(gpushare.ResourceName, n.total)(node)
	})
	if err != nil {
		t.Fatal(err)
	}
	if n.gpus, err = gpushare.DecodeNodeGPUs(node.Annotations[gpushare.AnnotationNodeGPUs]); err != nil {
		t.Fatal(err)
	}
	if !n.gpus.Simulated || n.gpus.Unit != gpushare.GiB {
		t.Errorf("node %s publishes %+v; want simulated GiB GPUs", name, n.gpus)
	}
	pollUntil(t, waitLong, "the extender sees node "+name, func() bool {
		in, err := b.inspect()
		if err != nil {
			return false
		}
		for _, node := range in.Nodes {
			if node.Name == name {
				return node.TotalGPU == uint64(n.total) && len(node.Devs) == len(devs)
			}
		}
		return false
	})
	b.nodes[name] = n
	return n
}

// inspect is the extender's GET /gpushare-scheduler/inspect.
func (b *systemBed) inspect() (cache.Inspect, error) {
	var in cache.Inspect
	resp, err := http.Get("http://" + b.extAddr + gpushare.ExtenderURLPrefix + "/inspect")
	if err != nil {
		return in, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return in, fmt.Errorf("inspect: %s", resp.Status)
	}
	err = json.NewDecoder(resp.Body).Decode(&in)
	return in, err
}

// sysPod is a pod as a user writes it: no node, no annotations.
type sysPod struct {
	name    string
	sizes   []int64 // regular containers c0, c1, ...
	sidecar int64   // units of a sidecar init container "side" (0: none)
}

func (s sysPod) object() *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: "default"}}
	if s.sidecar > 0 {
		// A sidecar: the fake runtime never finishes a plain init container.
		always := corev1.ContainerRestartPolicyAlways
		p.Spec.InitContainers = []corev1.Container{{Name: "side", Image: "registry.k8s.io/pause:3.10", Resources: units(s.sidecar), RestartPolicy: &always}}
	}
	for i, u := range s.sizes {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: fmt.Sprintf("c%d", i), Image: "registry.k8s.io/pause:3.10", Resources: units(u)})
	}
	return p
}

// h200Burst is issue 4's headline burst for one node with 8 × 141-unit GPUs: 40 single-container
// pods of three sizes (14 × 6, 13 × 12, 13 × 18 units: the 12s and the 18s cannot all share one
// GPU, so equal sizes land on several GPUs, and every GPU holds several pods), plus multi-container
// pods: three (6, 12) pairs on one GPU, whose containers have the sizes of the singles but another
// pod total (so the extender must hold them back while singles of those sizes are in flight), one
// (90, 90) pod that fits no single GPU and is split over two, and two pods with a 3-unit sidecar
// beside a 9-unit main container. 732 of 1128 units: every pod fits whatever the order.
func h200Burst() []sysPod {
	var pods []sysPod
	for i := range 14 {
		pods = append(pods, sysPod{name: fmt.Sprintf("s06-%02d", i), sizes: []int64{6}})
	}
	for i := range 13 {
		pods = append(pods, sysPod{name: fmt.Sprintf("s12-%02d", i), sizes: []int64{12}})
	}
	for i := range 13 {
		pods = append(pods, sysPod{name: fmt.Sprintf("s18-%02d", i), sizes: []int64{18}})
	}
	for i := range 3 {
		pods = append(pods, sysPod{name: fmt.Sprintf("pair-%02d", i), sizes: []int64{6, 12}})
	}
	pods = append(pods, sysPod{name: "split-00", sizes: []int64{90, 90}})
	for i := range 2 {
		pods = append(pods, sysPod{name: fmt.Sprintf("side-%02d", i), sizes: []int64{9}, sidecar: 3})
	}
	return pods
}

func containerCount(pods []sysPod) int {
	n := 0
	for _, p := range pods {
		n += len(p.sizes)
		if p.sidecar > 0 {
			n++
		}
	}
	return n
}

// createBurst creates every pod at once and returns them by name.
func (b *systemBed) createBurst(t testing.TB, pods []sysPod) map[string]*corev1.Pod {
	t.Helper()
	objs := make([]*corev1.Pod, 0, len(pods))
	for _, p := range pods {
		objs = append(objs, p.object())
	}
	return createAll(t, b.client, objs)
}

// listPods returns the current state of the named pods, in name order.
func (b *systemBed) listPods(t testing.TB, names map[string]*corev1.Pod) []corev1.Pod {
	t.Helper()
	l, err := b.client.CoreV1().Pods("default").List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []corev1.Pod
	for _, p := range l.Items {
		if _, ok := names[p.Name]; ok {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	if len(out) != len(names) {
		t.Fatalf("%d of %d pods exist", len(out), len(names))
	}
	return out
}

// running counts the Running pods; a Failed pod fails the test at once with the kubelet's reason.
func running(t testing.TB, items []corev1.Pod) int {
	t.Helper()
	n := 0
	for _, p := range items {
		switch p.Status.Phase {
		case corev1.PodRunning:
			n++
		case corev1.PodFailed:
			hint := ""
			if strings.Contains(p.Status.Message, "unregistered device") || strings.Contains(p.Status.Message, "no healthy devices present") {
				// devicemanager.devicesToAllocate refuses a pod admitted after a kubelet restart
				// before the device plugin registered again: the kubelet's own window, not ours.
				hint = " (the kubelet admitted it before our plugin registered again)"
			}
			t.Fatalf("pod %s failed on node %q: %s: %s%s", p.Name, p.Spec.NodeName, p.Status.Reason, p.Status.Message, hint)
		}
	}
	return n
}

// runningAndRecorded tells whether the pod runs and, when it asks for GPU memory, carries the
// plugin's record of its containers (ASSIGNED=true). The plugin writes the record once the
// kubelet's pod-resources API shows who got the devices, a moment after the container may start.
func runningAndRecorded(p *corev1.Pod) bool {
	if p.Status.Phase != corev1.PodRunning {
		return false
	}
	reqs, err := gpushare.ContainerRequests(p)
	if err != nil || gpushare.PodUnits(reqs) == 0 {
		return err == nil
	}
	asg, placed, err := gpushare.DecodePodAssignment(p.Annotations)
	return err == nil && placed && asg.Assigned
}

// recordedCount counts the pods for which runningAndRecorded holds.
func recordedCount(items []corev1.Pod) int {
	n := 0
	for i := range items {
		if runningAndRecorded(&items[i]) {
			n++
		}
	}
	return n
}

// waitAllRunning polls until every pod runs and carries the plugin's record; on timeout it names
// each one that does not and why.
func (b *systemBed) waitAllRunning(t testing.TB, names map[string]*corev1.Pod, timeout time.Duration) []corev1.Pod {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		items := b.listPods(t, names)
		if running(t, items) == len(items) && recordedCount(items) == len(items) {
			return items
		}
		if time.Now().After(deadline) {
			var lines []string
			for _, p := range items {
				if runningAndRecorded(&p) {
					continue
				}
				lines = append(lines, fmt.Sprintf("%s: phase %s, node %q, assigned %q, unschedulable %q, message %q",
					p.Name, p.Status.Phase, p.Spec.NodeName, p.Annotations[gpushare.AnnotationAssigned], unschedulable(&p), p.Status.Message))
			}
			t.Fatalf("after %v, %d of %d pods are not Running with their record:\n%s", timeout, len(lines), len(items), strings.Join(lines, "\n"))
		}
		time.Sleep(200 * time.Millisecond) // poll pacing; the deadline above bounds the wait
	}
}

// perGPU is units per node, then per GPU index.
type perGPU map[string]map[int]uint64

func (p perGPU) add(node string, charges map[int]uint64) {
	if p[node] == nil {
		p[node] = map[int]uint64{}
	}
	for g, u := range charges {
		p[node][g] += u
	}
}

// held is what a container holds in the kubelet's checkpoint.
type held struct {
	devices []string
	env     map[string]string
}

// verified is what verifySystem read: per-GPU charges by the annotations and by the checkpoints,
// and each container's checkpoint entry keyed by pod UID and container name.
type verified struct {
	byAnnotations perGPU
	byCheckpoint  perGPU
	entries       map[string]held // "<pod UID>/<container>"
	gpusOfSize    map[uint64]map[int]bool
}

// verifySystem checks the race-free rule's end state on every pod of items (all Running):
//   - the pod is bound to one of our nodes with a readable assignment, POD = its request and
//     ASSIGNED=true, and carries the plugin's record of every gpu-mem container;
//   - for every gpu-mem container, the env in the kubelet's checkpoint is exactly the one its own
//     pod's annotations name (GPU by GPUFor, the pod's units, the container's units, that GPU's
//     size), with as many device IDs as units, none shared with another container, and equals
//     the record on the pod;
//   - no GPU is charged beyond its size, by the annotations or by the checkpoint.
//
// A mismatch is explained: which other pods' signatures the checkpoint env equals, so a reader
// can tell whether the extender let two in-flight containers of one size differ (rule 2) or the
// plugin answered a call with an env no in-flight pod had (rule 3).
func (b *systemBed) verifySystem(t *testing.T, items []corev1.Pod) verified {
	t.Helper()
	v := verified{byAnnotations: perGPU{}, byCheckpoint: perGPU{}, entries: map[string]held{}, gpusOfSize: map[uint64]map[int]bool{}}
	checkpoints := map[string]cluster.Checkpoint{}
	owner := map[string]string{} // node/device ID → pod/container holding it
	for name, n := range b.nodes {
		cp, err := n.kubelet.Checkpoint()
		if err != nil {
			t.Fatal(err)
		}
		checkpoints[name] = cp
	}
	type signature struct {
		pod, container string
		env            gpushare.ContainerEnv
		assume         int64
	}
	var sigs []signature // every container's signature by its own annotations
	type check struct {
		pod       *corev1.Pod
		container string
		want      gpushare.ContainerEnv
		got       gpushare.ContainerEnv
	}
	var mismatches []check
	for i := range items {
		p := &items[i]
		node := b.nodes[p.Spec.NodeName]
		if node == nil {
			t.Errorf("pod %s is bound to %q, not one of our GPU nodes", p.Name, p.Spec.NodeName)
			continue
		}
		reqs, err := gpushare.ContainerRequests(p)
		if err != nil {
			t.Fatal(err)
		}
		asg, placed, err := gpushare.DecodePodAssignment(p.Annotations)
		if err != nil || !placed {
			t.Errorf("pod %s: assignment placed=%v, %v", p.Name, placed, err)
			continue
		}
		if !asg.Assigned {
			t.Errorf("pod %s runs but %s is not true", p.Name, gpushare.AnnotationAssigned)
		}
		if asg.PodUnits != gpushare.PodUnits(reqs) {
			t.Errorf("pod %s: %s=%d, its request is %d", p.Name, gpushare.AnnotationPodUnits, asg.PodUnits, gpushare.PodUnits(reqs))
		}
		charges, err := asg.Charges(reqs)
		if err != nil {
			t.Errorf("pod %s: charges: %v", p.Name, err)
			continue
		}
		v.byAnnotations.add(p.Spec.NodeName, charges)
		raw, ok := p.Annotations[gpushare.AnnotationContainerEnv]
		if !ok {
			t.Errorf("pod %s has no %s record", p.Name, gpushare.AnnotationContainerEnv)
		}
		record, err := gpushare.DecodeContainerEnvs(raw)
		if ok && err != nil {
			t.Errorf("pod %s: %s: %v", p.Name, gpushare.AnnotationContainerEnv, err)
		}
		gotSet := map[string]gpushare.GPUSet{}
		for _, r := range reqs {
			set, err := asg.SetFor(r)
			if err != nil {
				t.Errorf("pod %s container %s: %v", p.Name, r.Name, err)
				continue
			}
			gpu := set.First()
			if missing := missingGPUs(node.gpus, set); missing != "" {
				t.Errorf("pod %s container %s: annotations name GPUs %s, node %s has no %s", p.Name, r.Name, set, p.Spec.NodeName, missing)
				continue
			}
			info, _ := node.gpus.GPU(gpu)
			want := expectedEnv(p, reqs, r, set, info.Units, info.Isolation)
			sigs = append(sigs, signature{pod: p.Name, container: r.Name, env: want, assume: asg.AssumeTime})
			if v.gpusOfSize[r.Units] == nil {
				v.gpusOfSize[r.Units] = map[int]bool{}
			}
			v.gpusOfSize[r.Units][gpu] = true
			if rec, ok := record[r.Name]; !ok || rec != want {
				t.Errorf("pod %s container %s: recorded env %+v (present %v); its annotations name %+v", p.Name, r.Name, rec, ok, want)
			}
			entry := findEntry(checkpoints[p.Spec.NodeName], string(p.UID), r.Name)
			if entry == nil {
				t.Errorf("pod %s container %s: no entry in node %s's checkpoint", p.Name, r.Name, p.Spec.NodeName)
				continue
			}
			if entry.ResourceName != string(gpushare.ResourceName) {
				t.Errorf("pod %s container %s: checkpoint resource %q", p.Name, r.Name, entry.ResourceName)
			}
			if uint64(len(entry.DeviceIDs)) != r.Units {
				t.Errorf("pod %s container %s: %d device IDs for %d units", p.Name, r.Name, len(entry.DeviceIDs), r.Units)
			}
			for _, id := range entry.DeviceIDs {
				key := p.Spec.NodeName + "/" + id
				if o, dup := owner[key]; dup {
					t.Errorf("device %s is held by %s and %s/%s", key, o, p.Name, r.Name)
				}
				owner[key] = p.Name + "/" + r.Name
			}
			v.entries[string(p.UID)+"/"+r.Name] = held{devices: entry.DeviceIDs, env: entry.Envs}
			got, err := gpushare.ParseContainerEnv(entry.Envs)
			if err != nil {
				t.Errorf("pod %s container %s: checkpoint env %v: %v", p.Name, r.Name, entry.Envs, err)
				continue
			}
			gotSet[r.Name] = got.Set()
			if got != want {
				mismatches = append(mismatches, check{pod: p, container: r.Name, want: want, got: got})
			}
		}
		if len(gotSet) == len(reqs) {
			v.byCheckpoint.add(p.Spec.NodeName, gpushare.ChargesBySet(reqs, func(r gpushare.ContainerRequest) gpushare.GPUSet { return gotSet[r.Name] }))
		}
	}
	for _, m := range mismatches {
		var same []string
		for _, s := range sigs {
			if s.env == m.got {
				same = append(same, fmt.Sprintf("%s/%s (assumed %d)", s.pod, s.container, s.assume))
			}
		}
		asg, _, _ := gpushare.DecodePodAssignment(m.pod.Annotations)
		why := "no pod's annotations name this env: the plugin answered with an env no in-flight pod had (rule 3 broken)"
		if len(same) > 0 {
			why = "it is the signature of " + strings.Join(same, ", ") +
				": if those were in flight together with this pod, the extender placed equal container sizes with different signatures (rule 2 broken); otherwise the plugin served a pod that was not in flight (rule 1/3)"
		}
		t.Errorf("RACE: pod %s container %s (assumed %d) runs with %+v in the kubelet's checkpoint; its annotations name %+v; %s",
			m.pod.Name, m.container, asg.AssumeTime, m.got, m.want, why)
	}
	for _, by := range []struct {
		what string
		p    perGPU
	}{{"annotations", v.byAnnotations}, {"checkpoint", v.byCheckpoint}} {
		for name, gpus := range by.p {
			for g, u := range gpus {
				info, ok := b.nodes[name].gpus.GPU(g)
				if !ok || u > info.Units {
					t.Errorf("node %s GPU %d over-committed by the %s: %d units charged, GPU has %d", name, g, by.what, u, info.Units)
				}
			}
		}
	}
	return v
}

// compareViews checks issue 5's claim: per GPU, the inspector's allocated units (its command run
// in process with -o json against the admin kubeconfig) equal the extender's /inspect and equal
// what the kubelets' checkpoints say the containers got; per container, the env the inspector
// shows is the one in the checkpoint.
func (b *systemBed) compareViews(t *testing.T, v verified) {
	t.Helper()
	// The extender's view follows the API through its informers: poll until it agrees.
	var diff string
	deadline := time.Now().Add(waitLong)
	for {
		diff = b.extenderDiff(v.byCheckpoint)
		if diff == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the extender's /inspect never agreed with the kubelets' checkpoints: %s", diff)
		}
		time.Sleep(100 * time.Millisecond) // poll pacing; the deadline above bounds the wait
	}

	code, out, errOut := inspect(t.Context(), "--kubeconfig", b.c.AdminKubeconfig(), "-o", "json")
	if code != 0 || errOut != "" {
		t.Fatalf("inspector: exit %d, stderr %q", code, errOut)
	}
	var r collect.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("inspector JSON: %v\n%s", err, out)
	}
	if len(r.Skipped) > 0 {
		t.Errorf("inspector skipped %+v", r.Skipped)
	}
	if len(r.Nodes) != len(b.nodes) {
		t.Errorf("inspector shows %d nodes, the bed has %d", len(r.Nodes), len(b.nodes))
	}
	var clusterTotal, clusterAllocated uint64
	for _, node := range r.Nodes {
		n := b.nodes[node.Name]
		if n == nil {
			t.Errorf("inspector shows unknown node %s", node.Name)
			continue
		}
		var sum uint64
		for _, u := range v.byCheckpoint[node.Name] {
			sum += u
		}
		clusterTotal += uint64(n.total)
		clusterAllocated += sum
		if node.Total != uint64(n.total) || node.Allocated != sum || node.Pending != 0 || node.GPUSizes != "published" {
			t.Errorf("inspector node %s: total %d, allocated %d, pending %d, sizes %s; checkpoint: %d of %d, published",
				node.Name, node.Total, node.Allocated, node.Pending, node.GPUSizes, sum, n.total)
		}
		if len(node.GPUs) != len(n.gpus.GPUs) {
			t.Errorf("inspector node %s: %d GPUs, the plugin published %d", node.Name, len(node.GPUs), len(n.gpus.GPUs))
		}
		for _, g := range node.GPUs {
			info, _ := n.gpus.GPU(g.Index)
			if want := v.byCheckpoint[node.Name][g.Index]; g.Allocated != want || g.Total != info.Units || !g.Known || !g.Healthy {
				t.Errorf("node %s GPU %d: inspector %d/%d (known %v, healthy %v); checkpoint %d, published size %d",
					node.Name, g.Index, g.Allocated, g.Total, g.Known, g.Healthy, want, info.Units)
			}
		}
		for _, p := range node.Pods {
			if !p.Assigned || p.Pending {
				t.Errorf("inspector pod %s: assigned %v, pending %v", p.Name, p.Assigned, p.Pending)
			}
			pod, err := b.client.CoreV1().Pods(p.Namespace).Get(t.Context(), p.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for _, ct := range p.Containers {
				e, ok := v.entries[string(pod.UID)+"/"+ct.Name]
				got, err := gpushare.ParseContainerEnv(ct.Env)
				want, werr := gpushare.ParseContainerEnv(e.env)
				gpu := -1
				if ct.GPU != nil {
					gpu = *ct.GPU
				}
				if ct.State != collect.StateAllocated || !ok || err != nil || werr != nil || got != want || gpu != want.GPUIndex {
					t.Errorf("inspector %s/%s: state %s, gpu %d, env %v (%v); checkpoint env %v (%v)", p.Name, ct.Name, ct.State, gpu, ct.Env, err, e.env, werr)
				}
			}
		}
	}
	if r.Total != clusterTotal || r.Allocated != clusterAllocated || r.Unit != "GiB" {
		t.Errorf("inspector cluster %d/%d %s; checkpoints %d/%d GiB", r.Allocated, r.Total, r.Unit, clusterAllocated, clusterTotal)
	}

	// The operator's views say the same: no container unrecorded or mismatched.
	code, out, errOut = inspect(t.Context(), "--kubeconfig", b.c.AdminKubeconfig(), "-d")
	if code != 0 || errOut != "" || strings.Contains(out, "MISMATCH") || strings.Contains(out, "not allocated yet") {
		t.Errorf("inspector -d: exit %d, stderr %q:\n%s", code, errOut, out)
	}
	if t.Failed() {
		return
	}
	t.Logf("views agree on %d nodes: %d of %d units allocated, per GPU %v", len(r.Nodes), clusterAllocated, clusterTotal, v.byCheckpoint)
}

// extenderDiff returns how the extender's /inspect differs from want; empty when it agrees.
func (b *systemBed) extenderDiff(want perGPU) string {
	in, err := b.inspect()
	if err != nil {
		return err.Error()
	}
	seen := 0
	for _, node := range in.Nodes {
		n := b.nodes[node.Name]
		if n == nil {
			return "unknown node " + node.Name
		}
		seen++
		var sum uint64
		for _, d := range node.Devs {
			info, _ := n.gpus.GPU(d.ID)
			if d.UsedGPU != want[node.Name][d.ID] || d.TotalGPU != info.Units {
				return fmt.Sprintf("node %s GPU %d: extender %d/%d, checkpoint %d, published size %d", node.Name, d.ID, d.UsedGPU, d.TotalGPU, want[node.Name][d.ID], info.Units)
			}
			sum += d.UsedGPU
		}
		if len(node.Devs) != len(n.gpus.GPUs) || node.UsedGPU != sum || node.TotalGPU != uint64(n.total) {
			return fmt.Sprintf("node %s: extender %d/%d over %d GPUs", node.Name, node.UsedGPU, node.TotalGPU, len(node.Devs))
		}
	}
	if seen != len(b.nodes) {
		return fmt.Sprintf("extender shows %d nodes, the bed has %d", seen, len(b.nodes))
	}
	return ""
}

// Issue 4's headline through the whole system: 46 pods (52 GPU containers) created at once onto
// one node with 8 simulated H200s, scheduled by the real kube-scheduler and our extender,
// admitted by the real kubelet device manager and served by our plugin. Every pod runs and every
// container's checkpoint env names exactly the GPU its pod's annotations name. Then issue 5's
// check on the same cluster: inspector = extender = checkpoints.
func TestSystemBurst(t *testing.T) {
	t.Parallel()
	b := startSystem(t)
	node := b.addNode(t, "h200", "simulated:dgxh200")
	for _, g := range node.gpus.GPUs {
		if g.Units < 100 {
			t.Fatalf("GPU %d has %d units; the burst is sized for 141", g.Index, g.Units)
		}
	}
	specs := h200Burst()
	began := time.Now()
	pods := b.createBurst(t, specs)
	items := b.waitAllRunning(t, pods, systemWait)
	t.Logf("%d pods (%d GPU containers) created at once: all Running after %v", len(pods), containerCount(specs), time.Since(began).Round(time.Millisecond))
	v := b.verifySystem(t, items)
	checkSpread(t, v)
	if n := b.holdBacks(t); n == 0 {
		t.Error("the scheduler reported no hold-back by the extender: the burst did not exercise the race-free rule")
	} else {
		t.Logf("the scheduler reported %d hold-backs by the extender's race-free rule", n)
	}
	b.compareViews(t, v)
}

// holdBacks counts the scheduler's FailedScheduling events (each aggregated repeat included)
// whose message is the extender's hold-back reason ("waiting for ..."): proof that the race-free
// rule actually held pods back during the burst.
func (b *systemBed) holdBacks(t testing.TB) int {
	n := 0
	for _, count := range b.heldBack(t) {
		n += count
	}
	return n
}

// heldBack counts the scheduler's FailedScheduling events that name a hold-back, by pod.
func (b *systemBed) heldBack(t testing.TB) map[string]int {
	t.Helper()
	l, err := b.client.EventsV1().Events("default").List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, e := range l.Items {
		if e.Reason == "FailedScheduling" && strings.Contains(e.Note, "waiting for") {
			out[e.Regarding.Name]++
			if e.Series != nil {
				out[e.Regarding.Name] += int(e.Series.Count) - 1
			}
		}
	}
	return out
}

// checkSpread asserts what the burst is designed to exercise: equal sizes on several GPUs (the
// extender had to hold some back), several pods per GPU.
func checkSpread(t *testing.T, v verified) {
	t.Helper()
	for _, size := range []uint64{12, 18} {
		if len(v.gpusOfSize[size]) < 2 {
			t.Errorf("%d-unit containers all on GPUs %v; the burst must spread them", size, slices.Sorted(maps.Keys(v.gpusOfSize[size])))
		}
	}
	t.Logf("GPUs per container size: %v", v.gpusOfSize)
}

// A kubelet restart in the middle of the burst: some pods run, others are bound and waiting for
// admission. The plugin re-registers (timed), capacity comes back, the running pods keep their
// devices and env in the checkpoint, the rest still start, and the same invariants hold.
func TestSystemKubeletRestart(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := startSystem(t)
	b.kubeletAPILimits = true // as a real kubelet runs: it re-admits its pods at once after a restart
	node := b.addNode(t, "h200", "simulated:dgxh200")
	specs := h200Burst()
	began := time.Now()
	pods := b.createBurst(t, specs)

	const before = 10
	var items []corev1.Pod
	pollUntil(t, systemWait, fmt.Sprintf("%d pods running", before), func() bool {
		items = b.listPods(t, pods)
		return running(t, items) >= before
	})
	cp, err := node.kubelet.Checkpoint()
	if err != nil {
		t.Fatal(err)
	}
	kept := map[string]held{} // pod/container → held before the restart
	bound := 0
	for _, p := range items {
		if p.Spec.NodeName != "" {
			bound++
		}
		if p.Status.Phase != corev1.PodRunning {
			continue
		}
		reqs, err := gpushare.ContainerRequests(&p)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range reqs {
			e := findEntry(cp, string(p.UID), r.Name)
			if e == nil {
				t.Fatalf("running pod %s container %s has no checkpoint entry", p.Name, r.Name)
			}
			kept[string(p.UID)+"/"+r.Name] = held{devices: e.DeviceIDs, env: e.Envs}
		}
	}
	runningAtRestart := running(t, items)
	if runningAtRestart == len(items) {
		t.Fatal("the whole burst ran before the kubelet restart; nothing was restarted mid-way")
	}

	restarted := time.Now()
	reg := watchReRegistration(t, node.kubelet)
	if err := node.kubelet.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	registered := node.plugin.waitRegistered(t)
	socket, devices := reg.wait(t)
	back := waitCapacity(t, b.c, node.kubelet.Name(), node.total)
	if registered.Before(restarted) {
		t.Errorf("the plugin's registration at %v predates the restart at %v", registered, restarted)
	}
	t.Logf("kubelet restarted %v after the burst with %d of %d pods running and %d bound: plugin registered again %v after the restart began, capacity back after %v",
		restarted.Sub(began).Round(time.Millisecond), runningAtRestart, len(items), bound,
		registered.Sub(restarted).Round(time.Millisecond), back.Sub(restarted).Round(time.Millisecond))
	t.Logf("after kubelet.sock reappeared: the plugin registered in %v, the kubelet had its devices in %v",
		registered.Sub(socket).Round(100*time.Microsecond), devices.Sub(socket).Round(100*time.Microsecond))

	if took := devices.Sub(socket); took > reRegisterWithin {
		t.Errorf("the kubelet had our devices %v after kubelet.sock reappeared; want within %v", took, reRegisterWithin)
	}
	if lost := b.dropKubeletRefusals(t, pods, systemWait); len(lost) > 0 {
		t.Logf("the kubelet refused %v at admission before it had our devices (kubernetes/kubernetes#133382)", lost)
	}
	items = b.waitAllRunning(t, pods, systemWait)
	t.Logf("%d pods (%d GPU containers): all Running after %v", len(pods), containerCount(specs), time.Since(began).Round(time.Millisecond))
	v := b.verifySystem(t, items)
	for key, h := range kept {
		after, ok := v.entries[key]
		if !ok || !slices.Equal(after.devices, h.devices) || !maps.Equal(after.env, h.env) {
			t.Errorf("%s held %v %v before the kubelet restart and %v %v after", key, h.devices, h.env, after.devices, after.env)
		}
	}
	t.Logf("%d containers of pods running before the restart kept their devices and env", len(kept))
	b.compareViews(t, v)
}

// Issue 5's check on mixed hardware: two hollow nodes with simulated:mixed GPUs (two H100s, two
// A100 40GB each), a burst of pods over both, then inspector = extender = checkpoints per GPU.
func TestSystemMixedInspect(t *testing.T) {
	t.Parallel()
	b := startSystem(t)
	for _, name := range []string{"mixed-a", "mixed-b"} {
		n := b.addNode(t, name, "simulated:mixed")
		sizes := map[uint64]bool{}
		for _, g := range n.gpus.GPUs {
			sizes[g.Units] = true
		}
		if len(sizes) < 2 {
			t.Fatalf("node %s: GPUs %+v are not of mixed sizes", name, n.gpus.GPUs)
		}
	}
	var specs []sysPod
	for i := range 6 {
		specs = append(specs, sysPod{name: fmt.Sprintf("m05-%02d", i), sizes: []int64{5}})
	}
	for i := range 5 {
		specs = append(specs, sysPod{name: fmt.Sprintf("m10-%02d", i), sizes: []int64{10}})
	}
	for i := range 5 {
		specs = append(specs, sysPod{name: fmt.Sprintf("m15-%02d", i), sizes: []int64{15}})
	}
	for i := range 2 {
		specs = append(specs, sysPod{name: fmt.Sprintf("mpair-%02d", i), sizes: []int64{5, 10}})
	}
	// 45 units fit no A100 40GB and both containers together no H100: split over a node's H100s.
	specs = append(specs, sysPod{name: "msplit-00", sizes: []int64{45, 45}})
	specs = append(specs, sysPod{name: "mside-00", sizes: []int64{6}, sidecar: 2})
	began := time.Now()
	pods := b.createBurst(t, specs)
	items := b.waitAllRunning(t, pods, systemWait)
	perNode := map[string]int{}
	for _, p := range items {
		perNode[p.Spec.NodeName]++
	}
	t.Logf("%d pods (%d GPU containers) over %v: all Running after %v", len(pods), containerCount(specs), perNode, time.Since(began).Round(time.Millisecond))
	v := b.verifySystem(t, items)
	b.compareViews(t, v)
}

// reRegistration times a kubelet restart from the device plugin's side: when kubelet.sock
// reappears, and when the kubelet's device manager first has healthy devices of ours (its
// pod-resources GetAllocatableResources answers them: the plugin registered and its first
// ListAndWatch list arrived). Before that moment the kubelet refuses every pod it admits that
// needs gpu-mem ("no healthy devices present").
type reRegistration struct {
	socket, devices chan time.Time
}

// watchReRegistration starts watching k's device-plugin directory; call it before the restart.
func watchReRegistration(t *testing.T, k *cluster.Kubelet) *reRegistration {
	t.Helper()
	w, err := fsnotify.NewWatcher()
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Add(k.DevicePluginDir()); err != nil {
		w.Close()
		t.Fatal(err)
	}
	r := &reRegistration{socket: make(chan time.Time, 1), devices: make(chan time.Time, 1)}
	ctx := t.Context()
	go func() {
		defer w.Close()
		for {
			select {
			case <-ctx.Done():
				return
			case ev := <-w.Events:
				if ev.Name == k.RegistrationSocket() && ev.Has(fsnotify.Create) {
					r.socket <- time.Now()
					r.devices <- firstDevices(ctx, k.PodResourcesSocket())
					return
				}
			}
		}
	}()
	return r
}

// firstDevices asks the kubelet for its allocatable gpu-mem devices until it names some, and
// returns when it first did; the zero time if ctx ends first.
func firstDevices(ctx context.Context, socket string) time.Time {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return time.Time{}
	}
	defer conn.Close()
	api := podresourcesv1.NewPodResourcesListerClient(conn)
	for ctx.Err() == nil {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		resp, err := api.GetAllocatableResources(cctx, &podresourcesv1.AllocatableResourcesRequest{}, grpc.WaitForReady(true))
		cancel()
		for _, d := range resp.GetDevices() {
			if err == nil && d.ResourceName == string(gpushare.ResourceName) && len(d.DeviceIds) > 0 {
				return time.Now()
			}
		}
		time.Sleep(time.Millisecond) // poll pacing: the figure's resolution
	}
	return time.Time{}
}

// wait returns when kubelet.sock reappeared and when the kubelet first had our devices.
func (r *reRegistration) wait(t *testing.T) (socket, devices time.Time) {
	t.Helper()
	for _, c := range []struct {
		ch  chan time.Time
		out *time.Time
	}{{r.socket, &socket}, {r.devices, &devices}} {
		select {
		case *c.out = <-c.ch:
		case <-time.After(waitLong):
			t.Fatal("kubelet.sock did not reappear, or the kubelet never listed our devices")
		}
	}
	return socket, devices
}

// reRegisterWithin bounds the time from kubelet.sock reappearing to the kubelet having our devices
// (measured 30-180 ms on the shared 2-core machine with -race): registering again must not wait
// for anything else the plugin does.
const reRegisterWithin = 2 * time.Second

// kubeletRefused tells whether the kubelet itself refused p at admission because it had no device
// of ours yet: a restarted kubelet admits its pods again at once, before any device plugin can have
// registered again and sent its first list, and refuses each that needs a device
// (devicemanager.devicesToAllocate; kubernetes/kubernetes#133382, open). Our plugin's refusals
// read "gpushare: ...".
func kubeletRefused(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodFailed && p.Status.Reason == "UnexpectedAdmissionError" &&
		(strings.Contains(p.Status.Message, "no healthy devices present") || strings.Contains(p.Status.Message, "unregistered device"))
}

// dropKubeletRefusals waits until every pod of names runs with its record or was refused by the
// kubelet itself (kubeletRefused), removes the refused ones from names and returns them; any other
// failure fails the test.
func (b *systemBed) dropKubeletRefusals(t testing.TB, names map[string]*corev1.Pod, timeout time.Duration) []string {
	t.Helper()
	var refused []string
	pollUntil(t, timeout, "every pod running or refused by the kubelet", func() bool {
		refused = refused[:0]
		settled := 0
		for _, p := range b.listPods(t, names) {
			switch {
			case kubeletRefused(&p):
				refused = append(refused, p.Name)
				settled++
			case p.Status.Phase == corev1.PodFailed:
				t.Fatalf("pod %s failed on node %q: %s: %s", p.Name, p.Spec.NodeName, p.Status.Reason, p.Status.Message)
			case runningAndRecorded(&p):
				settled++
			}
		}
		return settled == len(names)
	})
	for _, name := range refused {
		delete(names, name)
	}
	return refused
}
