package gpushare

// Multi-GPU contract names (issue 15; docs/contract.md).
const (
	// LabelPodGPUCount on a pod asks for its gpu-mem containers' units to be
	// split evenly over that many GPUs of one node (Alibaba ACK's form): a
	// container limiting aliyun.com/gpu-mem N with the label "M" gets N/M
	// units on each of M GPUs. Absent or "1": one GPU, as before. Never a
	// resource limit on shared pods: the node's aliyun.com/gpu-count capacity
	// counts whole GPUs.
	LabelPodGPUCount = "aliyun.com/gpu-count"
	// AnnotationTopology on a pod says how much the links between its GPUs
	// matter: TopologyRequired (every pair NVLink-connected, else the node
	// fails) or TopologyPreferred (the best connected set that fits; the
	// default).
	AnnotationTopology = "gpushare.io/topology"
	TopologyRequired   = "required"
	TopologyPreferred  = "preferred"
	// EnvGPUCount is the number of GPUs a container was given.
	EnvGPUCount = "GPUSHARE_GPU_COUNT"
)

// GPULink is how two GPUs of a node are connected, as the device plugin read
// it from NVML, published in NodeGPUs.Links.
type GPULink struct {
	A int `json:"a"` // GPU index, A < B
	B int `json:"b"`
	// Score is higher for a better connection: PCIe levels below NVLink,
	// NVLink by its number of links (docs/contract.md gives the scale).
	Score int `json:"score"`
	// NVLinks is the number of NVLink links between the two; 0 for PCIe only.
	// On NVSwitch systems every pair counts as connected.
	NVLinks int `json:"nvlinks,omitempty"`
}
