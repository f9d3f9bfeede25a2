package render_test

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpushare/gpushare/inspector/collect"
	"github.com/gpushare/gpushare/inspector/internal/fixture"
	"github.com/gpushare/gpushare/inspector/render"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// The contract's samples (docs/contract.md section 5), verbatim.
const (
	contractSummaryOneGPU = "" +
		"NAME                                IPADDRESS     GPU0(Allocated/Total)  GPU Memory(GiB)\n" +
		"cn-shanghai.i-uf61h64dz1tmlob9hmtb  192.168.0.71  6/15                   6/15\n" +
		"cn-shanghai.i-uf61h64dz1tmlob9hmtc  192.168.0.70  3/15                   3/15\n" +
		"------------------------------------------------------------------------------\n" +
		"Allocated/Total GPU Memory In Cluster:\n" +
		"9/30 (30%)  \n"
	contractSummaryPending = "" +
		"NAME    IPADDRESS  GPU0(Allocated/Total)  GPU1(Allocated/Total)  PENDING(Allocated)  GPU Memory(GiB)\n" +
		"node-a  10.0.0.1   4/15                   6/15                   2                   12/30\n" +
		"node-b  10.0.0.2   10/15                  0/0                                        10/15\n" +
		"------------------------------------------------------\n" +
		"Allocated/Total GPU Memory In Cluster:\n" +
		"22/45 (48%)  \n"
	// The details sample shows the first node's block and the cluster line;
	// the second node's block, elided in the contract, sits between them.
	contractDetailsFirstNode = "" +
		"\n" +
		"NAME:       cn-shanghai.i-uf61h64dz1tmlob9hmtb\n" +
		"IPADDRESS:  192.168.0.71\n" +
		"\n" +
		"NAME         NAMESPACE  GPU0(Allocated)  \n" +
		"binpack-1-0  default    3                \n" +
		"binpack-1-1  default    3                \n" +
		"Allocated :  6 (40%)    \n" +
		"Total :      15         \n" +
		"--------------------------------------------------------\n"
	contractDetailsFooter = "" +
		"\n" +
		"\n" +
		"Allocated/Total GPU Memory In Cluster:  9/30 (30%)  \n"
)

// contractOneGPU is the cluster behind the first summary and the details sample.
func contractOneGPU() ([]corev1.Node, []corev1.Pod) {
	b, c := "cn-shanghai.i-uf61h64dz1tmlob9hmtb", "cn-shanghai.i-uf61h64dz1tmlob9hmtc"
	// Listed in an order the output must not follow.
	return []corev1.Node{fixture.Node(c, "192.168.0.70", 15, 1), fixture.Node(b, "192.168.0.71", 15, 1)},
		[]corev1.Pod{
			fixture.SimplePod("default", "binpack-1-1", b, 3, 0, 15, true),
			fixture.SimplePod("default", "binpack-1-2", c, 3, 0, 15, true),
			fixture.SimplePod("default", "binpack-1-0", b, 3, 0, 15, true),
		}
}

// contractPending is the cluster behind the second summary sample.
func contractPending() ([]corev1.Node, []corev1.Pod) {
	return []corev1.Node{fixture.Node("node-b", "10.0.0.2", 15, 1), fixture.Node("node-a", "10.0.0.1", 30, 2)},
		[]corev1.Pod{
			fixture.SimplePod("default", "a-0", "node-a", 4, 0, 15, true),
			fixture.SimplePod("default", "a-1", "node-a", 6, 1, 15, true),
			fixture.SimplePod("default", "a-pending", "node-a", 2, -1, 0, false),
			fixture.SimplePod("team", "b-0", "node-b", 10, 0, 15, true),
		}
}

// published describes GPUs of the given sizes; unhealthy lists indices marked bad.
func published(unit gpushare.Unit, sizes []uint64, unhealthy ...int) gpushare.NodeGPUs {
	d := gpushare.NodeGPUs{Unit: unit}
	for i, s := range sizes {
		g := gpushare.GPUInfo{Index: i, UUID: "GPU-" + string(rune('a'+i)), Model: "NVIDIA A100", Units: s, Healthy: true}
		for _, b := range unhealthy {
			if b == i {
				g.Healthy, g.Reason = false, "XID 79: fallen off the bus"
			}
		}
		d.GPUs = append(d.GPUs, g)
	}
	return d
}

// richCluster has every feature at once: mixed sizes, an unhealthy GPU, a
// split multi-container pod with an init container, a pending pod, recorded
// limits, a not-yet-allocated container and a mismatching record.
func richCluster() ([]corev1.Node, []corev1.Pod) {
	mixed := fixture.WithGPUs(fixture.Node("gpu-mixed", "10.1.0.1", 15+31, 2), published(gpushare.GiB, []uint64{15, 31}, 1))
	old := fixture.Node("gpu-old", "10.1.0.2", 30, 2)

	split := fixture.Pod("ml", "trainer", "gpu-mixed",
		fixture.Container("main", 4), fixture.Container("sidecar", 6), fixture.Container("log", 0))
	split.Spec.InitContainers = []corev1.Container{fixture.Container("warmup", 8)}
	split = fixture.Assign(split, gpushare.PodAssignment{GPUIndex: 0, PodUnits: 10, DevUnits: 15, Assigned: false, AssumeTime: 1,
		Allocation: gpushare.Allocation{0: {0: 4}, 1: {1: 6}}})
	split = fixture.Record(split, gpushare.ContainerEnvs{
		"warmup": {GPUIndex: 0, PodUnits: 10, ContainerUnits: 8, DevUnits: 15},
		"main":   {GPUIndex: 0, PodUnits: 10, ContainerUnits: 4, DevUnits: 15, DisableIsolation: true},
	})
	wrong := fixture.Record(fixture.SimplePod("ml", "swapped", "gpu-mixed", 2, 1, 31, true),
		gpushare.ContainerEnvs{"main": {GPUIndex: 0, PodUnits: 2, ContainerUnits: 2, DevUnits: 15}})
	return []corev1.Node{old, mixed, fixture.Node("cpu-only", "10.1.0.3", 0, 0)},
		[]corev1.Pod{
			split, wrong,
			fixture.SimplePod("ml", "waiting", "gpu-mixed", 3, -1, 0, false),
			fixture.SimplePod("default", "legacy", "gpu-old", 5, 1, 15, true),
			fixture.SimplePod("default", "on-cpu", "cpu-only", 1, 0, 1, true),
		}
}

func TestGolden(t *testing.T) {
	type renderFunc func(w *bytes.Buffer, r *collect.Report) error
	summary := func(w *bytes.Buffer, r *collect.Report) error { return render.Summary(w, r) }
	details := func(w *bytes.Buffer, r *collect.Report) error { return render.Details(w, r) }
	jsonOut := func(w *bytes.Buffer, r *collect.Report) error { return render.JSON(w, r) }
	yamlOut := func(w *bytes.Buffer, r *collect.Report) error { return render.YAML(w, r) }
	cluster := func(f func() ([]corev1.Node, []corev1.Pod)) func() ([]corev1.Node, []corev1.Pod) { return f }
	cases := []struct {
		golden  string
		cluster func() ([]corev1.Node, []corev1.Pod)
		render  renderFunc
	}{
		{"contract-summary.txt", contractOneGPU, summary},
		{"contract-summary-pending.txt", contractPending, summary},
		{"contract-details.txt", contractOneGPU, details},
		{"empty-summary.txt", cluster(func() ([]corev1.Node, []corev1.Pod) { return nil, nil }), summary},
		{"empty-details.txt", cluster(func() ([]corev1.Node, []corev1.Pod) { return nil, nil }), details},
		{"multi-gpu-pending-details.txt", contractPending, details},
		{"mixed-summary.txt", richCluster, summary},
		{"mixed-details.txt", richCluster, details},
		{"mixed.json", richCluster, jsonOut},
		{"mixed.yaml", richCluster, yamlOut},
		{"mib-summary.txt", mibCluster, summary},
		{"mib-details.txt", mibCluster, details},
		{"multi-container-old-node-details.txt", multiContainerOldNode, details},
		{"unhealthy-summary.txt", unhealthyCluster, summary},
		{"unhealthy-details.txt", unhealthyCluster, details},
		{"tiers-summary.txt", tieredCluster, summary},
		{"tiers-details.txt", tieredCluster, details},
		{"tiers.json", tieredCluster, jsonOut},
		{"multigpu-summary.txt", multiGPUCluster, summary},
		{"multigpu-details.txt", multiGPUCluster, details},
		{"multigpu.json", multiGPUCluster, jsonOut},
		{"usage-details.txt", usageCluster, details},
		{"usage.json", usageCluster, jsonOut},
	}
	for _, tc := range cases {
		t.Run(tc.golden, func(t *testing.T) {
			nodes, pods := tc.cluster()
			var got bytes.Buffer
			if err := tc.render(&got, collect.Build(nodes, pods)); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", tc.golden)
			if *update {
				if err := os.WriteFile(path, got.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test -update to create it)", err)
			}
			if !bytes.Equal(got.Bytes(), want) {
				t.Errorf("output differs from %s (go test -update refreshes it)\n--- got ---\n%s\n--- want ---\n%s", path, got.String(), want)
			}
		})
	}
}

// TestContractSamples checks the contract's text itself, not a golden file
// that -update could have rewritten wrongly.
func TestContractSamples(t *testing.T) {
	var b bytes.Buffer
	nodes, pods := contractOneGPU()
	if err := render.Summary(&b, collect.Build(nodes, pods)); err != nil {
		t.Fatal(err)
	}
	if b.String() != contractSummaryOneGPU {
		t.Errorf("summary:\n%q\nwant\n%q", b.String(), contractSummaryOneGPU)
	}

	b.Reset()
	nodes, pods = contractPending()
	if err := render.Summary(&b, collect.Build(nodes, pods)); err != nil {
		t.Fatal(err)
	}
	if b.String() != contractSummaryPending {
		t.Errorf("summary with pending:\n%q\nwant\n%q", b.String(), contractSummaryPending)
	}

	b.Reset()
	nodes, pods = contractOneGPU()
	if err := render.Details(&b, collect.Build(nodes, pods)); err != nil {
		t.Fatal(err)
	}
	got := b.String()
	if !strings.HasPrefix(got, contractDetailsFirstNode) || !strings.HasSuffix(got, contractDetailsFooter) {
		t.Errorf("details:\n%q\nwant prefix\n%q\nand suffix\n%q", got, contractDetailsFirstNode, contractDetailsFooter)
	}
	// The elided second node: exactly one more node block between them.
	middle := strings.TrimSuffix(strings.TrimPrefix(got, contractDetailsFirstNode), contractDetailsFooter)
	if !strings.Contains(middle, "NAME:       cn-shanghai.i-uf61h64dz1tmlob9hmtc\n") || strings.Count(middle, "NAME:") != 1 {
		t.Errorf("details: unexpected second node block %q", middle)
	}
}

// mibCluster runs the plugin with --memory-unit=MiB: 16160 MiB cards.
func mibCluster() ([]corev1.Node, []corev1.Pod) {
	return []corev1.Node{fixture.Node("mib-0", "10.2.0.1", 2*16160, 2)},
		[]corev1.Pod{
			fixture.SimplePod("default", "small", "mib-0", 1024, 0, 16160, true),
			fixture.SimplePod("default", "large", "mib-0", 8000, 1, 16160, true),
		}
}

// multiContainerOldNode: a pod of two GPU containers on a node of the old plugin, one GPU index.
func multiContainerOldNode() ([]corev1.Node, []corev1.Pod) {
	p := fixture.Pod("default", "two", "old-0", fixture.Container("a", 2), fixture.Container("b", 3))
	p = fixture.Assign(p, gpushare.PodAssignment{GPUIndex: 1, PodUnits: 5, DevUnits: 15, Assigned: true, AssumeTime: 1})
	return []corev1.Node{fixture.Node("old-0", "10.3.0.1", 30, 2)}, []corev1.Pod{p, fixture.SimplePod("default", "one", "old-0", 4, 0, 15, true)}
}

// unhealthyCluster: GPU 1 of 4 reported unhealthy by our plugin.
func unhealthyCluster() ([]corev1.Node, []corev1.Pod) {
	n := fixture.WithGPUs(fixture.Node("h-0", "10.4.0.1", 4*15, 4), published(gpushare.GiB, []uint64{15, 15, 15, 15}, 1))
	p := fixture.Record(fixture.SimplePod("default", "p", "h-0", 7, 2, 15, true),
		gpushare.ContainerEnvs{"main": {GPUIndex: 2, PodUnits: 7, ContainerUnits: 7, DevUnits: 15}})
	return []corev1.Node{n}, []corev1.Pod{p}
}

// withTiers sets the published tier of each GPU of desc, in order, and why
// it fell back where reasons has a non-empty entry.
func withTiers(desc gpushare.NodeGPUs, tiers []gpushare.Isolation, reasons ...string) gpushare.NodeGPUs {
	for i, t := range tiers {
		desc.GPUs[i].Isolation = t
		if i < len(reasons) {
			desc.GPUs[i].IsolationReason = reasons[i]
		}
	}
	return desc
}

// asks returns p with isolation annotations; empty values are left out.
func asks(p corev1.Pod, tier, percent string) corev1.Pod {
	if tier != "" {
		p = fixture.WithPodAnnotation(p, gpushare.AnnotationIsolation, tier)
	}
	if percent != "" {
		p = fixture.WithPodAnnotation(p, gpushare.AnnotationComputePercent, percent)
	}
	return p
}

// tieredCluster: a node configured for mps whose GPU 2 fell back and GPU 3
// is unhealthy, a hami-core node, a node of a tier-aware plugin without
// isolation (none), a node of the old plugin; pods asking for tiers and
// compute shares, and one whose share cannot be read.
func tieredCluster() ([]corev1.Node, []corev1.Pod) {
	mps, hami, none := gpushare.IsolationMPS, gpushare.IsolationHAMiCore, gpushare.IsolationNone
	mpsNode := fixture.WithGPUs(fixture.Node("mps-0", "10.5.0.1", 4*15, 4),
		withTiers(published(gpushare.GiB, []uint64{15, 15, 15, 15}, 3), []gpushare.Isolation{mps, mps, none, mps}, "", "", "MPS control daemon not answering"))
	hamiNode := fixture.WithGPUs(fixture.Node("hami-0", "10.5.0.2", 2*31, 2),
		withTiers(published(gpushare.GiB, []uint64{31, 31}), []gpushare.Isolation{hami, hami}))
	noneNode := fixture.WithGPUs(fixture.Node("none-0", "10.5.0.3", 2*15, 2),
		withTiers(published(gpushare.GiB, []uint64{15, 15}), []gpushare.Isolation{none, none}))
	infer := fixture.Record(asks(fixture.SimplePod("ml", "infer", "mps-0", 4, 0, 15, true), "mps", "30"),
		gpushare.ContainerEnvs{"main": {GPUIndex: 0, PodUnits: 4, ContainerUnits: 4, DevUnits: 15}})
	return []corev1.Node{noneNode, mpsNode, fixture.Node("old-0", "10.5.0.4", 30, 2), hamiNode},
		[]corev1.Pod{
			infer,
			fixture.SimplePod("ml", "plain", "mps-0", 2, 2, 15, false),
			asks(fixture.SimplePod("ml", "share", "hami-0", 8, 1, 31, false), "", "50"),
			asks(fixture.SimplePod("ml", "queued", "hami-0", 3, -1, 0, false), "hami-core", ""),
			asks(fixture.SimplePod("default", "unreadable", "none-0", 5, 0, 15, false), "", "half"),
			asks(fixture.SimplePod("default", "legacy", "old-0", 6, 1, 15, true), "none", ""),
		}
}

// multiGPUCluster (issue 15): a node of our plugin with a 2-GPU pod, a 4-GPU
// pod of two containers and an init container, and single-GPU pods beside
// them; a node of the old plugin (sizes derived) with a 2-GPU pod the plugin
// has not served yet. Every GPU holds each multi-GPU pod's units / k.
func multiGPUCluster() ([]corev1.Node, []corev1.Pod) {
	pub := fixture.WithGPUs(fixture.Node("multi-0", "10.6.0.1", 4*15, 4), published(gpushare.GiB, []uint64{15, 15, 15, 15}))
	old := fixture.Node("multi-old", "10.6.0.2", 2*15, 2)

	// main 12 and helper 4 run on all four GPUs (3 + 1 per GPU), the init
	// container's 8 too (2 per GPU): max(2, 3+1) = 4 on each GPU, 16 in all.
	four := fixture.Pod("ml", "train-4", "multi-0", fixture.Container("main", 12), fixture.Container("helper", 4), fixture.Container("log", 0))
	four.Spec.InitContainers = []corev1.Container{fixture.Container("warmup", 8)}
	four = fixture.RecordSet(fixture.MultiGPU(four, gpushare.NewGPUSet(0, 1, 2, 3), 15, true), gpushare.NewGPUSet(0, 1, 2, 3), 15)

	single := fixture.Record(fixture.SimplePod("default", "single", "multi-0", 5, 2, 15, true),
		gpushare.ContainerEnvs{"main": {GPUIndex: 2, PodUnits: 5, ContainerUnits: 5, DevUnits: 15}})
	return []corev1.Node{old, pub},
		[]corev1.Pod{
			fixture.MultiGPUPod("ml", "train-2", "multi-0", 8, gpushare.NewGPUSet(0, 1), 15, true),
			four, single,
			fixture.SimplePod("default", "starting", "multi-0", 3, 0, 15, false),
			fixture.MultiGPUPod("ml", "old-2", "multi-old", 6, gpushare.NewGPUSet(0, 1), 15, false),
			fixture.SimplePod("default", "old-single", "multi-old", 2, 1, 15, true),
		}
}

// usageCluster is multiGPUCluster with multi-0's usage summary (issue 26):
// train-2's main uses 4.5 GiB of its 4 on each of GPUs 0 and 1 (over),
// train-4's main 2.5 of its 3 on each of its four, single 2.5 of 5 on GPU 2,
// and a process of a pod without a slice 1 GiB on GPU 3. The old node has
// none: its rows stay as they were.
func usageCluster() ([]corev1.Node, []corev1.Pod) {
	nodes, pods := multiGPUCluster()
	pct := func(v int) *int { return &v }
	u := gpushare.NodeUsage{At: time.Date(2026, 12, 5, 13, 0, 0, 0, time.UTC), IntervalSeconds: 10,
		GPUs: []gpushare.GPUUsage{
			{Index: 0, UsedMiB: 7168, Utilization: pct(80)}, {Index: 1, UsedMiB: 7168, Utilization: pct(75)},
			{Index: 2, UsedMiB: 5120, Utilization: pct(20)}, {Index: 3, UsedMiB: 3584, UnattributedMiB: 512},
		},
		Containers: []gpushare.ContainerUsage{
			{Namespace: "ml", Pod: "train-2", Container: "main", GPU: 0, UsedMiB: 4608, SliceMiB: 4096},
			{Namespace: "ml", Pod: "train-2", Container: "main", GPU: 1, UsedMiB: 4608, SliceMiB: 4096},
			{Namespace: "default", Pod: "single", Container: "main", GPU: 2, UsedMiB: 2560, SliceMiB: 5120},
			{Namespace: "other", Pod: "rogue", Container: "c", GPU: 3, UsedMiB: 1024},
		},
	}
	for g := range 4 {
		u.Containers = append(u.Containers, gpushare.ContainerUsage{Namespace: "ml", Pod: "train-4", Container: "main", GPU: g, UsedMiB: 2560, SliceMiB: 3072})
	}
	raw, err := gpushare.EncodeNodeUsage(u)
	if err != nil {
		panic(err)
	}
	nodes[1] = fixture.WithAnnotation(nodes[1], gpushare.AnnotationNodeUsage, raw)
	return nodes, pods
}

// The summary table has no use in it: a node's usage summary leaves it as it was.
func TestUsageLeavesSummary(t *testing.T) {
	var with, without bytes.Buffer
	nodes, pods := usageCluster()
	if err := render.Summary(&with, collect.Build(nodes, pods)); err != nil {
		t.Fatal(err)
	}
	nodes, pods = multiGPUCluster()
	if err := render.Summary(&without, collect.Build(nodes, pods)); err != nil {
		t.Fatal(err)
	}
	if with.String() != without.String() {
		t.Errorf("summary with use:\n%s\nwithout:\n%s", with.String(), without.String())
	}
}

// A usage summary that cannot be read is skipped with its reason; the
// allocation view stands and no USED figure appears.
func TestUsageMalformed(t *testing.T) {
	nodes, pods := multiGPUCluster()
	nodes[1] = fixture.WithAnnotation(nodes[1], gpushare.AnnotationNodeUsage, `{"at":"2026-12-05T13:00:00Z","intervalSeconds":0}`)
	r := collect.Build(nodes, pods)
	if r.Usage != nil || r.Nodes[0].Usage != nil || r.Nodes[1].Usage != nil {
		t.Errorf("usage shown from a malformed summary: %+v", r.Usage)
	}
	if len(r.Skipped) != 1 || !strings.Contains(r.Skipped[0].Reason, "intervalSeconds") {
		t.Errorf("skipped %+v; want the node's summary named with its fault", r.Skipped)
	}
}

// A multi-GPU pod's -d rows: the pod on each GPU with its share there, and
// each container on all its GPUs with its units per GPU.
func TestMultiGPUDetails(t *testing.T) {
	nodes, pods := multiGPUCluster()
	var b bytes.Buffer
	if err := render.Details(&b, collect.Build(nodes, pods)); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"train-2      ml         4                4                0                0                \n",
		"ml/train-2        main           8 (4/GPU)   0,1      NVIDIA_VISIBLE_DEVICES=0,1 GPUSHARE_GPU_COUNT=2 ALIYUN_COM_GPU_MEM_CONTAINER=8 ALIYUN_COM_GPU_MEM_DEV=15\n",
		"ml/train-4        warmup (init)  8 (2/GPU)   0,1,2,3  ",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("details:\n%s\nwant the line\n%q", b.String(), want)
		}
	}
}

// A node whose plugin publishes tier none on every GPU is, in the summary,
// the node it was before tiers, byte for byte: the compatibility contract
// holds for tier-aware plugins run without isolation.
func TestTierNoneKeepsTheSummary(t *testing.T) {
	nodes, pods := richCluster()
	var before bytes.Buffer
	if err := render.Summary(&before, collect.Build(nodes, pods)); err != nil {
		t.Fatal(err)
	}
	mixed := fixture.WithGPUs(fixture.Node("gpu-mixed", "10.1.0.1", 15+31, 2),
		withTiers(published(gpushare.GiB, []uint64{15, 31}, 1), []gpushare.Isolation{gpushare.IsolationNone, gpushare.IsolationNone}))
	for i := range nodes {
		if nodes[i].Name == "gpu-mixed" {
			nodes[i] = mixed
		}
	}
	var after bytes.Buffer
	r := collect.Build(nodes, pods)
	if err := render.Summary(&after, r); err != nil {
		t.Fatal(err)
	}
	if after.String() != before.String() {
		t.Fatalf("summary changed with tier none published:\n%s\nwas\n%s", after.String(), before.String())
	}
	// -d says the tier, on its own line, and changes nothing else.
	var d bytes.Buffer
	if err := render.Details(&d, r); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(d.String(), "UNHEALTHY:  GPU1 (XID 79: fallen off the bus)\nISOLATION:  none\n") {
		t.Fatalf("details without the node's tier line:\n%s", d.String())
	}
}

// The recorded environment of a tier-aware plugin shows the tier and the
// compute limit the container was given.
func TestEnvShowsIsolation(t *testing.T) {
	gpu := 0
	n := collect.Node{Name: "n", Address: "10.0.0.1", Total: 15, GPUSizes: collect.SizesPublished,
		GPUs: []collect.GPU{{Index: 0, Total: 15, Allocated: 4, Healthy: true, Known: true, Isolation: "mps"}},
		Pods: []collect.Pod{{Namespace: "ml", Name: "infer", Units: 4, Isolation: "mps", ComputePercent: 30,
			GPUs: []collect.GPUCharge{{Index: 0, Units: 4}},
			Containers: []collect.Container{{Name: "main", Units: 4, GPU: &gpu, State: collect.StateAllocated, Env: map[string]string{
				gpushare.EnvVisibleDevices: "0", gpushare.EnvContainerUnits: "4", gpushare.EnvDevUnits: "15",
				gpushare.EnvIsolation: "mps", gpushare.EnvComputePercent: "30", gpushare.EnvMPSPipeDirectory: "/not/shown",
			}}}}},
	}
	var b bytes.Buffer
	if err := render.Details(&b, &collect.Report{Unit: "GiB", Nodes: []collect.Node{n}}); err != nil {
		t.Fatal(err)
	}
	want := "ml/infer  main       4        0    mps 30%    NVIDIA_VISIBLE_DEVICES=0 ALIYUN_COM_GPU_MEM_CONTAINER=4 ALIYUN_COM_GPU_MEM_DEV=15 " +
		gpushare.EnvIsolation + "=mps " + gpushare.EnvComputePercent + "=30\n"
	if !strings.Contains(b.String(), want) {
		t.Fatalf("details:\n%s\nwant the line\n%s", b.String(), want)
	}
}

// failingWriter fails every write, as a closed pipe does.
type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("broken pipe") }

func TestWriteErrorsAreReturned(t *testing.T) {
	nodes, pods := contractOneGPU()
	r := collect.Build(nodes, pods)
	for name, f := range map[string]func() error{
		"summary": func() error { return render.Summary(failingWriter{}, r) },
		"details": func() error { return render.Details(failingWriter{}, r) },
		"json":    func() error { return render.JSON(failingWriter{}, r) },
		"yaml":    func() error { return render.YAML(failingWriter{}, r) },
	} {
		if err := f(); err == nil {
			t.Errorf("%s: no error from a failing writer", name)
		}
	}
}
