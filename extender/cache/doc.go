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
// own size, health and effective isolation tier, with why it fell back); on
// nodes without it, allocatable aliyun.com/gpu-mem divided by
// aliyun.com/gpu-count, as the seed does, every GPU of tier none. GPUs listed in
// ConfigMap kube-system/unhealthy-gpu-<node> are unhealthy as well.
//
// A pod is charged while it is bound (or assumed) and not Succeeded/Failed
// and not deleted. A terminating pod stays charged until it is gone: its
// containers may still hold the GPU.
//
// Pod state machine (as kube-scheduler's cache, whose assumed pods no longer
// expire either: kubernetes/kubernetes#106361):
//
//	           Assume                FinishBinding, or               informer: bound
//	(unknown) ────────▶ Binding ──── BindOutcomeUnknown ───▶ Awaiting ───────────────▶ Confirmed
//	    ▲                  │                                  │  ▲  │   + annotated       │
//	    │ Forget: definite │     TTL passed, GET: still bound │  │  │                     │ informer: deleted,
//	    │ rejection, or    │     there, or GET failed (next   └──┘  │                     │ Succeeded, Failed,
//	    │ GET: not bound   │     GET later, interval doubles)       │                     │ or not ours
//	    ├──────────────────┘                                        │                     │
//	    ├─── TTL passed, GET: deleted, other UID, finished, ────────┘                     │
//	    │    unbound or bound elsewhere (or the informer says so)                         │
//	    └─────────────────────────────────────────────────────────────────────────────────┘
//
//	CatchUp ──▶ Listed: like Awaiting (verified after the TTL, confirmed by the informer)
//
// Assumed pods are charged like confirmed ones, so the next filter already
// sees the capacity taken while the binder's Binding is in flight; a bind
// still running is never touched by time. Once the bind has ended (or a
// catch-up listed a pod), the informer normally confirms the pod within a
// moment. If it has not after the TTL (-assume-ttl), the cache does not drop
// the charge: a lagging or stalled informer says nothing about the pod, which
// may be running on the memory. It asks the API server instead, a few pods
// per round, and drops the charge only when the pod is shown deleted,
// replaced by another of its name, finished, unbound or bound to another
// node; a pod still bound there, or a failed GET, keeps the charge and is
// asked about again later, less often each time. So a failed bind can never
// leak capacity for long, and memory in use is never given away twice. The
// cache lock is never held across an API call: the binder assumes,
// releases, then talks to the API server; verification reads outside it.
//
// The pod informer's store keeps a PodRecord per pod, not the pod
// (record.go), and the node informer's store trimmed nodes (trim.go): only
// what the cache and the binder read.
package cache
