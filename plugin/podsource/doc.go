// Package podsource is the device plugin's view of the API server: the pods
// bound to its node and the Node object itself, kept in client-go informer
// caches scoped with field selectors (spec.nodeName=<node>,
// metadata.name=<node>), so an Allocate call reads memory instead of listing
// pods across the cluster. Changed lets a caller wait, without polling, for
// a pod that was bound a moment ago to reach the cache: the informers' event
// handlers wake every waiter. PatchPod writes annotations with the pod's
// resourceVersion as a precondition and retries on conflict against a fresh
// read.
//
// Objects handed out are the informers' own: callers must not modify them
// (DeepCopy first).
package podsource
