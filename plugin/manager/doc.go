// Package manager runs the device plugin: it reads the GPUs from plugin/nvml
// into an inventory, refuses a unit whose ListAndWatch message would not fit
// the kubelet, publishes the node's GPU count (status capacity and
// allocatable aliyun.com/gpu-count) and GPU description annotation, serves
// the kubelet through plugin/server, answers Allocate from plugin/podsource's
// informer caches with plugin/allocate's rule, and keeps all of it alive:
//
//   - the kubelet re-creating kubelet.sock (a kubelet restart wipes plugin
//     sockets), a restart request (SIGHUP) or the server dying triggers
//     Stop, Start and Register again, with exponential backoff on failure;
//   - NVML health events mark a GPU's devices unhealthy in ListAndWatch and
//     in the node description; a GPU with a transient fault and no event for
//     the quiet period is healthy again, one with a fatal fault stays
//     unhealthy for the life of the process;
//   - the node's GPU count and description are published again after every
//     registration and whenever the Node object lost them;
//   - a container's record on its pod (gpushare.io/container-env, ASSIGNED)
//     whose write failed during Allocate is retried in the background with
//     bounded backoff, and a reconciler writes the record of every pod whose
//     containers the kubelet started, whatever was lost;
//   - Allocate refuses a container whose GPU the node's pods together
//     over-commit, whoever bound them;
//   - the node's isolation tier (IsolationConfig, or the node's label) is
//     probed at start and every ProbeEvery: in the mps tier the manager runs
//     the MPS control daemon (started, restarted when it stops answering,
//     stopped on exit); each GPU's effective tier is published at once when
//     it changes, and while the tier is down every Allocate is refused
//     (tiers.go).
package manager
