// Package packing measures how well the extender's placement policies pack
// GPU memory, through the real allocator (extender/allocator): no placement
// rule is re-implemented here.
//
// A workload is a list of pods (arrival time, size in GiB, lifetime and, for
// a multi-GPU pod, its number of GPUs), generated from a seed by Generate and
// saved as JSON lines (WriteWorkload, ReadWorkload) so every run replays the
// same pods. A multi-GPU pod is what the label aliyun.com/gpu-count "M" asks
// for (issue 15): GiB/M on each of M GPUs of one node, the set chosen by the
// allocator (preferred topology); MultiGPUMix draws 10% of them, two and four
// GPUs. A fleet is a list of node types (count, GPUs per node, GiB per GPU
// and a topology profile, as the device plugin's simulated machines publish
// it: nvswitch, islands, pcie or mixed; none by default). For workloads with
// multi-GPU pods a run counts how many got GPUs all NVLink-connected by the
// fleet's real links (TopologyStats), and RunsFor adds a topology-blind
// bestfit run (Options.Blind: nodes publish no links) to compare with; the
// scenario islands-multigpu is that comparison (go -C
// test/packing/cmd/packbench run . -only islands-multigpu). Fill places the pods in arrival
// order until the first one fits nowhere; Churn replays arrivals and
// departures (Poisson arrivals, random lifetimes) as an event simulation.
// FFD is the offline first-fit-decreasing reference both compare with; it
// packs a multi-GPU pod as M independent items of GiB/M (a relaxation).
//
// How the simulation stands in for kube-scheduler and the extender:
//   - Filter: a node passes when allocator.Place finds room on it.
//   - Prioritize: allocator.Score on each passing node; the highest wins.
//     Ties go to the lowest node index (TieLowest) or to a seeded random
//     choice among the tied nodes (TieRandom, what kube-scheduler's selectHost
//     does when the extender is the only score that differs).
//   - Bind: the placement allocator.Place returned on the chosen node is
//     charged with allocator.Charges; the node's snapshot is rebuilt.
//   - The device plugin's Allocate is instant, so no pod is ever in flight
//     and the hold-back rule never applies.
//   - A pod that fits nowhere waits (pending) and is retried, in arrival
//     order, after every departure; pods behind it that fit are placed (no
//     head-of-line blocking), as kube-scheduler retries unschedulable pods on
//     pod-deletion events. A pod larger than every GPU of the fleet is
//     rejected and counted apart.
//
// Everything here is pure: no files, no clocks, no package-level state. The
// program in cmd/packbench reads and writes the files and draws the plots.
package packing
