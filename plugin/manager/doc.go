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
//     in the node description, and a GPU with no event for the quiet period
//     is healthy again;
//   - a container's record on its pod (gpushare.io/container-env, ASSIGNED)
//     whose write failed during Allocate is retried in the background with
//     bounded backoff.
package manager
