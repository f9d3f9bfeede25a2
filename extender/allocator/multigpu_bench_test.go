package allocator

import (
	"fmt"
	"testing"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

// BenchmarkChooseSet is the filter's cost of set selection for one node:
// islands (NVLink islands of four, PCIe between) goes through the
// exhaustive search, nvswitch (all pairs equal) through the best-fit
// shortcut. Half the GPUs carry some load so best fit has work to do.
func BenchmarkChooseSet(b *testing.B) {
	for _, n := range []int{8, 16} {
		for _, m := range []int{2, 4} {
			for _, topo := range []struct {
				name  string
				links func(n int) []gpushare.GPULink
			}{
				{"islands", func(n int) []gpushare.GPULink { return islandLinks(n, 4) }},
				{"nvswitch", nvswitchLinks},
			} {
				gpus := gpusOf(repeatUnits(n, 80), nil)
				for i := range gpus {
					gpus[i].Used = uint64((i * 37) % 41)
				}
				links := NewLinkScores(gpus, topo.links(n))
				usable := func(int) bool { return true }
				b.Run(fmt.Sprintf("gpus=%d/m=%d/topo=%s", n, m, topo.name), func(b *testing.B) {
					b.ReportAllocs()
					for b.Loop() {
						if _, unfit := ChooseSet(gpus, usable, links, m, 10, false); unfit != nil {
							b.Fatal(unfit.Reason)
						}
					}
				})
			}
		}
	}
}
