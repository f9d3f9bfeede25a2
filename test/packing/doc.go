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
// DRA mode (docs/dra.md) is measured through Options.Placer, a scheduler
// that replaces filter, prioritize and bind: the simulation hands it each
// pod and the nodes' snapshots, charges the node and GPUs it returns and
// checks them (ErrBookkeeping for a GPU over its size or a pod given other
// shares than it asked for), and tells it of every departure. The DRA
// placer lives in cmd/packbench/dra, a module apart, since
// kube-scheduler's structured allocator (k8s.io/dynamic-resource-allocation
// /structured) brings CEL and the API server's libraries, which the
// project's go.mod does not require; packbench adds its runs (dra.Runs) to
// RunsFor's. It calls the real allocator, no copy of its rules:
//   - Every node publishes the ResourceSlice plugin/dra/slice builds for its
//     GPUs (one device per GPU, memory as consumable capacity in GiB steps,
//     the NVLink domain from the node's simulated topology, ProfileReading);
//     the DeviceClass is manifests/dra's; every pod becomes the claim
//     webhook/translate makes of it (a pod object with the container's
//     gpu-mem limit and the gpu-count label).
//   - Filter: for each node tried, an allocator over the node's slice and
//     the allocated state of the claims on it (each shared device ID and
//     consumed capacity, as kube-scheduler's claim tracker gathers them),
//     with kube-scheduler 1.37's default DRA features; Allocate picks the
//     first devices in slice order that fit.
//   - Node choice: kube-scheduler's scores do not see DRA capacity, so every
//     node the allocator fits ties and selectHost picks one at random. The
//     run "dra" takes a seeded random one, uniform among the nodes where
//     Allocate succeeds (the first success in a random order of the nodes,
//     drawn from the seed, the placements so far and the pod), and
//     "dra/lowest" the lowest index. Nodes with fewer GPUs with the pod's
//     share free than it needs are skipped without asking (Exhaustive asks
//     them too; tests check this changes nothing).
//   - Bind: the pod holds its allocation result (devices, consumed memory,
//     share IDs) until it departs, when it is removed from the node's state.
//   - The workloads' multi-GPU pods ask for the default topology,
//     preferred, which the webhook translates as two alternatives, the GPUs
//     of one NVLink domain, then any; "dra/nvlink" (multi-GPU workloads)
//     replays them as topology "required": matchAttribute on the NVLink
//     domain.
//
// Everything here is pure: no files, no clocks, no package-level state. The
// program in cmd/packbench reads and writes the files and draws the plots.
package packing
