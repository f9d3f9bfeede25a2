// Package binder carries out the extender's bind verb: it checks the pod's
// UID, re-checks the fit and assumes the pod under the cache lock, then
// creates one Binding that carries the ALIYUN_COM_GPU_MEM_* (and, for split
// pods, allocation) annotations: the API server sets the node and merges the
// annotations in a single update. The cache lock is released before any API
// call, so a slow API server delays only this bind, never a filter or another
// node. On any failure the assumption is forgotten at once; an assumption
// whose bind the informer never confirms expires in the cache.
package binder
