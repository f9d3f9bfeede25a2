package gpushare

import (
	"slices"
	"strconv"
	"strings"
)

// DeviceListStrategy is how Allocate names a container's GPU to the container
// runtime (the device plugin's --device-list-strategy). The names and their
// meaning are those of NVIDIA's k8s-device-plugin, so a node's runtime
// configuration written for it applies unchanged.
type DeviceListStrategy string

// The device-list strategies.
const (
	// DeviceListEnvvar sets EnvVisibleDevices to the GPU index (the old
	// gpushare's behaviour and the default). With the NVIDIA runtime's default
	// settings any pod can set that variable itself and see every GPU.
	DeviceListEnvvar DeviceListStrategy = "envvar"
	// DeviceListVolumeMounts sets EnvVisibleDevices to DeviceListMountDir and
	// mounts DeviceListMountHostPath at DeviceListMountDir/<id>: the runtime,
	// configured with accept-nvidia-visible-devices-as-volume-mounts = true
	// and accept-nvidia-visible-devices-envvar-when-unprivileged = false,
	// reads the GPU from the mount, which a pod cannot add by itself.
	DeviceListVolumeMounts DeviceListStrategy = "volume-mounts"
	// DeviceListCDIAnnotations names the CDI device CDIKind=<id> in a
	// container annotation (CDIAnnotationKey), for runtimes that read CDI
	// annotations (the NVIDIA runtime in cdi mode, CRI-O, containerd 1.7+).
	DeviceListCDIAnnotations DeviceListStrategy = "cdi-annotations"
	// DeviceListCDICRI names the CDI device CDIKind=<id> in the Allocate
	// response's CDIDevices, which the kubelet passes to the runtime in the
	// CRI (Kubernetes 1.31+, where the device plugin API's CDI field is GA).
	DeviceListCDICRI DeviceListStrategy = "cdi-cri"
)

// DeviceListStrategyNames lists every strategy, in the order documented.
func DeviceListStrategyNames() []string {
	return []string{string(DeviceListEnvvar), string(DeviceListVolumeMounts), string(DeviceListCDIAnnotations), string(DeviceListCDICRI)}
}

// Names used by the strategies (NVIDIA's conventions).
const (
	// DeviceListMountDir is EnvVisibleDevices under DeviceListVolumeMounts,
	// and the directory in the container under which each device is a mount.
	DeviceListMountDir = "/var/run/nvidia-container-devices"
	// DeviceListMountHostPath is the host side of each device mount: only the
	// mount's name matters.
	DeviceListMountHostPath = "/dev/null"
	// VisibleDevicesVoid is EnvVisibleDevices when only CDI strategies name the
	// GPU: the NVIDIA runtime injects nothing by itself (as with runc), so an
	// image's NVIDIA_VISIBLE_DEVICES=all adds no GPU beside the CDI device.
	VisibleDevicesVoid = "void"
	// CDIKind is the CDI vendor/class of NVIDIA GPUs in the specification the
	// NVIDIA Container Toolkit writes (nvidia-ctk cdi generate, nvidia-cdi-refresh).
	CDIKind = "nvidia.com/gpu"
	// CDIAnnotationPrefix prefixes CDI device-request annotation keys (the
	// CDI project's cdi.k8s.io/ convention).
	CDIAnnotationPrefix = "cdi.k8s.io/"
	// CDIAnnotationPlugin names this plugin in its CDI annotation keys.
	CDIAnnotationPlugin = "gpushare-device-plugin"
)

// DeviceIDStrategy is how the volume-mounts and CDI strategies name a GPU
// (the device plugin's --device-id-strategy, NVIDIA's names). The envvar
// strategy always writes the index: that is the contract's
// NVIDIA_VISIBLE_DEVICES.
type DeviceIDStrategy string

// The device-ID strategies.
const (
	// DeviceIDUUID names a GPU by its UUID (NVIDIA's default): it cannot be
	// confused with another GPU whatever order a runtime enumerates them in.
	DeviceIDUUID DeviceIDStrategy = "uuid"
	// DeviceIDIndex names a GPU by its NVML index, for CDI specifications that
	// name devices by index only (nvidia-ctk before it wrote both by default).
	DeviceIDIndex DeviceIDStrategy = "index"
)

// DeviceIDStrategyNames lists every device-ID strategy, the default first.
func DeviceIDStrategyNames() []string {
	return []string{string(DeviceIDUUID), string(DeviceIDIndex)}
}

// ErrInvalidDeviceListStrategy marks a --device-list-strategy or
// --device-id-strategy value that is not one of the names above.
const ErrInvalidDeviceListStrategy Error = "invalid device list strategy"

// DeviceListStrategyError reports an unknown strategy name.
type DeviceListStrategyError struct {
	What  string   // "device list strategy" or "device ID strategy"
	Value string   // the rejected text
	Valid []string // the names accepted
}

// Error names the value and the valid names.
func (e *DeviceListStrategyError) Error() string {
	return "invalid " + e.What + " " + clip(e.Value) + ": want one of " + strings.Join(e.Valid, ", ")
}

// Unwrap returns ErrInvalidDeviceListStrategy.
func (e *DeviceListStrategyError) Unwrap() error { return ErrInvalidDeviceListStrategy }

// DeviceListStrategies is a set of device-list strategies; several may be
// combined, as NVIDIA's plugin allows (e.g. envvar and cdi-cri while a node's
// runtime configuration changes). The empty set means DeviceListEnvvar.
type DeviceListStrategies []DeviceListStrategy

// ParseDeviceListStrategies reads a comma-separated list of strategy names
// (spaces around names ignored, repeats allowed). An empty list or an
// unknown name is a *DeviceListStrategyError listing the valid names.
func ParseDeviceListStrategies(s string) (DeviceListStrategies, error) {
	var out DeviceListStrategies
	for item := range strings.SplitSeq(s, ",") {
		name := DeviceListStrategy(strings.TrimSpace(item))
		if !slices.Contains(DeviceListStrategyNames(), string(name)) {
			return nil, &DeviceListStrategyError{What: "device list strategy", Value: string(name), Valid: DeviceListStrategyNames()}
		}
		if !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	return out, nil
}

// Includes reports whether s has strategy x; the empty set has only
// DeviceListEnvvar.
func (s DeviceListStrategies) Includes(x DeviceListStrategy) bool {
	if len(s) == 0 {
		return x == DeviceListEnvvar
	}
	return slices.Contains(s, x)
}

// OnlyCDI reports whether every strategy of s is a CDI one, so neither
// NVIDIA_VISIBLE_DEVICES nor a mount names the GPU.
func (s DeviceListStrategies) OnlyCDI() bool {
	return !s.Includes(DeviceListEnvvar) && !s.Includes(DeviceListVolumeMounts)
}

// String is the comma-separated list ParseDeviceListStrategies reads.
func (s DeviceListStrategies) String() string {
	if len(s) == 0 {
		return string(DeviceListEnvvar)
	}
	names := make([]string, len(s))
	for i, x := range s {
		names[i] = string(x)
	}
	return strings.Join(names, ",")
}

// ParseDeviceIDStrategy reads a device-ID strategy name; anything else is a
// *DeviceListStrategyError listing the valid names.
func ParseDeviceIDStrategy(s string) (DeviceIDStrategy, error) {
	if !slices.Contains(DeviceIDStrategyNames(), s) {
		return "", &DeviceListStrategyError{What: "device ID strategy", Value: s, Valid: DeviceIDStrategyNames()}
	}
	return DeviceIDStrategy(s), nil
}

// DeviceListMountPath is the container path of the volume-mounts strategy's
// mount for the GPU named id.
func DeviceListMountPath(id string) string {
	return DeviceListMountDir + "/" + id
}

// CDIDeviceName is the fully qualified CDI name of the GPU named id,
// e.g. nvidia.com/gpu=GPU-8a3c… or nvidia.com/gpu=0.
func CDIDeviceName(id string) string {
	return CDIKind + "=" + id
}

// CDIAnnotationKey is the key of the cdi-annotations strategy's annotation
// for the GPU of index gpu, e.g. cdi.k8s.io/gpushare-device-plugin_0: the
// CDI form <prefix><plugin>_<device>, unique among a container's annotations
// (a container gets one GPU from this plugin) and the same on every call,
// so an answer given twice is the same answer.
func CDIAnnotationKey(gpu int) string {
	return CDIAnnotationPrefix + CDIAnnotationPlugin + "_" + strconv.Itoa(gpu)
}
