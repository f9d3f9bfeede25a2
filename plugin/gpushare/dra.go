package gpushare

// Contract names of the DRA driver (docs/dra.md): the device plugin's
// -mode=dra publishes each GPU as a device of DRADriverName whose memory is
// consumable capacity, and prepares claims on it.
const (
	// DRADriverName is the driver's name in ResourceSlices, DeviceClasses and
	// allocation results; also the domain of its unqualified attributes.
	DRADriverName = "gpu-mem.gpushare.io"
	// DRADeviceClassName is the DeviceClass manifests/dra ships, selecting
	// the driver's devices; claims name it.
	DRADeviceClassName = DRADriverName
	// DRAParamsAPIVersion and DRAParamsKind identify a claim's opaque
	// parameters for the driver (its compute share).
	DRAParamsAPIVersion = DRADriverName + "/v1"
	DRAParamsKind       = "ClaimParameters"
	// DRACapacityMemory is the consumable capacity of a GPU device: its
	// memory, in whole units of the node's -memory-unit.
	DRACapacityMemory = "memory"
	// DRADeviceNamePrefix starts every device name; the rest is the GPU's
	// UUID without NVML's "GPU-" prefix, lower case (DNS label rules).
	DRADeviceNamePrefix = "gpu-"

	// Attributes in the driver's domain.
	DRAAttributeUUID                  = "uuid"
	DRAAttributeIndex                 = "index"
	DRAAttributeProductName           = "productName"
	DRAAttributeArchitecture          = "architecture"
	DRAAttributeCUDAComputeCapability = "cudaComputeCapability"
	DRAAttributeDriverVersion         = "driverVersion"
	DRAAttributeIsolation             = "isolation"
	DRAAttributeNVLinkDomain          = "nvlinkDomain"
	DRAAttributeSimulated             = "simulated"
	// Kubernetes' standard attributes (k8s.io/dynamic-resource-allocation
	// deviceattribute), so claims can align GPUs with other drivers' devices.
	DRAAttributePCIBusID = "resource.kubernetes.io/pciBusID"
	DRAAttributeNUMANode = "resource.kubernetes.io/numaNode"

	// DRATaintUnhealthy is the key of the taint an unhealthy GPU's device
	// carries; its value says why (DRATaintValue*).
	DRATaintUnhealthy = DRADriverName + "/unhealthy"
	// Taint values: a fatal fault (needs a reset, effect NoSchedule), a lost
	// GPU (Xid 79 or NVML's GPU_IS_LOST, effect NoExecute), a transient
	// fault within its quiet period and a GPU whose health cannot be watched
	// (both NoSchedule). A fatal or transient fault with an Xid appends it:
	// "fatal-xid-48".
	DRATaintValueFatal     = "fatal"
	DRATaintValueLost      = "lost"
	DRATaintValueTransient = "transient"
	DRATaintValueUnwatched = "unwatched"

	// DRACDIKind is the CDI vendor/class of the devices Prepare writes, one
	// per claim, named by the claim's UID.
	DRACDIKind = DRADriverName + "/claim"
	// DRACDISpecVersion is the cdiVersion of those specifications: 0.5.0
	// is the first to admit device names starting with a digit (a UID may).
	DRACDISpecVersion = "0.5.0"

	// DefaultDRAPluginDir is the driver's plugin data directory (its
	// dra.sock and checkpoint), kubeletplugin's default for this name.
	DefaultDRAPluginDir = "/var/lib/kubelet/plugins/" + DRADriverName
	// DefaultDRARegistrarDir is where the kubelet looks for registration sockets.
	DefaultDRARegistrarDir = "/var/lib/kubelet/plugins_registry"
)
