package ui_test

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/inspector/collect"
	"github.com/gpushare/gpushare/inspector/internal/fixture"
	"github.com/gpushare/gpushare/inspector/ui"
)

// BenchmarkBuildView is one rebuild of the live map's view at 1,000 nodes of
// 8 GPUs and 10,000 pods, 20 of them pending (each explained by a replay of
// the placement): the server's cost per change.
func BenchmarkBuildView(b *testing.B) {
	nodes, pods := fixture.Cluster(1000, 10, 8, 80)
	for i := range ui.MaxExplained {
		p := fixture.Pod("ns-wait", "waiting-"+string(rune('a'+i)), "", fixture.Container("main", 40))
		p.Status.Phase = corev1.PodPending
		pods = append(pods, p)
	}
	objs := collect.Objects{Nodes: nodes, Pods: pods}
	b.ReportAllocs()
	for b.Loop() {
		ui.BuildView(objs, allocator.BestFit)
	}
}
