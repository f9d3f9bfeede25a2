// Package nvml is the device plugin's only door to NVIDIA's management
// library (go-nvml): it lists the node's physical GPUs, leaving out those in
// MIG mode (Skipped says which and why), and watches them for critical Xid
// and uncorrectable ECC errors, classifying each fault (XidCause: transient
// or fatal) so the caller knows what can bring the GPU back. It also reads
// and sets each GPU's compute mode, which the MPS isolation tier switches to
// EXCLUSIVE_PROCESS and back (simulated GPUs remember it). Every
// nvml.Return becomes a wrapped Go error, so nothing above it exits, panics
// or has to know NVML.
//
// One implementation runs over nvml.Interface. The "nvml" backend plugs in the
// real libnvidia-ml.so.1; the "simulated:*" backends plug in go-nvml's own
// whole-machine mocks (pkg/nvml/mock/dgx*), so the code the plugin runs in
// production is the code the tests and the end-to-end cluster exercise. A
// simulated backend must be chosen explicitly: when the real library is
// missing, New fails with ErrLibraryNotFound instead of pretending, and every
// Library says through Simulated and Name what it is, so callers can log and
// publish it.
//
// A simulated backend string may end in ":mig=<index>[,<index>...]" to put
// those GPUs in MIG mode, so the skipping can be tested end to end.
//
// Only simulated backends (the *Simulator type) can inject events, through the
// XidInjector interface; the real backend has no such method and never fakes
// an event.
//
// The package holds no package-level mutable state.
package nvml
