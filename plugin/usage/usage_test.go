package usage

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/nvml"
	"github.com/gpushare/gpushare/plugin/usage/cgroup"
)

const gib = 1 << 30

// hexID is container n's 64-hex runtime ID.
func hexID(n int) string { return fmt.Sprintf("%064x", n+0xabc000) }

// testPod is a running pod with one container per name, container i having
// runtime ID hexID(base+i), and the record envs (nil: none).
func testPod(ns, name, uid string, base int, names []string, envs gpushare.ContainerEnvs) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid), Annotations: map[string]string{}}}
	for i, n := range names {
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{Name: n, ContainerID: "containerd://" + hexID(base+i)})
	}
	if envs != nil {
		raw, err := gpushare.EncodeContainerEnvs(envs)
		if err != nil {
			panic(err)
		}
		p.Annotations[gpushare.AnnotationContainerEnv] = raw
	}
	return p
}

const (
	uidA = "11111111-2222-3333-4444-555555555555"
	uidB = "66666666-7777-8888-9999-000000000000"
)

// twoPods: pod a's "main" has 4 GiB on GPU 0, its "side" 2 GiB on GPU 0;
// pod b's "train" spans GPUs 1 and 2 with 8 units, 4 on each.
func twoPods() []*corev1.Pod {
	return []*corev1.Pod{
		testPod("ns1", "a", uidA, 0, []string{"main", "side"}, gpushare.ContainerEnvs{
			"main": {GPUIndex: 0, PodUnits: 6, ContainerUnits: 4, DevUnits: 80},
			"side": {GPUIndex: 0, PodUnits: 6, ContainerUnits: 2, DevUnits: 80},
		}),
		testPod("ns2", "b", uidB, 10, []string{"train"}, gpushare.ContainerEnvs{
			"train": {GPUIndex: 1, GPUs: gpushare.NewGPUSet(1, 2), PodUnits: 8, ContainerUnits: 8, DevUnits: 80},
		}),
	}
}

func podsOf(t *testing.T, objects []*corev1.Pod) []Pod {
	t.Helper()
	var out []Pod
	for _, o := range objects {
		p, err := PodOf(o, gib)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, p)
	}
	return out
}

func proc(pid uint32, bytes uint64) nvml.Process {
	return nvml.Process{PID: pid, UsedBytes: bytes, UsedKnown: true}
}

func TestAttribute(t *testing.T) {
	readings := []nvml.Usage{
		{Index: 0, UUID: "GPU-0", UsedBytes: 9 * gib, TotalBytes: 80 * gib, UtilizationPercent: 50,
			Processes: []nvml.Process{proc(100, 3*gib), proc(101, 2*gib), proc(102, 1*gib), proc(900, 2*gib), {PID: 901}}},
		{Index: 1, UUID: "GPU-1", UsedBytes: 5 * gib, TotalBytes: 80 * gib, UtilizationPercent: -1, Processes: []nvml.Process{proc(200, 5*gib)}},
		{Index: 2, UUID: "GPU-2", TotalBytes: 80 * gib},
		{Index: 3, UUID: "GPU-3", UsedBytes: gib, TotalBytes: 80 * gib, Processes: []nvml.Process{proc(300, gib), proc(301, gib)}},
	}
	owners := map[uint32]cgroup.Owner{
		100: {PodUID: uidA, ContainerID: hexID(0)}, 101: {PodUID: uidA, ContainerID: hexID(0)}, // main, two processes
		102: {PodUID: uidA, ContainerID: hexID(1)}, // side
		200: {PodUID: uidB, ContainerID: hexID(10)},
		300: {PodUID: uidA, ContainerID: hexID(99)},                                  // a container the pod does not list (its sandbox)
		301: {PodUID: "00000000-0000-0000-0000-000000000000", ContainerID: hexID(0)}, // a pod not on the node
	}
	s := Attribute(readings, owners, podsOf(t, twoPods()))
	want := []ContainerUse{
		{Namespace: "ns1", Pod: "a", Container: "main", GPU: 0, UUID: "GPU-0", UsedBytes: 5 * gib, SliceBytes: 4 * gib},
		{Namespace: "ns1", Pod: "a", Container: "side", GPU: 0, UUID: "GPU-0", UsedBytes: 1 * gib, SliceBytes: 2 * gib},
		{Namespace: "ns2", Pod: "b", Container: "train", GPU: 1, UUID: "GPU-1", UsedBytes: 5 * gib, SliceBytes: 4 * gib},
		{Namespace: "ns2", Pod: "b", Container: "train", GPU: 2, UUID: "GPU-2", SliceBytes: 4 * gib},
	}
	if fmt.Sprint(s.Containers) != fmt.Sprint(want) {
		t.Errorf("containers\n%+v\nwant\n%+v", s.Containers, want)
	}
	unattributed := []uint64{2 * gib, 0, 0, 2 * gib}
	for i, g := range s.GPUs {
		if g.UnattributedBytes != unattributed[i] {
			t.Errorf("GPU %d unattributed %d, want %d", g.Index, g.UnattributedBytes, unattributed[i])
		}
	}
	if over := []bool{true, false, true, false}; fmt.Sprint(over) != fmt.Sprint([]bool{want[0].Over(), want[1].Over(), want[2].Over(), want[3].Over()}) {
		t.Error("Over() disagrees")
	}
}

// TestPodOfMalformedRecord keeps the pod's containers when its record
// cannot be read, so their use still counts.
func TestPodOfMalformedRecord(t *testing.T) {
	p := testPod("ns", "x", uidA, 0, []string{"main"}, nil)
	p.Annotations[gpushare.AnnotationContainerEnv] = `{"main":{"gpu":-4}}`
	got, err := PodOf(p, gib)
	if !errors.Is(err, gpushare.ErrInvalidContainerEnvs) {
		t.Errorf("PodOf error = %v, want ErrInvalidContainerEnvs", err)
	}
	if got.Containers[hexID(0)] != "main" || len(got.Slices) != 0 {
		t.Errorf("PodOf = %+v; want the container and no slices", got)
	}
}

func over(used, slice uint64) Sample {
	return Sample{Containers: []ContainerUse{{Namespace: "n", Pod: "p", Container: "c", GPU: 0, UsedBytes: used, SliceBytes: slice}}}
}

func TestOverUse(t *testing.T) {
	o := NewOverUse(time.Minute, 5*time.Minute)
	t0 := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	steps := []struct {
		at     time.Duration
		s      Sample
		report bool
	}{
		{0, over(5*gib, 4*gib), false},                // over, within the grace
		{30 * time.Second, over(5*gib, 4*gib), false}, // still within
		{50 * time.Second, over(3*gib, 4*gib), false}, // under: the stretch ends
		{60 * time.Second, over(5*gib, 4*gib), false}, // a new stretch begins
		{2 * time.Minute, over(5*gib, 4*gib), true},   // a minute over: reported
		{3 * time.Minute, over(6*gib, 4*gib), false},  // over, reported a minute ago
		{7 * time.Minute, over(6*gib, 4*gib), true},   // five minutes after the report
		{8 * time.Minute, over(6*gib, 0), false},      // no slice: never over
		{9 * time.Minute, over(6*gib, 4*gib), false},  // a new stretch
		{10 * time.Minute, over(6*gib, 4*gib), true},
	}
	for i, st := range steps {
		got := o.Observe(at(st.at), st.s)
		if (len(got) == 1) != st.report || len(got) > 1 {
			t.Fatalf("step %d at %v: reports %+v, want report=%v", i, st.at, got, st.report)
		}
	}
	if o.Over() != 1 {
		t.Errorf("Over() = %d, want 1", o.Over())
	}
}

func TestSummaryAndMoved(t *testing.T) {
	s := Sample{
		GPUs:       []GPUUse{{Index: 0, UsedBytes: 9 * gib, UtilizationPercent: 40, UnattributedBytes: gib}, {Index: 1, UtilizationPercent: -1}},
		Containers: []ContainerUse{{Namespace: "n", Pod: "p", Container: "c", GPU: 0, UsedBytes: 8*gib + 600<<10, SliceBytes: 8 * gib}},
	}
	at := time.Date(2026, 12, 5, 12, 0, 0, 700, time.UTC)
	u := Summary(s, at, 10*time.Second)
	raw, err := gpushare.EncodeNodeUsage(u)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"at":"2026-12-05T12:00:00Z","intervalSeconds":10,"gpus":[{"index":0,"usedMiB":9216,"utilization":40,"unattributedMiB":1024},{"index":1,"usedMiB":0}],` +
		`"containers":[{"namespace":"n","pod":"p","container":"c","gpu":0,"usedMiB":8193,"sliceMiB":8192}]}`
	if raw != want {
		t.Errorf("summary\n%s\nwant\n%s", raw, want)
	}
	back, err := gpushare.DecodeNodeUsage(raw)
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	move := func(f func(*gpushare.NodeUsage)) gpushare.NodeUsage {
		c := back
		c.GPUs = append([]gpushare.GPUUsage(nil), back.GPUs...)
		c.Containers = append([]gpushare.ContainerUsage(nil), back.Containers...)
		f(&c)
		return c
	}
	tests := []struct {
		name  string
		next  gpushare.NodeUsage
		moved bool
	}{
		{"same", back, false},
		{"less than a unit", move(func(c *gpushare.NodeUsage) { c.GPUs[0].UsedMiB += 1023; c.Containers[0].UsedMiB += 1000 }), false},
		{"utilization alone", move(func(c *gpushare.NodeUsage) { p := 99; c.GPUs[0].Utilization = &p }), false},
		{"a unit on a GPU", move(func(c *gpushare.NodeUsage) { c.GPUs[0].UsedMiB -= 1024 }), true},
		{"a unit unattributed", move(func(c *gpushare.NodeUsage) { c.GPUs[0].UnattributedMiB += 1024 }), true},
		{"a unit in a container", move(func(c *gpushare.NodeUsage) { c.Containers[0].UsedMiB += 1024 }), true},
		{"under the slice by a MiB", move(func(c *gpushare.NodeUsage) { c.Containers[0].UsedMiB = 8191 }), true},
		{"a container gone", move(func(c *gpushare.NodeUsage) { c.Containers = c.Containers[:0] }), true},
		{"another container", move(func(c *gpushare.NodeUsage) { c.Containers[0].Container = "d" }), true},
	}
	for _, tt := range tests {
		if got := Moved(back, tt.next, 1024); got != tt.moved {
			t.Errorf("%s: Moved = %v, want %v", tt.name, got, tt.moved)
		}
	}
}

// TestSummaryTruncates keeps over-users first, then the largest, beyond the bound.
func TestSummaryTruncates(t *testing.T) {
	var s Sample
	s.GPUs = []GPUUse{{Index: 0}}
	n := gpushare.MaxUsageContainers + 10
	for i := range n {
		s.Containers = append(s.Containers, ContainerUse{Namespace: "n", Pod: fmt.Sprintf("p%03d", i), Container: "c", UsedBytes: uint64(i) * mib, SliceBytes: gib})
	}
	s.Containers[0].UsedBytes = 2 * gib // over its slice, yet the smallest otherwise
	u := Summary(s, time.Now(), time.Second)
	if _, err := gpushare.EncodeNodeUsage(u); err != nil {
		t.Fatal(err)
	}
	if u.Truncated != 10 || len(u.Containers) != gpushare.MaxUsageContainers || u.Containers[0].Pod != "p000" || u.Containers[1].Pod != "p011" {
		t.Errorf("truncated %d, %d kept, first %s then %s; want 10, %d, p000 (over) then p011", u.Truncated, len(u.Containers),
			u.Containers[0].Pod, u.Containers[1].Pod, gpushare.MaxUsageContainers)
	}
}

// fakeGPUs serves readings set by the test.
type fakeGPUs struct {
	mu       sync.Mutex
	readings []nvml.Usage
	err      error
}

func (f *fakeGPUs) Usage() ([]nvml.Usage, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.readings, f.err
}

// event is one recorded Event.
type event struct {
	regarding          string
	kind, reason, note string
}

type fakeEvents struct{ events []event }

func (f *fakeEvents) Eventf(regarding, _ runtime.Object, eventtype, reason, _, note string, args ...any) {
	p := regarding.(*corev1.Pod)
	f.events = append(f.events, event{p.Namespace + "/" + p.Name, eventtype, reason, fmt.Sprintf(note, args...)})
}

// writeCgroup makes <root>/<pid>/cgroup say the process runs in the pod's container (systemd, containerd).
func writeCgroup(t testing.TB, root string, pid uint32, podUID, containerID string) {
	t.Helper()
	dir := filepath.Join(root, fmt.Sprint(pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	line := fmt.Sprintf("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod%s.slice/cri-containerd-%s.scope\n",
		strings.ReplaceAll(podUID, "-", "_"), containerID)
	if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestLoopStep runs the loop's steps on a process table of real-form
// cgroup files: the metrics, one over-use Event after the grace, and the
// node summary published once, then again only when a figure moved a unit.
func TestLoopStep(t *testing.T) {
	root := t.TempDir()
	writeCgroup(t, root, 100, uidA, hexID(0))
	writeCgroup(t, root, 200, uidB, hexID(10))
	// PID 300 exited between NVML's list and the read: no cgroup file.
	gpus := &fakeGPUs{readings: []nvml.Usage{
		{Index: 0, UUID: "GPU-0", UsedBytes: 6 * gib, TotalBytes: 80 * gib, UtilizationPercent: 10, Processes: []nvml.Process{proc(100, 6*gib)}},
		{Index: 1, UUID: "GPU-1", UsedBytes: 3 * gib, TotalBytes: 80 * gib, UtilizationPercent: 20, Processes: []nvml.Process{proc(200, 3*gib), proc(300, gib)}},
		{Index: 2, UUID: "GPU-2", TotalBytes: 80 * gib, UtilizationPercent: -1},
	}}
	reg := prometheus.NewRegistry()
	metrics, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	events := &fakeEvents{}
	var published []string
	l, err := New(Config{GPUs: gpus, Pods: twoPods, ProcRoot: root, Unit: gpushare.GiB, Interval: 10 * time.Second,
		Metrics: metrics, Events: events, Publish: func(_ context.Context, v string) error { published = append(published, v); return nil }})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	ctx := t.Context()
	l.Step(ctx, t0)
	if got := testutil.ToFloat64(metrics.used.WithLabelValues("ns1", "a", "main", "0")); got != 6*gib {
		t.Errorf("main's use %v, want 6 GiB", got)
	}
	if got := testutil.ToFloat64(metrics.ratio.WithLabelValues("ns1", "a", "main", "0")); got != 1.5 {
		t.Errorf("main's ratio %v, want 1.5", got)
	}
	if got := testutil.ToFloat64(metrics.gpuUnattributed.WithLabelValues("1", "GPU-1")); got != gib {
		t.Errorf("GPU 1 unattributed %v, want 1 GiB (PID 300 exited: its owner is unknown)", got)
	}
	if len(published) != 1 || len(events.events) != 0 {
		t.Fatalf("after the first step: %d summaries and events %+v; want one summary and no event", len(published), events.events)
	}
	l.Step(ctx, t0.Add(40*time.Second)) // nothing moved
	l.Step(ctx, t0.Add(60*time.Second)) // a minute over
	if len(published) != 1 {
		t.Errorf("%d summaries with nothing moved, want 1", len(published))
	}
	want := event{"ns1/a", corev1.EventTypeWarning, gpushare.EventReasonOverUse,
		"container main uses 6.0 GiB of GPU 0 (GPU-0), above its slice of 4.0 GiB, for 1m0s"}
	if len(events.events) != 1 || events.events[0] != want {
		t.Fatalf("events %+v, want %+v", events.events, want)
	}
	if got := testutil.ToFloat64(metrics.overuseTotal.WithLabelValues("ns1", "a", "main", "0")); got != 1 {
		t.Errorf("over-use reports %v, want 1", got)
	}
	// main frees memory and pod b goes: a figure moved, and b's series go.
	gpus.mu.Lock()
	gpus.readings[0].Processes[0].UsedBytes, gpus.readings[0].UsedBytes = 2*gib, 2*gib
	gpus.mu.Unlock()
	l.cfg.Pods = func() []*corev1.Pod { return twoPods()[:1] }
	l.Step(ctx, t0.Add(70*time.Second))
	if len(published) != 2 {
		t.Fatalf("%d summaries after a move, want 2", len(published))
	}
	u, err := gpushare.DecodeNodeUsage(published[1])
	if err != nil {
		t.Fatal(err)
	}
	if len(u.Containers) != 2 || u.Containers[0].UsedMiB != 2048 || u.GPUs[1].UnattributedMiB != 4096 {
		t.Errorf("second summary %s; want main at 2048 MiB, side at 0, and b's 3 GiB with PID 300's 1 unattributed", published[1])
	}
	if n := testutil.CollectAndCount(metrics.used); n != 2 {
		t.Errorf("%d container series, want 2 (b's deleted)", n)
	}
	// Another move within 30 s of that write waits for the bound.
	gpus.mu.Lock()
	gpus.readings[0].Processes[0].UsedBytes = 4 * gib
	gpus.mu.Unlock()
	l.Step(ctx, t0.Add(90*time.Second))
	if len(published) != 2 {
		t.Errorf("%d summaries 20 s after the last, want still 2", len(published))
	}
	l.Step(ctx, t0.Add(100*time.Second))
	if len(published) != 3 {
		t.Errorf("%d summaries 30 s after the last, want 3", len(published))
	}
	// A failed reading changes nothing.
	gpus.mu.Lock()
	gpus.err = errors.New("GPU is lost")
	gpus.mu.Unlock()
	l.Step(ctx, t0.Add(200*time.Second))
	if got := testutil.ToFloat64(metrics.reads.WithLabelValues("error")); got != 1 || len(published) != 3 {
		t.Errorf("failed reading: error count %v, %d summaries", got, len(published))
	}
}
