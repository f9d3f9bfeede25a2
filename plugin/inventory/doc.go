// Package inventory turns a node's physical GPUs and the memory unit into
// what the kubelet sees: one compact virtual device ID per unit of each GPU's
// own memory ("<gpu index>-<slice>", readable both ways), per-GPU health, the
// ListAndWatch device list, and the exact size of that message, so the plugin
// can refuse before registering a unit that would break the kubelet's 4 MiB
// gRPC limit and name a unit that works.
//
// It is pure: no I/O, no clock, no locks. An Inventory is immutable; health
// changes return a new one, so the manager can hand the current value to
// concurrent readers without copying.
package inventory
