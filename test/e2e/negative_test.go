//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/test/cluster"
)

// envMismatches compares, for every gpu-mem container of pod, the environment the kubelet's
// checkpoint holds with the one the pod's annotations name (devUnits per GPU): the race-free
// claim's check. It returns one line per container that differs or is missing.
func envMismatches(cp cluster.Checkpoint, pod *corev1.Pod, devUnits uint64) []string {
	reqs, err := gpushare.ContainerRequests(pod)
	if err != nil {
		return []string{fmt.Sprintf("pod %s: %v", pod.Name, err)}
	}
	asg, placed, err := gpushare.DecodePodAssignment(pod.Annotations)
	if err != nil || !placed {
		return []string{fmt.Sprintf("pod %s: assignment %v, %v", pod.Name, placed, err)}
	}
	var out []string
	for _, r := range reqs {
		set, err := asg.SetFor(r)
		if err != nil {
			out = append(out, fmt.Sprintf("pod %s container %s: %v", pod.Name, r.Name, err))
			continue
		}
		want := expectedEnv(pod, reqs, r, set, devUnits, gpushare.IsolationNone)
		entry := findEntry(cp, string(pod.UID), r.Name)
		if entry == nil {
			out = append(out, fmt.Sprintf("pod %s container %s: no checkpoint entry", pod.Name, r.Name))
			continue
		}
		if got, err := gpushare.ParseContainerEnv(entry.Envs); err != nil || got != want {
			out = append(out, fmt.Sprintf("pod %s container %s: checkpoint env %+v (%v); its annotations name %+v", pod.Name, r.Name, got, err, want))
		}
		if uint64(len(entry.DeviceIDs)) != r.Units {
			out = append(out, fmt.Sprintf("pod %s container %s: %d device IDs for %d units", pod.Name, r.Name, len(entry.DeviceIDs), r.Units))
		}
	}
	return out
}

// checkpointOvercommit sums, per GPU, the units every container of the given pods runs with by
// the kubelet's checkpoint (the GPUs and container units of its environment, split evenly over
// a multi-GPU container's GPUs; init containers count by the Kubernetes rule, as
// gpushare.ChargesBySet does) and lists each GPU whose total
// exceeds gpuUnits: the over-commit check on what containers really got.
func checkpointOvercommit(cp cluster.Checkpoint, pods []*corev1.Pod, gpuUnits uint64) []string {
	used := map[int]uint64{}
	holders := map[int][]string{}
	for _, pod := range pods {
		reqs, err := gpushare.ContainerRequests(pod)
		if err != nil {
			continue
		}
		gpuOf := map[string]gpushare.GPUSet{}
		for _, r := range reqs {
			if e := findEntry(cp, string(pod.UID), r.Name); e != nil {
				if env, err := gpushare.ParseContainerEnv(e.Envs); err == nil {
					gpuOf[r.Name] = env.Set()
				}
			}
		}
		var served []gpushare.ContainerRequest
		for _, r := range reqs {
			if _, ok := gpuOf[r.Name]; ok {
				served = append(served, r)
			}
		}
		for g, u := range gpushare.ChargesBySet(served, func(r gpushare.ContainerRequest) gpushare.GPUSet { return gpuOf[r.Name] }) {
			used[g] += u
			holders[g] = append(holders[g], pod.Name+"="+strconv.FormatUint(u, 10))
		}
	}
	var out []string
	for _, g := range slices.Sorted(maps.Keys(used)) {
		if used[g] > gpuUnits {
			out = append(out, fmt.Sprintf("GPU %d runs containers of %d units, more than its %d (%s)", g, used[g], gpuUnits, strings.Join(holders[g], ", ")))
		}
	}
	return out
}

// naivePlugin answers Allocate the way the old gpushare plugin did, with none of our rules: the
// oldest pod of the node (by assume time) that it has not served yet and whose *pod* units equal
// the call's device count gets the environment its annotations name. No hold-back makes equal
// sizes share a signature, no check stops an over-committed GPU, nothing asks the kubelet whose
// container got the answer. Its first call waits until it sees `expect` pods, so that the order
// the kubelet serves pods in and the order it matches them in can be made to differ.
type naivePlugin struct {
	pluginapi.UnimplementedDevicePluginServer
	client   kubernetes.Interface
	node     string
	gpuUnits uint64
	gpus     int
	dir      string
	expect   int

	mu      sync.Mutex
	served  map[string]bool
	calls   int
	arrived chan struct{} // closed at the first call
}

func (p *naivePlugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (p *naivePlugin) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	resp := &pluginapi.ListAndWatchResponse{}
	for g := range p.gpus {
		for j := range p.gpuUnits {
			resp.Devices = append(resp.Devices, &pluginapi.Device{ID: fmt.Sprintf("naive-%d-%02d", g, j), Health: pluginapi.Healthy})
		}
	}
	if err := stream.Send(resp); err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
}

func (p *naivePlugin) Allocate(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.calls++; p.calls == 1 {
		close(p.arrived)
	}
	pods, err := p.waitPods(ctx)
	if err != nil {
		return nil, err
	}
	resp := &pluginapi.AllocateResponse{}
	for _, c := range req.ContainerRequests {
		n := uint64(len(c.DevicesIds))
		var chosen *gpushare.PodAssignment
		var name string
		for _, pod := range pods {
			asg, placed, err := gpushare.DecodePodAssignment(pod.Annotations)
			if err != nil || !placed || p.served[pod.Name] || asg.PodUnits != n {
				continue
			}
			if chosen == nil || asg.AssumeTime < chosen.AssumeTime {
				chosen, name = &asg, pod.Name
			}
		}
		if chosen == nil {
			return nil, fmt.Errorf("naive plugin: no pod of %d units", n)
		}
		p.served[name] = true
		env := gpushare.ContainerEnv{GPUIndex: chosen.GPUIndex, PodUnits: n, ContainerUnits: n, DevUnits: p.gpuUnits, Isolation: gpushare.IsolationNone}
		if set, _ := chosen.MultiSet(); set != 0 {
			env.GPUs = set
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{Envs: env.Map()})
	}
	return resp, nil
}

// waitPods lists the node's pods until at least expect are there (the first call only).
func (p *naivePlugin) waitPods(ctx context.Context) ([]corev1.Pod, error) {
	var pods []corev1.Pod
	err := cluster.Poll(ctx, 30*time.Second, "the naive plugin sees its pods", func(ctx context.Context) (bool, error) {
		l, err := p.client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + p.node})
		if err != nil {
			return false, nil
		}
		pods = l.Items
		return len(pods) >= p.expect || p.calls > 1, nil
	})
	sort.Slice(pods, func(i, j int) bool { return pods[i].Name < pods[j].Name })
	return pods, err
}

// start serves on the kubelet's device-plugin directory and registers as the gpu-mem resource.
func (p *naivePlugin) start(t *testing.T) {
	t.Helper()
	sock := filepath.Join(p.dir, "naive.sock")
	_ = os.Remove(sock)
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("unix://"+filepath.Join(p.dir, "kubelet.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := pluginapi.NewRegistrationClient(conn).Register(t.Context(), &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: "naive.sock", ResourceName: string(gpushare.ResourceName),
	}); err != nil {
		t.Fatal(err)
	}
}

// The negative control: the checks the race-free and over-commit tests rely on (the kubelet's
// checkpoint against the pods' annotations, and per-GPU totals of what containers really got) do
// fail when the rules they guard are off. With the hold-back rule off (two in-flight pods of equal
// size with different GPU sets, annotated by hand: the older on GPU 0, the younger split over GPUs
// 0 and 1) and no check on the node (a plugin without our rules, as the old one), the kubelet
// serves the younger pod first and the two are swapped, each running on the other's GPUs; two
// more pods annotated onto a GPU that cannot hold them all run on it. The same checks that pass
// in TestPluginManyPodsRaceFree and TestPluginRefusesOvercommit must report exactly these.
func TestNegativeControlChecksCatchSwapAndOvercommit(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	c := cluster.StartT(t, cluster.Config{NoScheduler: true})
	kubelet, err := c.AddKubelet(ctx, "gpu-0", cluster.KubeletOptions{})
	if err != nil {
		t.Fatal(err)
	}
	const gpuUnits = 16
	p := &naivePlugin{client: c.Client(), node: kubelet.Name(), gpuUnits: gpuUnits, gpus: 2, dir: kubelet.DevicePluginDir(),
		expect: 2, served: map[string]bool{}, arrived: make(chan struct{})}
	p.start(t)
	waitCapacity(t, c, kubelet.Name(), 2*gpuUnits)

	now := time.Now()
	young := podSpec{name: "young", sizes: []int64{4}, set: []int{0, 1}}.object(kubelet.Name(), gpuUnits, now.Add(10*time.Second))
	old := podSpec{name: "old", sizes: []int64{4}, gpus: []int{0}}.object(kubelet.Name(), gpuUnits, now)
	pods := createAll(t, c.Client(), []*corev1.Pod{young})
	select { // the kubelet is serving young; old, matched first by the plugin, appears meanwhile
	case <-p.arrived:
	case <-time.After(waitLong):
		t.Fatal("the kubelet never called Allocate for young")
	}
	for k, v := range createAll(t, c.Client(), []*corev1.Pod{old}) {
		pods[k] = v
	}
	for k, v := range createAll(t, c.Client(), []*corev1.Pod{
		podSpec{name: "big-a", sizes: []int64{12}, gpus: []int{0}}.object(kubelet.Name(), gpuUnits, now.Add(time.Minute)),
		podSpec{name: "big-b", sizes: []int64{12}, gpus: []int{0}}.object(kubelet.Name(), gpuUnits, now.Add(2*time.Minute)),
	}) {
		pods[k] = v
	}
	for _, name := range slices.Sorted(maps.Keys(pods)) {
		if _, err := c.WaitForPod(ctx, "default", name, waitLong, "running", cluster.PodRunning); err != nil {
			t.Fatal(err)
		}
	}
	cp, err := kubelet.Checkpoint()
	if err != nil {
		t.Fatal(err)
	}
	var all []*corev1.Pod
	var mismatches []string
	for _, name := range []string{"big-a", "big-b", "old", "young"} {
		live, err := c.Client().CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, live)
		mismatches = append(mismatches, envMismatches(cp, live, gpuUnits)...)
	}
	t.Logf("the env check reports:\n%s", strings.Join(mismatches, "\n"))
	if len(mismatches) != 2 || !strings.Contains(mismatches[0], "pod old ") || !strings.Contains(mismatches[1], "pod young ") {
		t.Errorf("the env check should report exactly the swapped pods old and young; it reports %q", mismatches)
	}
	over := checkpointOvercommit(cp, all, gpuUnits)
	t.Logf("the over-commit check reports: %q", over)
	if len(over) != 1 || !strings.Contains(over[0], "GPU 0 runs containers of 30 units") {
		t.Errorf("the over-commit check should report GPU 0 with young 4 + old 2 (its half of young's two GPUs) + big-a 12 + big-b 12 = 30 units; it reports %q", over)
	}
}
