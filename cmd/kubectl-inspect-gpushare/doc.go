// Command kubectl-inspect-gpushare shows GPU memory sharing per node, GPU, pod
// and container. On PATH it runs as `kubectl inspect gpushare`. All logic
// lives in inspector/cmd; see docs/inspector.md.
package main
