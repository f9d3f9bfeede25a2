package gpushare

import corev1 "k8s.io/api/core/v1"

// Resources (contract section 1).
const (
	// ResourceName is the extended resource the device plugin registers: one device ID per memory unit.
	ResourceName corev1.ResourceName = "aliyun.com/gpu-mem"
	// ResourceCount is the number of physical GPUs, patched into node status by the device plugin.
	ResourceCount corev1.ResourceName = "aliyun.com/gpu-count"
)

// Pod annotations (contract section 2); all values are decimal strings.
const (
	// AnnotationGPUIndex holds the GPU index chosen by the extender at bind.
	AnnotationGPUIndex = "ALIYUN_COM_GPU_MEM_IDX"
	// AnnotationPodUnits holds the pod's total request in units.
	AnnotationPodUnits = "ALIYUN_COM_GPU_MEM_POD"
	// AnnotationDevUnits holds the chosen GPU's memory in units.
	AnnotationDevUnits = "ALIYUN_COM_GPU_MEM_DEV"
	// AnnotationAssigned is "false" at bind and "true" once the device plugin served the pod.
	AnnotationAssigned = "ALIYUN_COM_GPU_MEM_ASSIGNED"
	// AnnotationAssumeTime holds the bind time in Unix nanoseconds.
	AnnotationAssumeTime = "ALIYUN_COM_GPU_MEM_ASSUME_TIME"
	// AnnotationAllocation holds the per-container allocation JSON; it takes precedence over AnnotationGPUIndex.
	AnnotationAllocation = "scheduler.framework.gpushare.allocation"
)

// AnnotationNodeGPUs is our node annotation describing each GPU (contract section 7), see NodeGPUs.
const AnnotationNodeGPUs = "gpushare.io/gpus"

// AnnotationSkippedGPUs is our node annotation naming the GPUs the device
// plugin does not advertise (MIG mode) and why, see SkippedGPU. Absent when
// none is skipped.
const AnnotationSkippedGPUs = "gpushare.io/skipped-gpus"

// Container environment set by Allocate (contract section 3).
const (
	// EnvVisibleDevices tells the NVIDIA container runtime which GPU to expose; we write the index
	// (DeviceListEnvvar), DeviceListMountDir (DeviceListVolumeMounts) or VisibleDevicesVoid (CDI only).
	EnvVisibleDevices = "NVIDIA_VISIBLE_DEVICES"
	// EnvGPUIndex holds the GPU index.
	EnvGPUIndex = "ALIYUN_COM_GPU_MEM_IDX"
	// EnvPodUnits holds the pod's units.
	EnvPodUnits = "ALIYUN_COM_GPU_MEM_POD"
	// EnvContainerUnits holds this container's units; applications read it to limit themselves.
	EnvContainerUnits = "ALIYUN_COM_GPU_MEM_CONTAINER"
	// EnvDevUnits holds the GPU's memory in units.
	EnvDevUnits = "ALIYUN_COM_GPU_MEM_DEV"
	// EnvDisableIsolation is "true" only on nodes labelled LabelDisableIsolation=true.
	EnvDisableIsolation = "CGPU_DISABLE"
)

// EnvNodeName is the environment variable the device plugin requires to know its node.
const EnvNodeName = "NODE_NAME"

// Node labels (contract sections 3 and 6).
const (
	// LabelGPUShare selects GPU-sharing nodes when set to LabelValueTrue.
	LabelGPUShare = "gpushare"
	// LabelDisableIsolation turns cGPU isolation off on a node when set to LabelValueTrue.
	LabelDisableIsolation = "cgpu.disable.isolation"
	// LabelValueTrue is the value that switches the labels above on.
	LabelValueTrue = "true"
)

// Unhealthy-GPU ConfigMap (contract section 4), see ParseUnhealthyGPUs.
const (
	// UnhealthyConfigMapNamespace is where the unhealthy-GPU ConfigMaps live.
	UnhealthyConfigMapNamespace = "kube-system"
	// UnhealthyConfigMapPrefix prefixes the node name to form the ConfigMap name.
	UnhealthyConfigMapPrefix = "unhealthy-gpu-"
	// UnhealthyConfigMapKey is the data key holding the list of GPU indices.
	UnhealthyConfigMapKey = "gpus"
)

// Device plugin endpoint (contract section 6).
const (
	// DevicePluginSocket is the plugin's socket file name inside DevicePluginDir.
	DevicePluginSocket = "aliyungpushare.sock"
	// DevicePluginDir is the kubelet's default device-plugin directory.
	DevicePluginDir = "/var/lib/kubelet/device-plugins"
)

// ExtenderURLPrefix is the path prefix of every scheduler-extender verb.
const ExtenderURLPrefix = "/gpushare-scheduler"

// UnhealthyConfigMapName returns the name of the unhealthy-GPU ConfigMap of node.
func UnhealthyConfigMapName(node string) string {
	return UnhealthyConfigMapPrefix + node
}

// IsGPUShareNode reports whether node labels select the node for GPU sharing.
func IsGPUShareNode(labels map[string]string) bool {
	return labels[LabelGPUShare] == LabelValueTrue
}

// IsolationDisabled reports whether node labels turn cGPU isolation off.
func IsolationDisabled(labels map[string]string) bool {
	return labels[LabelDisableIsolation] == LabelValueTrue
}
