// Package app wires the extender together (cache, binder, server) and runs it
// on a listener until its context ends, so the command and the end-to-end
// tests start exactly the same program. It also owns what is about the
// process rather than the verbs: leader election among replicas (only the
// Lease holder serves), HTTPS with a reloaded certificate, and the separate
// pprof listener.
package app
