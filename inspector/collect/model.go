package collect

import "github.com/gpushare/gpushare/plugin/gpushare"

// Report is everything the inspector shows; its JSON form is the stable
// machine-readable schema documented in docs/inspector.md, so field names
// and meanings only ever grow.
type Report struct {
	// Unit labels every memory number: GiB, MiB or <n>MiB.
	Unit string `json:"unit"`
	// Total is the sum of the nodes' Total.
	Total uint64 `json:"total"`
	// Allocated is the sum of the nodes' Allocated.
	Allocated uint64 `json:"allocated"`
	// AllocatedPercent is Allocated*100/Total, truncated; 0 when Total is 0.
	AllocatedPercent uint64 `json:"allocatedPercent"`
	// Nodes are the GPU-sharing nodes, sorted by name.
	Nodes []Node `json:"nodes"`
	// Skipped lists what could not be read and was left out of the numbers.
	Skipped []Skipped `json:"skipped,omitempty"`
	// Usage adds up the nodes whose device plugin measures use; absent
	// when none does.
	Usage *ClusterUsage `json:"usage,omitempty"`
}

// Node is one GPU-sharing node.
type Node struct {
	Name string `json:"name"`
	// Address is the node's InternalIP, or "unknown" as the old CLI printed.
	Address string `json:"address"`
	// Total is the node's allocatable aliyun.com/gpu-mem; on a DRA node,
	// the sum of its GPUs' memory as its ResourceSlice publishes it.
	Total uint64 `json:"total"`
	// Allocated is the units charged on the node's GPUs plus Pending.
	Allocated uint64 `json:"allocated"`
	// AllocatedPercent is Allocated*100/Total, truncated.
	AllocatedPercent uint64 `json:"allocatedPercent"`
	// Pending is the units of pods bound to the node without a GPU assignment.
	Pending uint64 `json:"pending"`
	// GPUSizes says where the per-GPU totals come from: "published" (our
	// gpushare.io/gpus node annotation, or on a DRA node our driver's
	// ResourceSlice) or "derived" (node total divided by
	// aliyun.com/gpu-count, the old CLI's rule).
	GPUSizes string `json:"gpuSizes"`
	// GPUs are sorted by index.
	GPUs []GPU `json:"gpus"`
	// Pods are the pods charged on this node, sorted by namespace then name.
	Pods []Pod `json:"pods"`
	// Mode is ModeDRA on a node whose GPUs our DRA driver publishes in a
	// ResourceSlice; absent on device-plugin nodes, so their documents stay
	// byte for byte what they were before DRA.
	Mode string `json:"mode,omitempty"`
	// Claims are, on a DRA node, the allocated ResourceClaims holding
	// memory on its GPUs, each with the pods reserving it, sorted by
	// namespace then name; absent on device-plugin nodes.
	Claims []Claim `json:"claims,omitempty"`
	// Usage is what the node's usage loop measured; absent when its plugin
	// does not measure use.
	Usage *NodeUsage `json:"usage,omitempty"`
}

// ModeDRA marks a node served by the DRA driver (Node.Mode).
const ModeDRA = "dra"

// Where per-GPU totals come from, see Node.GPUSizes.
const (
	// SizesPublished: from the device plugin's gpushare.io/gpus annotation.
	SizesPublished = "published"
	// SizesDerived: node total / GPU count, as the old CLI and extender did.
	SizesDerived = "derived"
)

// GPU is one physical GPU of a node.
type GPU struct {
	Index int `json:"index"`
	// Total is the GPU's memory in units; 0 for a GPU the node does not
	// describe but a pod's annotations name (see Known).
	Total     uint64 `json:"total"`
	Allocated uint64 `json:"allocated"`
	// Healthy is false only when the device plugin published the GPU as
	// unhealthy, or the DRA driver tainted its device (Reason: "<taint
	// value>, <effect>").
	Healthy bool   `json:"healthy"`
	Reason  string `json:"reason,omitempty"`
	Model   string `json:"model,omitempty"`
	UUID    string `json:"uuid,omitempty"`
	// Known is false when the node does not list this GPU index, yet pods are charged on it.
	Known bool `json:"known"`
	// Isolation is the GPU's effective isolation tier (none, mps,
	// hami-core) as the device plugin publishes it; absent when the plugin
	// publishes none (older plugins, or sizes derived from the node total).
	Isolation string `json:"isolation,omitempty"`
	// IsolationReason says why the GPU fell back from the tier its node is
	// configured for (e.g. the MPS control daemon does not answer).
	IsolationReason string `json:"isolationReason,omitempty"`
	// UsedMiB is the memory in use on the GPU and Utilization the share
	// of time a kernel ran, in percent, from the node's usage summary;
	// absent where unknown.
	UsedMiB     *uint64 `json:"usedMiB,omitempty"`
	Utilization *int    `json:"utilization,omitempty"`
}

// Enforces reports whether the GPU's tier enforces limits (mps, hami-core).
func (g GPU) Enforces() bool { return gpushare.Isolation(g.Isolation).Limits() }

// Pod is one pod holding or waiting for GPU memory on a node.
type Pod struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Units is the pod's request by the Kubernetes rule (init and sidecar
	// containers included); on a DRA node, the memory of the claims it uses,
	// each counted once.
	Units uint64 `json:"units"`
	// Pending is true when the pod is bound to the node without a GPU assignment.
	Pending bool `json:"pending"`
	// Assigned mirrors ALIYUN_COM_GPU_MEM_ASSIGNED: the device plugin served
	// the pod. Always false on a DRA node, which has no such annotation.
	Assigned bool `json:"assigned"`
	// GPUs are the units charged per GPU, sorted by index; empty when Pending.
	// A multi-GPU pod is charged on each GPU of its set: its units / k on
	// each of its k GPUs.
	GPUs []GPUCharge `json:"gpus"`
	// GPUSet lists, ascending, the GPUs a multi-GPU pod spans (issue 15):
	// every gpu-mem container of the pod runs on all of them. Absent for
	// pods whose containers each run on one GPU (split pods included).
	GPUSet []int `json:"gpuSet,omitempty"`
	// Containers are the containers asking for gpu-mem: init containers
	// first, then regular ones, each in spec order.
	Containers []Container `json:"containers"`
	// Isolation is the tier the pod's gpushare.io/isolation annotation
	// requires (none, mps, hami-core, any); absent when it sets none.
	Isolation string `json:"isolation,omitempty"`
	// ComputePercent is the pod's gpushare.io/compute-percent, a limit on its
	// share of the GPU's compute; absent when it sets none.
	ComputePercent int `json:"computePercent,omitempty"`
	// Claims are, on a DRA node, the allocated ResourceClaims the pod
	// uses (it is in their status.reservedFor), sorted by name; their Pods
	// are left out here (see Node.Claims).
	Claims []Claim `json:"claims,omitempty"`
}

// Claim is an allocated ResourceClaim holding memory on a DRA node's GPUs.
type Claim struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid"`
	// Units is the memory the claim consumes on the node, over all its shares.
	Units uint64 `json:"units"`
	// Shares are its allocation results on our driver, one per GPU device,
	// sorted by GPU index.
	Shares []Share `json:"shares"`
	// Pods are the pods reserving the claim (status.reservedFor), as
	// "namespace/name", sorted; empty for a claim no pod uses now. Set in
	// Node.Claims only.
	Pods []string `json:"pods,omitempty"`
}

// Share is one allocation result of a claim: memory set aside on one GPU.
type Share struct {
	// Index is the GPU's index attribute; Device its device name in the slice.
	Index  int    `json:"index"`
	Device string `json:"device"`
	// Request is the claim's request the result answers ("<request>" or
	// "<request>/<subrequest>").
	Request string `json:"request"`
	// ShareID tells this share from others on the same device.
	ShareID string `json:"shareID,omitempty"`
	// Units is consumedCapacity["memory"] in the node's unit.
	Units uint64 `json:"units"`
}

// GPUCharge is the units a pod holds on one GPU.
type GPUCharge struct {
	Index int    `json:"index"`
	Units uint64 `json:"units"`
}

// Container states, see Container.State.
const (
	// StateAllocated: the device plugin recorded this container's environment and it matches the assignment.
	StateAllocated = "allocated"
	// StateNotAllocated: no environment recorded yet (the kubelet has not started the container).
	StateNotAllocated = "not-allocated"
	// StateMismatch: the recorded environment names other GPUs or other units (in all or per GPU) than the assignment.
	StateMismatch = "mismatch"
	// StateUnrecorded: the pod is marked assigned but no per-container record exists (an older device plugin served it).
	StateUnrecorded = "unrecorded"
)

// Container is one container asking for gpu-mem.
type Container struct {
	Name string `json:"name"`
	Init bool   `json:"init"`
	// Units is the container's own request.
	Units uint64 `json:"units"`
	// GPU is the GPU the pod's annotations give this container, the first
	// of GPUs for a container on several; absent while the pod is pending.
	GPU *int `json:"gpu,omitempty"`
	// GPUs lists, ascending, every GPU of a container that runs on several
	// (a multi-GPU pod); absent for a container on one GPU.
	GPUs []int `json:"gpus,omitempty"`
	// UnitsPerGPU is a multi-GPU container's units on each of its GPUs
	// (Units / len(GPUs)); absent for a container on one GPU.
	UnitsPerGPU uint64 `json:"unitsPerGPU,omitempty"`
	// State is one of allocated, not-allocated, mismatch, unrecorded.
	State string `json:"state"`
	// Env is the gpushare environment the device plugin gave the container
	// (from the gpushare.io/container-env pod annotation); absent when none was recorded.
	Env map[string]string `json:"env,omitempty"`
	// Claims names, on a DRA node, the ResourceClaims (in the pod's
	// namespace) whose memory the container uses through resources.claims.
	Claims []string `json:"claims,omitempty"`
	// UsedMiB is the GPU memory the container's processes use, over all
	// its GPUs, from the node's usage summary; absent where unknown.
	UsedMiB *uint64 `json:"usedMiB,omitempty"`
	// OverSlice is true when it uses more than its slice of some GPU.
	OverSlice bool `json:"overSlice,omitempty"`
}

// Skipped is an object left out of the report, and why.
type Skipped struct {
	Kind      string `json:"kind"` // Node, Pod or ResourceClaim
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
	Reason    string `json:"reason"`
}

// String reads "pod ns/name: reason" or "node name: reason".
func (s Skipped) String() string {
	name := s.Name
	if s.Namespace != "" {
		name = s.Namespace + "/" + s.Name
	}
	kind := "node"
	switch s.Kind {
	case KindPod:
		kind = "pod"
	case KindClaim:
		kind = "claim"
	}
	return kind + " " + name + ": " + s.Reason
}

// Kinds of skipped objects.
const (
	// KindNode marks a skipped or partly read node.
	KindNode = "Node"
	// KindPod marks a skipped pod.
	KindPod = "Pod"
	// KindClaim marks a ResourceClaim partly read on a DRA node.
	KindClaim = "ResourceClaim"
)

// percent truncates as the contract requires, in integers: the old CLI's
// float64 arithmetic printed 28% for 29/100.
func percent(part, whole uint64) uint64 {
	if whole == 0 {
		return 0
	}
	return part * 100 / whole
}
