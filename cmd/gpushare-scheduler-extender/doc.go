// Command gpushare-scheduler-extender is the gpushare scheduler extender, a
// drop-in replacement for Alibaba's: kube-scheduler calls it to filter,
// prioritize and bind pods that request aliyun.com/gpu-mem. See
// docs/extender.md for flags and behaviour.
package main
