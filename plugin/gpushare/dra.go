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

// Contract names of the DRA front door (docs/dra.md): the webhook turns a
// pod asking for aliyun.com/gpu-mem, in a namespace labelled
// LabelNamespaceDRA=true, into a pod with one ResourceClaim of
// DRADeviceClassName made from a template the webhook names by the pod's
// request shape.
const (
	// LabelNamespaceDRA=LabelValueDRA on a namespace opts its pods into the
	// translation, as the same label on a node runs the driver there.
	LabelNamespaceDRA = "gpushare.io/dra"
	LabelValueDRA     = "true"
	// DRAPodClaimName is the name of the claim entry the webhook adds to
	// spec.resourceClaims and each GPU container's resources.claims.
	DRAPodClaimName = "gpushare-gpu-mem"
	// DRATemplatePrefix starts the name of every ResourceClaimTemplate the
	// webhook makes; the rest of the name is the request shape, so a
	// template can be made again from its name alone.
	DRATemplatePrefix = "gpushare-"
	// DRARequestPrefix names a template's requests: one per container
	// share, DRARequestPrefix + its position ("gpu-0", "gpu-1").
	DRARequestPrefix = "gpu-"
	// DRASubrequestLinked and DRASubrequestAny are the alternatives of a
	// multi-GPU request whose topology is preferred: every GPU in one NVLink
	// domain first, then any GPUs ("gpu-0/linked", "gpu-0/any").
	DRASubrequestLinked = "linked"
	DRASubrequestAny    = "any"
	// LabelManagedBy=ManagedByWebhook marks the templates the webhook made
	// and may delete once no pod uses them.
	LabelManagedBy   = "app.kubernetes.io/managed-by"
	ManagedByWebhook = "gpushare-webhook"
)

// DRAIsolationSelector is the CEL selector a claim request carries to ask
// for GPUs of one isolation tier (the webhook writes it; gpushare-scheduler's
// DRA score reads it back).
func DRAIsolationSelector(tier Isolation) string {
	return `device.attributes["` + DRADriverName + `"].` + DRAAttributeIsolation + ` == "` + string(tier) + `"`
}

// DRAQualifiedAttribute is one of the driver's attributes by its fully
// qualified name, as claims' constraints name it ("gpu-mem.gpushare.io/uuid").
func DRAQualifiedAttribute(name string) string { return DRADriverName + "/" + name }
