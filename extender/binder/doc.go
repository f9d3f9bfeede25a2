// Package binder carries out the extender's bind verb: it checks the pod's
// UID, re-checks the fit and assumes the pod under the cache lock, writes the
// ALIYUN_COM_GPU_MEM_* (and, for split pods, allocation) annotations in one
// PATCH, then creates the Binding. The cache lock is released before any API
// call, so a slow API server delays only this bind, never a filter or another
// node. On any failure the assumption is forgotten at once; an assumption
// whose bind the informer never confirms expires in the cache.
package binder
