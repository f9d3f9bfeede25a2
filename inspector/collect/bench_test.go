package collect_test

import (
	"io"
	"testing"

	"github.com/gpushare/gpushare/inspector/collect"
	"github.com/gpushare/gpushare/inspector/internal/fixture"
	"github.com/gpushare/gpushare/inspector/render"
)

// BenchmarkCollectRender5000Nodes is the CLI's work after the two LISTs at
// 5,000 nodes of 8 GPUs and 50,000 pods (half the nodes publishing
// gpushare.io/gpus and per-container records), for each view.
func BenchmarkCollectRender5000Nodes(b *testing.B) {
	nodes, pods := fixture.Cluster(5000, 10, 8, 80)
	views := []struct {
		name string
		f    func(io.Writer, *collect.Report) error
	}{{"summary", render.Summary}, {"details", render.Details}, {"json", render.JSON}}
	for _, v := range views {
		b.Run(v.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				r := collect.Build(nodes, pods)
				if len(r.Nodes) != 5000 || len(r.Skipped) != 0 {
					b.Fatalf("%d nodes, %d skipped", len(r.Nodes), len(r.Skipped))
				}
				if err := v.f(io.Discard, r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
