package allocate_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpushare/gpushare/plugin/allocate"
	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/inventory"
)

// BenchmarkMatch100Pods times one Allocate decision on a node with 100 pods:
// 50 in flight (five sizes, one GPU each, as the extender's rule makes
// them) and 50 already assigned; p50 and p99 of the calls are reported.
// "memo" keeps the decoded pods between calls, as the plugin does (pods
// change between two calls rarely); "decode" decodes every pod every call.
func BenchmarkMatch100Pods(b *testing.B) {
	b.Run("memo", func(b *testing.B) { benchmarkMatch(b, allocate.NewMemo()) })
	b.Run("decode", func(b *testing.B) { benchmarkMatch(b, nil) })
}

func benchmarkMatch(b *testing.B, memo *allocate.Memo) {
	var gpus []inventory.GPU
	for i := range 8 {
		gpus = append(gpus, inventory.GPU{Index: i, UUID: fmt.Sprintf("GPU-%d", i), MemoryMiB: 143771})
	}
	inv, err := inventory.New(gpus, gpushare.GiB)
	if err != nil {
		b.Fatal(err)
	}
	var pods []*corev1.Pod
	for i := range 100 {
		size := int64(1 + i%5)
		opts := []podOpt{onGPU(int(size), 140, int64(i))}
		if i >= 50 {
			opts = append(opts, annotate(gpushare.AnnotationAssigned, "true"))
		}
		p := pod(fmt.Sprintf("p%03d", i), []int64{size, size}, opts...)
		p.ResourceVersion = "1"
		pods = append(pods, p)
	}
	in := allocate.Input{Node: node, Inventory: inv, Pods: pods, Served: allocate.Served{}, Memo: memo}
	var took []time.Duration
	for b.Loop() {
		start := time.Now()
		if _, err := allocate.Match(in, []uint64{3}); err != nil {
			b.Fatal(err)
		}
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(took[len(took)*99/100].Microseconds()), "p99-µs")
}
