package render

import (
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/gpushare/gpushare/inspector/collect"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

// The old CLI's layout constants: the summary's dash line is its first row
// plus 20, the details' is the first node's pod rows plus 10.
const (
	summaryDashExtra = 20
	detailsDashExtra = 10
	tabPadding       = 2
)

// newTabWriter returns the old CLI's tabwriter: no minimum width, padding 2, spaces.
func newTabWriter(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 0, tabPadding, ' ', 0)
}

// errWriter remembers the first write error so the table code stays linear.
type errWriter struct {
	w   io.Writer
	err error
}

// WriteString writes s unless an earlier write failed.
func (e *errWriter) WriteString(s string) {
	if e.err == nil {
		_, e.err = io.WriteString(e.w, s)
	}
}

// Summary writes the one-line-per-node table of `kubectl inspect gpushare`.
func Summary(w io.Writer, r *collect.Report) error {
	tw := newTabWriter(w)
	out := &errWriter{w: tw}
	cols := gpuColumns(r.Nodes)
	pending := false
	for i := range r.Nodes {
		pending = pending || hasPending(&r.Nodes[i])
	}

	var b strings.Builder
	b.WriteString("NAME\tIPADDRESS\t")
	for i := range cols {
		b.WriteString("GPU" + strconv.Itoa(i) + "(Allocated/Total)\t")
	}
	if pending {
		b.WriteString("PENDING(Allocated)\t")
	}
	b.WriteString("GPU Memory(" + r.Unit + ")\n")
	out.WriteString(b.String())

	dash := 0
	for i := range r.Nodes {
		n := &r.Nodes[i]
		b.Reset()
		b.WriteString(n.Name + "\t" + n.Address + "\t")
		for g := range cols {
			b.WriteString(summaryCell(n, g) + "\t")
		}
		if pending {
			if hasPending(n) {
				b.WriteString(u(n.Pending))
			}
			b.WriteString("\t")
		}
		b.WriteString(u(n.Allocated) + "/" + u(n.Total) + "\n")
		if dash == 0 {
			// The old CLI measured its first row's bytes, tabs and newline included.
			dash = b.Len() + summaryDashExtra
		}
		out.WriteString(b.String())
	}
	out.WriteString(strings.Repeat("-", dash) + "\n")
	out.WriteString("Allocated/Total GPU Memory In Cluster:\n")
	out.WriteString(u(r.Allocated) + "/" + u(r.Total) + " (" + u(r.AllocatedPercent) + "%)\t\n")
	if out.err != nil {
		return out.err
	}
	return tw.Flush()
}

// Details writes the per-node, per-pod view of `kubectl inspect gpushare -d`.
func Details(w io.Writer, r *collect.Report) error {
	tw := newTabWriter(w)
	out := &errWriter{w: tw}
	dash := 0
	for i := range r.Nodes {
		n := &r.Nodes[i]
		out.WriteString("\n")
		out.WriteString("NAME:\t" + n.Name + "\n")
		out.WriteString("IPADDRESS:\t" + n.Address + "\n")
		if n.Mode == collect.ModeDRA {
			// Only DRA nodes get the line: device-plugin nodes print as before.
			out.WriteString("MODE:\t" + collect.ModeDRA + " (" + gpushare.DRADriverName + ")\n")
		}
		if bad := unhealthy(n); bad != "" {
			out.WriteString("UNHEALTHY:\t" + bad + "\n")
		}
		if tiers := isolation(n); tiers != "" {
			out.WriteString("ISOLATION:\t" + tiers + "\n")
		}
		if n.Usage != nil {
			out.WriteString("USED:\t" + usedLine(n, unitMiB(r)) + "\n")
		}
		out.WriteString("\n")

		cols := gpuColumns(r.Nodes[i : i+1])
		pending := hasPending(n)
		var b strings.Builder
		b.WriteString("NAME\tNAMESPACE\t")
		for g := range cols {
			b.WriteString("GPU" + strconv.Itoa(g) + "(Allocated)\t")
		}
		if pending {
			b.WriteString("Pending(Allocated)\t")
		}
		b.WriteString("\n")
		out.WriteString(b.String())

		b.Reset()
		for _, p := range n.Pods {
			b.WriteString(p.Name + "\t" + p.Namespace + "\t")
			for g := range cols {
				b.WriteString(u(chargeOn(p, g)) + "\t")
			}
			if pending {
				if p.Pending {
					b.WriteString(u(p.Units) + "\t")
				} else {
					b.WriteString("0\t")
				}
			}
			b.WriteString("\n")
		}
		if dash == 0 {
			// The old CLI measured the first node's pod rows, tabs and newlines included.
			dash = b.Len() + detailsDashExtra
		}
		out.WriteString(b.String())
		out.WriteString("Allocated :\t" + u(n.Allocated) + " (" + u(n.AllocatedPercent) + "%)\t\n")
		out.WriteString("Total :\t" + u(n.Total) + " \t\n")
		switch {
		case n.Mode == collect.ModeDRA:
			if len(n.Claims) > 0 {
				writeClaims(out, n)
			}
		case n.GPUSizes == collect.SizesPublished && len(n.Pods) > 0:
			writeContainers(out, n, unitMiB(r))
		}
		out.WriteString(strings.Repeat("-", dash) + "\n")
	}
	out.WriteString("\n")
	out.WriteString("\n")
	out.WriteString("Allocated/Total GPU Memory In Cluster:\t" +
		u(r.Allocated) + "/" + u(r.Total) + " (" + u(r.AllocatedPercent) + "%)\t\n")
	if r.Usage != nil {
		out.WriteString(clusterUsedLine(r, unitMiB(r)))
	}
	if out.err != nil {
		return out.err
	}
	return tw.Flush()
}

// writeContainers adds, on nodes run by our device plugin, one line per
// gpu-mem container with the GPU and the limits it was given. The blank line
// before it ends the tabwriter's column blocks, so the old table above keeps
// its exact widths; nodes of the old plugin never get this section, so their
// view stays byte for byte the old one.
//
// A container of a multi-GPU pod lists all its GPUs ("0,1") and its
// request as "8 (4/GPU)"; containers on one GPU print as before.
//
// The ISOLATION column (what each pod's isolation annotations ask) appears
// only on nodes where some pod sets them, and the USED column (what the
// container's processes use, in the report's unit) only on nodes that
// measure use, so other nodes keep the section as it was.
func writeContainers(out *errWriter, n *collect.Node, unit uint64) {
	asks := slices.ContainsFunc(n.Pods, func(p collect.Pod) bool { return podAsks(p) != "-" })
	used := n.Usage != nil
	out.WriteString("\n")
	header := "POD\tCONTAINER\tREQUEST\t"
	if used {
		header += "USED\t"
	}
	header += "GPU\t"
	if asks {
		header += "ISOLATION\t"
	}
	out.WriteString(header + "ENV\n")
	for _, p := range n.Pods {
		for _, c := range p.Containers {
			name := c.Name
			if c.Init {
				name += " (init)"
			}
			gpu := "-"
			if c.GPU != nil {
				gpu = strconv.Itoa(*c.GPU)
			}
			request := u(c.Units)
			if len(c.GPUs) > 1 {
				// A container on several GPUs: all of them, and its share of each.
				gpu = joinInts(c.GPUs)
				request += " (" + u(c.UnitsPerGPU) + "/GPU)"
			}
			row := p.Namespace + "/" + p.Name + "\t" + name + "\t" + request + "\t"
			if used {
				row += usedCell(c, unit) + "\t"
			}
			row += gpu + "\t"
			if asks {
				row += podAsks(p) + "\t"
			}
			out.WriteString(row + envCell(c) + "\n")
		}
	}
}

// writeClaims adds, on a DRA node, one line per allocated ResourceClaim
// with its memory, its GPUs and the pods (and their containers) using it;
// a claim no pod reserves shows "-". Like the container section of
// device-plugin nodes it follows a blank line, keeping the table above as is.
func writeClaims(out *errWriter, n *collect.Node) {
	out.WriteString("\nCLAIM\tREQUEST\tGPU\tPODS\n")
	for _, c := range n.Claims {
		gpus := claimGPUs(c)
		request := u(c.Units)
		if len(gpus) > 1 && c.Units%uint64(len(gpus)) == 0 && evenShares(c, gpus) {
			request += " (" + u(c.Units/uint64(len(gpus))) + "/GPU)"
		}
		out.WriteString(c.Namespace + "/" + c.Name + "\t" + request + "\t" + joinInts(gpus) + "\t" + claimUsers(n, c) + "\n")
	}
}

// claimGPUs lists, ascending and once each, the GPUs a claim holds memory on.
func claimGPUs(c collect.Claim) []int {
	var gpus []int
	for _, s := range c.Shares {
		gpus = append(gpus, s.Index)
	}
	slices.Sort(gpus)
	return slices.Compact(gpus)
}

// evenShares reports whether the claim holds as much on each of gpus.
func evenShares(c collect.Claim, gpus []int) bool {
	per := map[int]uint64{}
	for _, s := range c.Shares {
		per[s.Index] += s.Units
	}
	return !slices.ContainsFunc(gpus, func(g int) bool { return per[g] != per[gpus[0]] })
}

// claimUsers is "ns/pod (container, ...)" for each pod reserving c, with
// the containers that name it; "-" when no pod uses it.
func claimUsers(n *collect.Node, c collect.Claim) string {
	if len(c.Pods) == 0 {
		return "-"
	}
	parts := make([]string, 0, len(c.Pods))
	for _, key := range c.Pods {
		s := key
		if names := claimContainers(n, key, c.Name); len(names) > 0 {
			s += " (" + strings.Join(names, ", ") + ")"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}

// claimContainers names the containers of pod key that use claim.
func claimContainers(n *collect.Node, key, claim string) []string {
	var names []string
	for _, p := range n.Pods {
		if p.Namespace+"/"+p.Name != key {
			continue
		}
		for _, c := range p.Containers {
			if slices.Contains(c.Claims, claim) {
				names = append(names, c.Name)
			}
		}
	}
	return names
}

// podAsks is a pod's isolation annotations as a cell: the tier required
// (any when only a share is set) and the compute share, e.g. "mps 30%";
// "-" when it sets neither.
func podAsks(p collect.Pod) string {
	tier := p.Isolation
	if tier == "" {
		if p.ComputePercent == 0 {
			return "-"
		}
		tier = string(gpushare.IsolationAny)
	}
	if p.ComputePercent > 0 {
		tier += " " + strconv.Itoa(p.ComputePercent) + "%"
	}
	return tier
}

// shownEnv are the variables a container limits itself with, in display
// order. GPUSHARE_GPU_COUNT is set only for a container on several GPUs.
var shownEnv = [...]string{gpushare.EnvVisibleDevices, gpushare.EnvGPUCount, gpushare.EnvContainerUnits, gpushare.EnvDevUnits, gpushare.EnvDisableIsolation,
	gpushare.EnvIsolation, gpushare.EnvComputePercent}

// envCell shows the recorded limits, or why there are none.
func envCell(c collect.Container) string {
	switch c.State {
	case collect.StateNotAllocated:
		return "(not allocated yet)"
	case collect.StateUnrecorded:
		return "(assigned, no per-container record)"
	}
	var parts []string
	if c.State == collect.StateMismatch {
		parts = append(parts, "MISMATCH with the assignment:")
	}
	for _, k := range shownEnv {
		if v, ok := c.Env[k]; ok {
			parts = append(parts, k+"="+v)
		}
	}
	return strings.Join(parts, " ")
}

// gpuColumns is one past the highest GPU index among nodes: the old CLI's
// column count, keyed by index so GPU2 stays GPU2 on a node missing GPU1.
func gpuColumns(nodes []collect.Node) int {
	cols := 0
	for i := range nodes {
		for _, g := range nodes[i].GPUs {
			cols = max(cols, g.Index+1)
		}
	}
	return cols
}

// summaryCell is "allocated/total" for GPU index g, "0/0" when the node has
// no such GPU (as the old CLI printed), with a marker for GPUs the node does
// not describe, unhealthy GPUs, GPUs whose tier enforces limits ("(mps)",
// "(hami-core)") and GPUs that fell back from their tier ("(fell back to
// none)"). A GPU without limits, the old behaviour, has no marker, so a
// cluster without tiers prints the old table byte for byte.
func summaryCell(n *collect.Node, g int) string {
	for _, x := range n.GPUs {
		if x.Index != g {
			continue
		}
		cell := u(x.Allocated) + "/" + u(x.Total)
		switch {
		case !x.Known:
			cell += " (unknown)"
		case !x.Healthy:
			cell += " (unhealthy)"
		case x.IsolationReason != "":
			cell += " (fell back to " + tierOf(x) + ")"
		case x.Enforces():
			cell += " (" + x.Isolation + ")"
		}
		return cell
	}
	return "0/0"
}

// tierOf names a GPU's effective tier; a plugin that publishes none offers none.
func tierOf(g collect.GPU) string {
	if g.Isolation == "" {
		return string(gpushare.IsolationNone)
	}
	return g.Isolation
}

// isolation describes a node's tiers for -d: "mps" when every GPU offers the
// same and none fell back, else each GPU's, with why it fell back:
// "GPU0 mps, GPU1 none (MPS control daemon not answering)". Empty for nodes
// whose plugin publishes no tier.
func isolation(n *collect.Node) string {
	// GPUs only pods name have no tier to show.
	known := slices.DeleteFunc(slices.Clone(n.GPUs), func(g collect.GPU) bool { return !g.Known })
	if !slices.ContainsFunc(known, func(g collect.GPU) bool { return g.Isolation != "" }) {
		return ""
	}
	uniform := !slices.ContainsFunc(known, func(g collect.GPU) bool {
		return g.IsolationReason != "" || tierOf(g) != tierOf(known[0])
	})
	if uniform {
		return tierOf(known[0])
	}
	parts := make([]string, 0, len(known))
	for _, g := range known {
		s := "GPU" + strconv.Itoa(g.Index) + " " + tierOf(g)
		if g.IsolationReason != "" {
			s += " (" + g.IsolationReason + ")"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}

// unhealthy lists a node's unhealthy GPUs with their reasons, "" when none.
func unhealthy(n *collect.Node) string {
	var parts []string
	for _, g := range n.GPUs {
		if g.Healthy {
			continue
		}
		s := "GPU" + strconv.Itoa(g.Index)
		if g.Reason != "" {
			s += " (" + g.Reason + ")"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}

// hasPending reports whether a pod on n is bound without a GPU assignment.
func hasPending(n *collect.Node) bool {
	for _, p := range n.Pods {
		if p.Pending {
			return true
		}
	}
	return false
}

// chargeOn is what pod p holds on GPU index g.
func chargeOn(p collect.Pod, g int) uint64 {
	for _, c := range p.GPUs {
		if c.Index == g {
			return c.Units
		}
	}
	return 0
}

// joinInts lists GPU indices as NVIDIA_VISIBLE_DEVICES does: "0,1".
func joinInts(v []int) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = strconv.Itoa(x)
	}
	return strings.Join(parts, ",")
}

// u formats units.
func u(v uint64) string { return strconv.FormatUint(v, 10) }
