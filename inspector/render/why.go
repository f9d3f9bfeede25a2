package render

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"sigs.k8s.io/yaml"

	"github.com/gpushare/gpushare/inspector/explain"
)

// Value writes v (an explain.Why or explain.Fit) as indented JSON.
func Value(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode as JSON: %w", err)
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// ValueYAML writes v as YAML with the JSON field names.
func ValueYAML(w io.Writer, v any) error {
	b, err := yaml.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode as YAML: %w", err)
	}
	_, err = w.Write(b)
	return err
}

// Why writes the answer of kubectl inspect gpushare why as text: the pod,
// the scheduler's condition, one row per node, the summary and what would help.
func Why(w io.Writer, y *explain.Why) error {
	b := &strings.Builder{}
	header(b, y.Pod, y.Unit, y.Policy)
	if y.Bound != nil {
		fmt.Fprintf(b, "Bound:      %s\n", boundLine(y.Bound))
		fmt.Fprintf(b, "Why there:  %s\n", y.Bound.Why)
	}
	if c := y.Scheduler; c != nil && c.Message != "" {
		fmt.Fprintf(b, "Scheduler:  %s: %s\n", c.Reason, oneLine(c.Message))
	}
	b.WriteString("\n")
	if err := verdicts(b, y.Nodes); err != nil {
		return err
	}
	fmt.Fprintf(b, "\n%s\n", y.Summary)
	helpLines(b, y.Help)
	_, err := io.WriteString(w, b.String())
	return err
}

// Fit writes the answer of kubectl inspect gpushare fit as text.
func Fit(w io.Writer, f *explain.Fit) error {
	b := &strings.Builder{}
	header(b, f.Pod, f.Unit, f.Policy)
	b.WriteString("\n")
	if f.Replicas > 1 && f.Placed > 0 {
		tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "COPY\tNODE\tGPU\tSCORE")
		for i, c := range f.Placements {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%d\n", i+1, c.Node, ints(c.GPUs), c.Score)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		b.WriteString("\n")
	}
	nodes := f.Nodes
	if f.Stopped != nil {
		fmt.Fprintf(b, "Copy %d:\n", f.Stopped.Copy)
		nodes = f.Stopped.Nodes
	}
	if err := verdicts(b, nodes); err != nil {
		return err
	}
	fmt.Fprintf(b, "\n%s\n", f.Summary)
	helpLines(b, f.Help)
	_, err := io.WriteString(w, b.String())
	return err
}

func header(b *strings.Builder, p explain.PodInfo, unit, policy string) {
	fmt.Fprintf(b, "Pod:        %s/%s\n", p.Namespace, p.Name)
	req := explain.DescribeRequest(p, unit)
	var asks []string
	if p.Isolation != "" {
		asks = append(asks, "isolation "+p.Isolation)
	}
	if p.ComputePercent > 0 {
		asks = append(asks, "compute-percent "+strconv.Itoa(p.ComputePercent))
	}
	if p.TopologyRequired {
		asks = append(asks, "NVLink required")
	}
	if len(asks) > 0 {
		req += " (" + strings.Join(asks, ", ") + ")"
	}
	fmt.Fprintf(b, "Request:    %s\n", req)
	fmt.Fprintf(b, "Policy:     %s\n", policy)
}

func boundLine(bd *explain.Bound) string {
	s := bd.Node
	if len(bd.GPUs) > 0 {
		s += ", GPU " + ints(bd.GPUs)
	}
	if bd.Assigned {
		return s + " (allocated by the device plugin)"
	}
	return s + " (in flight: not yet allocated by the device plugin)"
}

// verdicts writes one row per node; nodes that are not gpushare nodes for
// the plain reason (no gpu-mem) share one line under the table, since a
// cluster may have thousands of them.
func verdicts(b *strings.Builder, nodes []explain.NodeVerdict) error {
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tVERDICT\tGPU\tFREE\tLARGEST FREE\tREASON")
	var plain []string
	for _, v := range nodes {
		if v.Kind == explain.KindNotGPUShare && len(v.MIGGPUs) == 0 {
			plain = append(plain, v.Name)
			continue
		}
		gpu := "-"
		if len(v.GPUs) > 0 {
			gpu = ints(v.GPUs)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\n", v.Name, v.Kind, gpu, v.Free, v.LargestFree, reason(v))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(plain) > 0 {
		fmt.Fprintf(b, "not gpushare nodes (no allocatable gpu-mem): %s\n", names(plain))
	}
	return nil
}

// reason joins the extender's reason, the inspector's reading and the
// scheduler's predicates in one cell.
func reason(v explain.NodeVerdict) string {
	var parts []string
	switch {
	case v.Kind == explain.KindFits || v.Kind == explain.KindScheduler:
		parts = append(parts, fmt.Sprintf("fits on GPU %s, extender score %d", ints(v.GPUs), v.Score))
	case v.Detail != "":
		parts = append(parts, v.Reason+" ("+v.Detail+")")
	default:
		parts = append(parts, v.Reason)
	}
	if len(v.Scheduler) > 0 {
		parts = append(parts, "scheduler: "+strings.Join(v.Scheduler, ", "))
	}
	return strings.Join(parts, "; ")
}

func helpLines(b *strings.Builder, help []string) {
	if len(help) == 0 {
		return
	}
	b.WriteString("Would help:\n")
	for _, h := range help {
		fmt.Fprintf(b, "  - %s\n", h)
	}
}

func ints(xs []int) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = strconv.Itoa(x)
	}
	return strings.Join(parts, ",")
}

// names lists up to ten names, then how many more.
func names(all []string) string {
	if len(all) <= 10 {
		return strings.Join(all, ", ")
	}
	return strings.Join(all[:10], ", ") + " and " + strconv.Itoa(len(all)-10) + " more"
}

// oneLine folds a multi-line scheduler message into one line.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
