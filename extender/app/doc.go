// Package app wires the extender together (cache, binder, server) and runs it
// on a listener until its context ends, so the command and the end-to-end
// tests start exactly the same program.
package app
