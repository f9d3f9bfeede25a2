package render

import (
	"fmt"
	"time"

	"github.com/gpushare/gpushare/inspector/collect"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

// unitMiB is the report's unit in MiB (GiB when unreadable, the default).
func unitMiB(r *collect.Report) uint64 {
	u, err := gpushare.ParseUnit(r.Unit)
	if err != nil {
		return gpushare.GiB.MiB()
	}
	return u.MiB()
}

// inUnits writes MiB in the report's unit with one decimal place.
func inUnits(mib, unit uint64) string {
	return fmt.Sprintf("%.1f", float64(mib)/float64(unit))
}

// usedLine is a node's USED header: what containers with a slice use against
// what is allocated, all memory in use on its GPUs, and the over-users.
func usedLine(n *collect.Node, unit uint64) string {
	use := n.Usage
	line := inUnits(use.SlicedMiB, unit) + " of " + u(n.Allocated) + " allocated, " + inUnits(use.UsedMiB, unit) + " in use on the GPUs"
	switch use.OverSlice {
	case 0:
	case 1:
		line += "; 1 container over its slice"
	default:
		line += fmt.Sprintf("; %d containers over their slice", use.OverSlice)
	}
	return line + " (read " + use.At.UTC().Format(time.RFC3339) + ")"
}

// usedCell is a container's USED cell: its use in the report's unit, marked
// when over its slice; "-" where unknown.
func usedCell(c collect.Container, unit uint64) string {
	if c.UsedMiB == nil {
		return "-"
	}
	cell := inUnits(*c.UsedMiB, unit)
	if c.OverSlice {
		cell += " (over)"
	}
	return cell
}

// clusterUsedLine is the last line's companion on clusters where some node
// measures use.
func clusterUsedLine(r *collect.Report, unit uint64) string {
	use := r.Usage
	line := "Used/Allocated GPU Memory In Cluster:\t" + inUnits(use.UsedMiB, unit) + "/" + inUnits(use.AllocatedMiB, unit) +
		" (" + u(percentOf(use.UsedMiB, use.AllocatedMiB)) + "%)"
	// No tab after the figures: the line stays out of the column the
	// allocation line above sets, which keeps its old width.
	return line + fmt.Sprintf(" on %d of %d nodes measuring use\n", use.Nodes, len(r.Nodes))
}

// percentOf truncates part*100/whole; 0 for an empty whole.
func percentOf(part, whole uint64) uint64 {
	if whole == 0 {
		return 0
	}
	return part * 100 / whole
}
