// Package usage measures the GPU memory each container really uses, beside
// the slice it was given, and names the containers above their slice
// (docs/usage.md).
//
// Every interval the loop reads, through NVML, each GPU's memory in use and
// the processes holding memory on it; it maps each process to its pod and
// container through the process's cgroup (package cgroup) and the pods'
// container IDs, and each container to its slice through the pod's
// gpushare.io/container-env record, which the device plugin and, on pods the
// webhook translated, the DRA driver write. From that one Sample it
//   - sets the Prometheus series (Metrics);
//   - reports a container that stays above its slice for longer than a
//     grace period with a GPUShareOverUse Event on its pod, repeated while
//     it lasts as one series (OverUse);
//   - publishes a compact summary on the Node (gpushare.io/usage) at most
//     once per PublishEvery, and only when a figure moved by a memory unit
//     or more (Publisher), for the inspector.
//
// Attribute, OverUse and the summary's rules are pure; Loop does the I/O
// through the interfaces in Config.
package usage
