// Package explain answers kubectl inspect gpushare why and fit: why a pod
// does not fit a node, and where a pod would land. It replays the
// extender's own placement (extender/allocator.Place and Score) on the
// snapshot the extender's cache would build from the same Nodes and Pods
// (extender/cache.Snapshot), so the verdicts and their wording are the
// filter's. Everything here is pure: the command lists the objects, this
// package reasons over them, inspector/render prints the result.
package explain
