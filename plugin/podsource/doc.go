// Package podsource is the device plugin's view of the API server: the pods
// bound to its node and the Node object itself, kept in a local store by a
// list-then-watch loop scoped with field selectors (spec.nodeName,
// metadata.name), so an Allocate call reads memory instead of listing pods
// across the cluster. (It is a small reflector of its own because
// client-go/tools/cache needs a module go.mod does not list yet; see
// docs/device-plugin.md.) Changed lets a
// caller wait, without polling, for a pod that was bound a moment ago to
// reach the store. PatchPod writes annotations with the pod's resourceVersion
// as a precondition and retries on conflict against a fresh read.
//
// Objects handed out come from the store: callers must not modify them.
package podsource
