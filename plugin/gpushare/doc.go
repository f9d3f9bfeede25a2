// Package gpushare owns the gpushare compatibility contract (docs/contract.md),
// written once and shared by the device plugin, the scheduler extender and the
// kubectl inspector, so the three programs cannot drift apart.
//
// It holds the resource, annotation, label, environment and file names; the
// memory Unit and its MiB arithmetic; a pod's gpu-mem request per container and
// in total, following the Kubernetes rule for init and sidecar containers; and
// the codecs of every value the programs exchange through the API server or the
// kubelet: the pod assignment annotations, the per-container allocation
// annotation, our per-node GPU description, the unhealthy-GPU ConfigMap value
// and the container environment returned by Allocate.
//
// The package is pure: no I/O, no package-level mutable state. Every decoder
// validates what it reads and fails with a typed error that callers match with
// errors.Is (the Err* constants) or errors.As (the *...Error types); every
// encoder is deterministic, so an unchanged value never causes a spurious
// PATCH.
package gpushare
