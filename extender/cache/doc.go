// Package cache is the extender's view of the cluster: informer-fed nodes,
// pods and unhealthy-GPU ConfigMaps turned into one immutable
// allocator.Node snapshot per node (each GPU's size, charged units and
// health, and the pods in flight there), rebuilt whenever something about
// that node changes.
//
// Annotations are the only persisted state: on start the informers' initial
// list rebuilds every charge from the pods' ALIYUN_COM_GPU_MEM_* and
// allocation annotations, so a restarted extender never places a pod on
// capacity already taken.
//
// Per-GPU layout comes from the node annotation gpushare.io/gpus (each GPU's
// own size and health); on nodes without it, allocatable aliyun.com/gpu-mem
// divided by aliyun.com/gpu-count, as the seed does. GPUs listed in
// ConfigMap kube-system/unhealthy-gpu-<node> are unhealthy as well.
//
// A pod is charged while it is bound (or assumed) and not Succeeded/Failed
// and not deleted. A terminating pod stays charged until it is gone: its
// containers may still hold the GPU.
//
// Pod state machine (as kube-scheduler's cache):
//
//	             Assume                 informer: bound + annotated
//	(unknown) ───────────▶ Assumed ─────────────────────────────────▶ Confirmed
//	    ▲                   │  │                                         │
//	    │      Forget       │  │ FinishBinding, then TTL passes           │ informer: deleted,
//	    ├───────────────────┘  │ without the informer confirming          │ Succeeded or Failed
//	    ├──────── Expired ◀────┘                                          │
//	    └─────────────────────────────────────────────────────────────────┘
//
// Assumed pods are charged like confirmed ones, so the next filter already
// sees the capacity taken while the binder's API calls are in flight. An
// assumption whose bind never shows up in the informer (the API server lost
// it, or the pod was deleted under us) expires TTL after FinishBinding, so a
// failed bind can never leak capacity. The cache lock is never held across
// an API call: the binder assumes, releases, then talks to the API server.
package cache
