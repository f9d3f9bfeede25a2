// Package binder carries out the extender's bind verb: it checks the pod's
// UID, re-checks the fit and assumes the pod under the cache lock, then
// creates one Binding that carries the ALIYUN_COM_GPU_MEM_* (and, for split
// pods, allocation) annotations: the API server sets the node and merges the
// annotations in a single update. The cache lock is released before any API
// call, so a slow API server delays only this bind, never a filter or another
// node.
//
// The Binding runs under a deadline of its own, detached from the
// scheduler's request (but never past a deadline that request carries: the
// leader's term). Only a definite refusal (Rejected) forgets the assumption
// at once. A Binding without a definite answer may have been committed, so
// the pod is read back: bound there, the bind succeeds; shown unbound or
// gone, the assumption is forgotten; unreadable, the charge is kept and the
// cache verifies it later, since the pod may be running on the memory.
package binder
