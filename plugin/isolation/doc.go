// Package isolation is the device plugin's side of the memory-isolation
// tiers (docs/device-plugin.md, "Isolation tiers"): what each tier adds to a
// container's Allocate answer, which tier a node is configured for, and
// whether that tier's prerequisite holds now.
//
// Answer is a pure function of the container's environment (its GPU, its
// units, the tier, the compute share), the GPU's UUID, the node's unit and
// the tier's paths. It must be: the kubelet's Allocate call never names its
// pod, and the race-free rule (docs/design.md) makes every in-flight
// container of a given size on a node equal in exactly those inputs, so an
// answer built from them is right whichever pod the kubelet is serving.
// The one input that differs per answer, hami-core's cache directory, is a
// fresh directory the caller creates for each answer, never one named after
// a pod.
//
// Probe decides a tier's effective state through an MPSDaemon (plugin/mps
// implements it; tests use fakes) and the files hami-core needs, so the
// manager can publish each GPU's effective tier and refuse to answer without
// the limit when the prerequisite is down.
package isolation
