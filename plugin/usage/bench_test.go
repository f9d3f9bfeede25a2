package usage

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/nvml"
)

// BenchmarkLoopStep is one reading of a node of 8 GPUs and 64 containers
// (8 per GPU, one process each), every process's owner read from a real-form
// /proc/<pid>/cgroup file: the CPU the loop spends per interval, NVML's own
// calls aside (the reader is a fake). The node summary is not republished
// (nothing moves), as on a steady node.
func BenchmarkLoopStep(b *testing.B) {
	root := b.TempDir()
	var pods []*corev1.Pod
	var readings []nvml.Usage
	for g := range 8 {
		r := nvml.Usage{Index: g, UUID: fmt.Sprintf("GPU-%d", g), TotalBytes: 80 * gib, UtilizationPercent: 50}
		for c := range 8 {
			n := g*8 + c
			uid := fmt.Sprintf("%08x-0000-4000-8000-%012x", n, n)
			pods = append(pods, testPod("bench", fmt.Sprintf("pod-%02d", n), uid, n, []string{"main"},
				gpushare.ContainerEnvs{"main": {GPUIndex: g, PodUnits: 8, ContainerUnits: 8, DevUnits: 80}}))
			pid := uint32(10000 + n)
			writeCgroup(b, root, pid, uid, hexID(n))
			r.Processes = append(r.Processes, proc(pid, 7*gib))
			r.UsedBytes += 7 * gib
		}
		readings = append(readings, r)
	}
	l, err := New(Config{GPUs: &fakeGPUs{readings: readings}, Pods: func() []*corev1.Pod { return pods }, ProcRoot: root,
		Unit: gpushare.GiB, Publish: func(context.Context, string) error { return nil }})
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	l.Step(b.Context(), now)
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(10 * time.Second)
		l.Step(b.Context(), now)
	}
}
