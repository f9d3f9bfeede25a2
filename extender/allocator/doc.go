// Package allocator is the extender's pure placement logic: given one node's
// GPUs (size, charged units, health) and the pods in flight there, it decides
// whether a pod fits, why not, which GPU each of its containers gets, and how
// good the node is for it. It does no I/O and holds no state, so every rule is
// table-tested here and the cache, binder and server only feed it snapshots.
//
// Rules, in order:
//   - A pod goes on one GPU when any healthy GPU has room for its whole
//     request (Kubernetes arithmetic, init and sidecar containers included).
//     BestFit picks the GPU with the least free units that fits, Spread the
//     most, FirstFit the lowest index that fits; ties go to the lowest index.
//   - A pod with several GPU containers that fits no single GPU is split: each
//     regular container gets one GPU, init and sidecar containers stay on the
//     pod's home GPU (written as ALIYUN_COM_GPU_MEM_IDX), and the split is
//     recorded in the allocation annotation.
//   - Unhealthy GPUs are never chosen, nor GPUs whose effective isolation
//     tier (published by the device plugin) does not offer the tier the pod's
//     gpushare.io/isolation requires or cannot limit the compute share its
//     gpushare.io/compute-percent asks; a node without any such GPU fails
//     with a reason listing each GPU's tier and why it fell back.
//   - The hold-back rule of docs/design.md ("Race-free Allocate", rule 2): a
//     container may only take a GPU on which its device-plugin signature
//     (container units, GPU, pod units, GPU units, the pod's isolation
//     annotations; the GPU's tier comes with the GPU) equals that of every
//     in-flight container of the same size on the node. When every fitting
//     choice breaks that, the node fails with a reason naming the pod it
//     waits for.
package allocator
