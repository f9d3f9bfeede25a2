// Command gpushare-device-plugin is the gpushare device plugin for the
// kubelet: it advertises each GPU's memory as aliyun.com/gpu-mem units and
// gives every container the GPU its pod's scheduler-extender annotations
// name. It only wires flags, logging, the API client and NVML into
// plugin/manager; see docs/device-plugin.md.
package main
