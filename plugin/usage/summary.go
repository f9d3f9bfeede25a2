package usage

import (
	"cmp"
	"slices"
	"time"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

const mib = 1 << 20

// Summary is s, read at at by a loop reading every interval, in the node
// annotation's form. Beyond gpushare.MaxUsageContainers entries it keeps
// the containers above their slice first, then the largest users.
func Summary(s Sample, at time.Time, interval time.Duration) gpushare.NodeUsage {
	u := gpushare.NodeUsage{At: at, IntervalSeconds: max(1, int(interval/time.Second))}
	for _, g := range s.GPUs {
		gu := gpushare.GPUUsage{Index: g.Index, UsedMiB: roundDiv(g.UsedBytes, mib), UnattributedMiB: roundDiv(g.UnattributedBytes, mib)}
		if g.UtilizationPercent >= 0 {
			p := g.UtilizationPercent
			gu.Utilization = &p
		}
		u.GPUs = append(u.GPUs, gu)
	}
	containers := slices.Clone(s.Containers)
	if len(containers) > gpushare.MaxUsageContainers {
		slices.SortStableFunc(containers, func(a, b ContainerUse) int {
			if a.Over() != b.Over() {
				if a.Over() {
					return -1
				}
				return 1
			}
			return cmp.Compare(b.UsedBytes, a.UsedBytes)
		})
		u.Truncated = len(containers) - gpushare.MaxUsageContainers
		containers = containers[:gpushare.MaxUsageContainers]
	}
	for _, c := range containers {
		cu := c.ref()
		cu.UsedMiB, cu.SliceMiB = roundDiv(c.UsedBytes, mib), roundDiv(c.SliceBytes, mib)
		u.Containers = append(u.Containers, cu)
	}
	slices.SortFunc(u.Containers, gpushare.CompareContainerUsage)
	return u
}

// Moved reports whether next is worth publishing over last: a GPU or a
// container appeared or went, a container crossed its slice, or a figure
// moved by unitMiB or more. Utilisation moves by the percentage point and
// alone never counts: it would rewrite the node every interval on a busy GPU.
func Moved(last, next gpushare.NodeUsage, unitMiB uint64) bool {
	if len(last.GPUs) != len(next.GPUs) || len(last.Containers) != len(next.Containers) || last.Truncated != next.Truncated {
		return true
	}
	far := func(a, b uint64) bool { return max(a, b)-min(a, b) >= unitMiB }
	for i, g := range next.GPUs {
		l := last.GPUs[i]
		if l.Index != g.Index || far(l.UsedMiB, g.UsedMiB) || far(l.UnattributedMiB, g.UnattributedMiB) {
			return true
		}
	}
	for i, c := range next.Containers {
		l := last.Containers[i]
		if gpushare.CompareContainerUsage(l, c) != 0 || l.SliceMiB != c.SliceMiB || l.Over() != c.Over() || far(l.UsedMiB, c.UsedMiB) {
			return true
		}
	}
	return false
}
