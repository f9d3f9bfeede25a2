//go:build e2e

package e2e

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

// multiPod is a pod in ACK's multi-GPU form: label aliyun.com/gpu-count, and optionally
// gpushare.io/topology: required; node pins it to one node ("" lets the scheduler choose).
type multiPod struct {
	sysPod
	count    int
	required bool
	node     string
}

func (m multiPod) object() *corev1.Pod {
	o := m.sysPod.object()
	if m.count > 0 {
		o.Labels = map[string]string{gpushare.LabelPodGPUCount: strconv.Itoa(m.count)}
	}
	if m.required {
		o.Annotations = map[string]string{gpushare.AnnotationTopology: gpushare.TopologyRequired}
	}
	if m.node != "" {
		o.Spec.NodeSelector = map[string]string{corev1.LabelHostname: m.node}
	}
	return o
}

// topologyNodes are four 8 × 80 GiB machines, one per simulated topology profile.
var topologyNodes = map[string]string{
	"topo-nvswitch": "simulated:dgxh100:topology=nvswitch",
	"topo-islands":  "simulated:dgxh100:topology=islands",
	"topo-pcie":     "simulated:dgxh100:topology=pcie",
	"topo-mixed":    "simulated:dgxh100:topology=mixed",
}

// multiBurst mixes one-, two- and four-GPU pods over the four nodes: sizes repeat between
// single-GPU containers and multi-GPU ones (a 16-unit container is 16 on one GPU, or 8 on each of
// two), so the hold-back rule must keep apart containers whose sets differ; a few pods require
// NVLink. 952 of 2560 units (60 more for the pinned pods): every pod fits whatever the order.
func multiBurst() []multiPod {
	var pods []multiPod
	add := func(prefix string, n, count int, required bool, sizes ...int64) {
		for i := range n {
			pods = append(pods, multiPod{sysPod: sysPod{name: fmt.Sprintf("%s-%02d", prefix, i), sizes: sizes}, count: count, required: required})
		}
	}
	add("one-08", 12, 0, false, 8)
	add("one-16", 10, 0, false, 16)
	add("two-16", 8, 2, false, 16)
	add("two-32", 6, 2, false, 32)
	add("two-req", 4, 2, true, 24)
	add("four-32", 4, 4, false, 32)
	add("four-req", 2, 4, true, 40)
	add("two-pair", 3, 2, false, 8, 16)
	return pods
}

// TestMultiGPUTopology: pods in ACK's multi-GPU form on four nodes, one per topology profile,
// through the real kube-scheduler, our extender and device plugins, and the kubelet's device
// manager. Pinned pods first, on free GPUs: a one-GPU pod takes a GPU without NVLink, keeping the
// NVLink pairs free; a two-GPU pod then gets the best connected pair; a four-GPU pod that
// requires NVLink gets one island; a pod requiring NVLink on the PCIe-only node, and one whose
// units do not divide by its GPU count, are refused with their reasons as scheduler Events. Then a
// burst mixing single- and multi-GPU pods: every container's checkpoint env equals its
// annotations (whole GPU set included), every GPU's total adds up in annotations, checkpoints,
// inspector and extender, every set has its count of GPUs, and required sets are all NVLink.
func TestMultiGPUTopology(t *testing.T) {
	t.Parallel()
	b := startSystem(t)
	for name, backend := range topologyNodes {
		b.addNode(t, name, backend)
	}
	ctx := t.Context()
	for _, p := range []struct {
		pod  multiPod
		want func(node gpushare.NodeGPUs) gpushare.GPUSet
		why  string
	}{
		{multiPod{sysPod: sysPod{name: "pin-single", sizes: []int64{8}}, node: "topo-mixed"},
			func(gpushare.NodeGPUs) gpushare.GPUSet { return gpushare.NewGPUSet(4) }, "the lowest GPU without NVLink: GPUs 0-3 stay free for pairs"},
		{multiPod{sysPod: sysPod{name: "pin-pair", sizes: []int64{20}}, count: 2, node: "topo-mixed"},
			bestPair, "the pair with the most NVLink links"},
		{multiPod{sysPod: sysPod{name: "pin-island", sizes: []int64{32}}, count: 4, required: true, node: "topo-islands"},
			func(gpushare.NodeGPUs) gpushare.GPUSet { return gpushare.NewGPUSet(0, 1, 2, 3) }, "the first NVLink island"},
	} {
		createAll(t, b.client, []*corev1.Pod{p.pod.object()})
		got := b.waitAllRunning(t, map[string]*corev1.Pod{p.pod.name: nil}, waitLong)[0]
		asg, _, err := gpushare.DecodePodAssignment(got.Annotations)
		if err != nil {
			t.Fatal(err)
		}
		set, err := asg.SetFor(gpushare.ContainerRequest{Name: "c0", Index: 0, Units: uint64(p.pod.sizes[0])})
		if err != nil {
			t.Fatal(err)
		}
		if want := p.want(b.nodes[p.pod.node].gpus); set != want {
			t.Errorf("pod %s on %s got GPUs %s, want %s (%s)", p.pod.name, p.pod.node, set, want, p.why)
		} else {
			t.Logf("pod %s on %s: GPUs %s, %s", p.pod.name, p.pod.node, set, p.why)
		}
	}
	refused := []struct {
		pod  multiPod
		want string
	}{
		{multiPod{sysPod: sysPod{name: "pin-pcie-req", sizes: []int64{16}}, count: 2, required: true, node: "topo-pcie"}, "NVLink"},
		{multiPod{sysPod: sysPod{name: "uneven", sizes: []int64{3}}, count: 2}, "do not divide evenly"},
	}
	for _, r := range refused {
		createAll(t, b.client, []*corev1.Pod{r.pod.object()})
		p, err := b.c.WaitForPod(ctx, "default", r.pod.name, waitLong, "unschedulable: "+r.want, func(p *corev1.Pod) bool {
			return strings.Contains(unschedulable(p), r.want)
		})
		if err != nil {
			t.Fatal(err)
		}
		if !hasEvent(ctx, t, b, r.pod.name, "FailedScheduling", r.want) {
			t.Errorf("pod %s: no FailedScheduling event saying %q", r.pod.name, r.want)
		}
		t.Logf("pod %s refused: %s", r.pod.name, unschedulable(p))
		if err := b.client.CoreV1().Pods("default").Delete(ctx, r.pod.name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	burst := multiBurst()
	objs := make([]*corev1.Pod, 0, len(burst)+3)
	want := map[string]multiPod{}
	for _, p := range burst {
		objs = append(objs, p.object())
		want[p.name] = p
	}
	began := time.Now()
	names := createAll(t, b.client, objs)
	for _, pinned := range []string{"pin-single", "pin-pair", "pin-island"} {
		names[pinned] = nil
	}
	items := b.waitAllRunning(t, names, systemWait)
	t.Logf("%d pods of one, two and four GPUs Running after %v", len(burst), time.Since(began).Round(time.Millisecond))
	v := b.verifySystem(t, items)
	b.compareViews(t, v)
	b.checkSets(t, items, want)
}

// checkSets checks every burst pod's GPU set against its form: as many GPUs as its label asks,
// and, when it requires NVLink, every pair NVLink-connected by the links its node published.
func (b *systemBed) checkSets(t *testing.T, items []corev1.Pod, want map[string]multiPod) {
	t.Helper()
	sets := map[int]int{}
	for _, p := range items {
		w, ok := want[p.Name]
		if !ok {
			continue
		}
		asg, _, err := gpushare.DecodePodAssignment(p.Annotations)
		if err != nil {
			t.Fatal(err)
		}
		set, err := asg.SetFor(gpushare.ContainerRequest{Name: "c0", Index: 0, Units: uint64(w.sizes[0])})
		if err != nil {
			t.Errorf("pod %s: %v", p.Name, err)
			continue
		}
		count := max(1, w.count)
		sets[count]++
		if set.Len() != count {
			t.Errorf("pod %s asks for %d GPUs and got %s", p.Name, count, set)
		}
		if w.required && !allNVLink(b.nodes[p.Spec.NodeName].gpus, set) {
			t.Errorf("pod %s requires NVLink and got GPUs %s of %s, not all NVLink-connected", p.Name, set, p.Spec.NodeName)
		}
	}
	t.Logf("pods by GPU count: %v", sets)
}

// allNVLink reports whether every pair of set is NVLink-connected on node.
func allNVLink(node gpushare.NodeGPUs, set gpushare.GPUSet) bool {
	linked := map[[2]int]bool{}
	for _, l := range node.Links {
		if l.NVLinks > 0 {
			linked[[2]int{l.A, l.B}] = true
		}
	}
	gs := set.Indices()
	for i, a := range gs {
		for _, c := range gs[i+1:] {
			if !linked[[2]int{a, c}] {
				return false
			}
		}
	}
	return true
}

// bestPair is the pair of node's GPUs with the highest published link score, the lowest indices
// on ties.
func bestPair(node gpushare.NodeGPUs) gpushare.GPUSet {
	var best gpushare.GPULink
	found := false
	for _, l := range node.Links {
		if !found || l.Score > best.Score || l.Score == best.Score && (l.A < best.A || l.A == best.A && l.B < best.B) {
			best, found = l, true
		}
	}
	return gpushare.NewGPUSet(best.A, best.B)
}
