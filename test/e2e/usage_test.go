//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpushare/gpushare/inspector/collect"
	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/manager"
	"github.com/gpushare/gpushare/plugin/nvml"
	"github.com/gpushare/gpushare/plugin/podsource"
	"github.com/gpushare/gpushare/plugin/usage"
	"github.com/gpushare/gpushare/plugin/usage/cgroup"
	"github.com/gpushare/gpushare/test/cluster"
)

// TestUsage (issue 26): simulated processes in three containers on two GPUs, one container above
// its slice. The usage loop, on the plugin's simulated NVML and the bed's API server, names
// exactly that one in the metrics, the node's summary (the inspector's USED) and a
// GPUShareOverUse Event, within the grace period plus one interval of the processes appearing.
//
// The bed's fake runtime names containers "<pod>_<ns>_<uid>_..." where real runtimes use 64 hex
// digits, so no real-form cgroup path can carry them: processes reach their containers through
// the loop's Owner hook here, and through /proc/<pid>/cgroup in plugin/usage's tests (real-form
// files) and plugin/usage/cgroup's (real samples).
func TestUsage(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := startSystem(t)
	sim := simulator(t, "simulated:dgxh100")
	b.addNodeWith(t, "use-node", sim, nil)

	// a: two containers of 4 GiB on one GPU; big: 76 GiB, which cannot share a.'s GPU.
	a := runPod(t, b, sysPod{name: "use-a", sizes: []int64{4, 4}}.object())
	big := runPod(t, b, sysPod{name: "use-big", sizes: []int64{76}}.object())
	gpuA, gpuBig := assignedGPU(t, a), assignedGPU(t, big)
	if gpuA == gpuBig {
		t.Fatalf("both pods on GPU %d", gpuA)
	}

	owners := map[uint32]cgroup.Owner{}
	place := func(pod *corev1.Pod, container string, pid uint32) {
		for _, s := range pod.Status.ContainerStatuses {
			if s.Name == container {
				_, id, _ := strings.Cut(s.ContainerID, "://")
				owners[pid] = cgroup.Owner{PodUID: string(pod.UID), ContainerID: strings.ToLower(id)}
				return
			}
		}
		t.Fatalf("pod %s has no running container %s", pod.Name, container)
	}
	place(a, "c0", 1001)
	place(a, "c1", 1002)
	place(big, "c0", 2001)
	const gib = 1 << 30
	proc := func(pid uint32, bytes uint64) nvml.Process {
		return nvml.Process{PID: pid, UsedBytes: bytes, UsedKnown: true}
	}

	client, err := b.c.ClientWithLimits(manager.DefaultKubeAPIQPS, manager.DefaultKubeAPIBurst)
	if err != nil {
		t.Fatal(err)
	}
	pods := podsource.New(client, "use-node", zaptest.NewLogger(t))
	if err := pods.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pods.Shutdown)
	events, stopEvents := manager.StartEventRecorder(ctx, client)
	t.Cleanup(stopEvents)
	reg := prometheus.NewRegistry()
	metrics, err := usage.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	const interval, grace = time.Second, 4 * time.Second
	// PublishEvery 1 s: a pod's record can reach the loop's watch a reading after its processes
	// (the plugin writes it at Allocate, the watch delivers it later); the summary then shows the
	// container without a slice until the next write, 30 s later by default.
	loop, err := usage.New(usage.Config{GPUs: sim, Pods: pods.Pods, Unit: gpushare.GiB, Interval: interval, Grace: grace, PublishEvery: time.Second,
		Owner: func(pid uint32) (cgroup.Owner, bool, error) {
			o, ok := owners[pid]
			return o, ok, nil
		},
		Metrics: metrics, Events: events, Publish: usage.NodePublisher(client, "use-node", "gpushare-device-plugin"), Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}

	// c0 3 of 4 GiB, c1 6 of 4 (over), big's c0 50 of 76, and a host process on big's GPU.
	if err := sim.SetProcesses(gpuA, []nvml.Process{proc(1001, 3*gib), proc(1002, 6*gib)}); err != nil {
		t.Fatal(err)
	}
	if err := sim.SetProcesses(gpuBig, []nvml.Process{proc(2001, 50*gib), proc(7, gib)}); err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	go loop.Run(ctx)

	ev := waitEvent(t, b.client, "default", a.UID, gpushare.EventReasonOverUse)
	want := fmt.Sprintf("container c1 uses 6.0 GiB of GPU %d (%s), above its slice of 4.0 GiB, for ", gpuA, gpuUUID(t, sim, gpuA))
	if !strings.HasPrefix(ev.Note, want) || ev.Type != corev1.EventTypeWarning || ev.ReportingController != gpushare.EventControllerDevicePlugin {
		t.Errorf("over-use event %s %q by %s; want Warning %q... by the plugin", ev.Type, ev.Note, ev.ReportingController, want)
	}
	if late := ev.EventTime.Sub(started); late > grace+2*interval {
		t.Errorf("the event came %v after the processes; want within the grace (%v) and an interval", late, grace)
	}

	// The metrics name the same one: three containers measured, c1 alone over.
	if n, err := testutil.GatherAndCount(reg, "gpushare_container_memory_over_slice"); err != nil || n != 3 {
		t.Errorf("%d over-slice series (%v); want the three containers", n, err)
	}
	for _, c := range []struct {
		pod, container string
		gpu            int
		over           float64
	}{{"use-a", "c0", gpuA, 0}, {"use-a", "c1", gpuA, 1}, {"use-big", "c0", gpuBig, 0}} {
		if v := gaugeValue(t, reg, "gpushare_container_memory_over_slice", "default", c.pod, c.container, c.gpu); v != c.over {
			t.Errorf("%s/%s over-slice = %v, want %v", c.pod, c.container, v, c.over)
		}
	}

	// The node's summary, through the inspector: USED for each container, c1 alone over.
	var n collect.Node
	used := map[string]string{}
	wantUsed := map[string]string{"use-a/c0": "3072 over=false", "use-a/c1": "6144 over=true", "use-big/c0": "51200 over=false"}
	pollUntil(t, waitLong, "the inspector shows each container's use on use-node", func() bool {
		var report collect.Report
		code, out, _ := inspect(ctx, "--kubeconfig", b.c.AdminKubeconfig(), "-o", "json")
		if code != 0 || json.Unmarshal([]byte(out), &report) != nil || len(report.Nodes) != 1 || report.Nodes[0].Usage == nil {
			return false
		}
		n, used = report.Nodes[0], map[string]string{}
		for _, p := range n.Pods {
			for _, c := range p.Containers {
				if c.UsedMiB != nil {
					used[p.Name+"/"+c.Name] = fmt.Sprintf("%d over=%v", *c.UsedMiB, c.OverSlice)
				}
			}
		}
		return fmt.Sprint(used) == fmt.Sprint(wantUsed)
	})
	if n.Usage.OverSlice != 1 || n.Usage.UsedMiB != 60*1024 {
		t.Errorf("inspector: used %v, %d over, %d MiB in use; want %v, 1, %d", used, n.Usage.OverSlice, n.Usage.UsedMiB, wantUsed, 60*1024)
	}
	// A steady node writes nothing: over five more readings the summary stays as it was.
	node, err := b.client.CoreV1().Nodes().Get(ctx, "use-node", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	summary := node.Annotations[gpushare.AnnotationNodeUsage]
	reads := readsOK(t, reg)
	pollUntil(t, waitLong, "five more readings", func() bool { return readsOK(t, reg) >= reads+5 })
	if node, err = b.client.CoreV1().Nodes().Get(ctx, "use-node", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	if node.Annotations[gpushare.AnnotationNodeUsage] != summary {
		t.Errorf("the summary was rewritten while nothing moved:\n%s\nthen\n%s", summary, node.Annotations[gpushare.AnnotationNodeUsage])
	}
	code, out, _ := inspect(ctx, "--kubeconfig", b.c.AdminKubeconfig(), "-d")
	if code != 0 || !strings.Contains(out, "6.0 (over)") || !strings.Contains(out, "1 container over its slice") {
		t.Errorf("inspect -d exit %d:\n%s\nwant c1's USED marked over", code, out)
	}
	list, err := b.client.EventsV1().Events("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range list.Items {
		if e.Reason == gpushare.EventReasonOverUse && e.Regarding.UID != a.UID {
			t.Errorf("over-use event on %s: %q; only use-a is over its slice", e.Regarding.Name, e.Note)
		}
	}
}

// runPod creates p, waits until it runs and returns it.
func runPod(t *testing.T, b *systemBed, p *corev1.Pod) *corev1.Pod {
	t.Helper()
	if _, err := b.client.CoreV1().Pods(p.Namespace).Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := b.c.WaitForPod(t.Context(), p.Namespace, p.Name, waitLong, "running", cluster.PodRunning)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// assignedGPU is the GPU the extender placed p on.
func assignedGPU(t *testing.T, p *corev1.Pod) int {
	t.Helper()
	a, ok, err := gpushare.DecodePodAssignment(p.Annotations)
	if !ok || err != nil {
		t.Fatalf("pod %s has no assignment: %v", p.Name, err)
	}
	return a.GPUIndex
}

// gpuUUID is the UUID of the simulated GPU at index.
func gpuUUID(t *testing.T, lib nvml.Library, index int) string {
	t.Helper()
	gpus, err := lib.Devices()
	if err != nil {
		t.Fatal(err)
	}
	return gpus[index].UUID
}

// gaugeValue is the value of the series name{namespace, pod, container, gpu} in reg; it fails the
// test when there is none.
func gaugeValue(t *testing.T, reg prometheus.Gatherer, name, namespace, pod, container string, gpu int) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"namespace": namespace, "pod": pod, "container": container, "gpu": fmt.Sprint(gpu)}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			if fmt.Sprint(got) == fmt.Sprint(want) {
				return m.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("no series %s%v", name, want)
	return 0
}

// readsOK is the loop's count of successful readings.
func readsOK(t *testing.T, reg prometheus.Gatherer) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "gpushare_usage_reads_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" && l.GetValue() == "ok" {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatal("no gpushare_usage_reads_total{outcome=\"ok\"}")
	return 0
}
