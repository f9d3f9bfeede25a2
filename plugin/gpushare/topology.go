package gpushare

import (
	"fmt"
	"strconv"
)

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

// ErrInvalidGPUCount marks a multi-GPU request that cannot be placed as
// written: a malformed gpu-count label or topology annotation, units that do
// not divide by the count, or a pod whose only gpu-mem containers are init
// containers (the allocation annotation cannot name their GPUs).
const ErrInvalidGPUCount Error = "invalid multi-GPU request"

// MultiGPUError says which value is wrong and why.
type MultiGPUError struct {
	Pod    string // namespace/name
	Field  string // the label, the annotation, or `container "x"`
	Value  string
	Reason string
}

func (e *MultiGPUError) Error() string {
	return string(ErrInvalidGPUCount) + " in pod " + e.Pod + ": " + e.Field + " " + clip(e.Value) + " " + e.Reason
}

// Unwrap returns ErrInvalidGPUCount.
func (e *MultiGPUError) Unwrap() error { return ErrInvalidGPUCount }

// MultiGPU is what a pod asks of the number of its GPUs and their links.
type MultiGPU struct {
	// Count is how many GPUs each gpu-mem container spans when the pod's
	// LabelPodGPUCount asks for more than one; 0 otherwise (the single-GPU
	// form, like 1).
	Count int
	// LinksRequired is AnnotationTopology "required": every pair of the
	// chosen GPUs must be NVLink-connected.
	LinksRequired bool
}

// PodMultiGPU reads the multi-GPU form of pod (namespace/name) from its
// labels and annotations and checks it against reqs, its gpu-mem
// containers (ContainerRequests): with Count M > 1, every container's units
// must divide by M, never rounded, and a regular container must ask for
// gpu-mem. Anything else is a *MultiGPUError (ErrInvalidGPUCount).
func PodMultiGPU(pod string, labels, annotations map[string]string, reqs []ContainerRequest) (MultiGPU, error) {
	var m MultiGPU
	if v, ok := labels[LabelPodGPUCount]; ok {
		n, reason := parseDigits(v, MaxGPUsPerNode)
		if reason == "" && (n == 0 || uintString(n) != v) {
			reason = "is not a whole number from 1 to " + uintString(MaxGPUsPerNode)
		}
		if reason != "" {
			return MultiGPU{}, &MultiGPUError{Pod: pod, Field: "label " + LabelPodGPUCount, Value: v, Reason: reason}
		}
		if n > 1 {
			m.Count = int(n)
		}
	}
	if v, ok := annotations[AnnotationTopology]; ok {
		switch v {
		case TopologyRequired:
			m.LinksRequired = true
		case TopologyPreferred:
		default:
			return MultiGPU{}, &MultiGPUError{Pod: pod, Field: "annotation " + AnnotationTopology, Value: v,
				Reason: "is neither " + TopologyRequired + " nor " + TopologyPreferred}
		}
	}
	if m.Count == 0 {
		return m, nil
	}
	regular := false
	for _, c := range reqs {
		regular = regular || !c.Init
		if c.Units%uint64(m.Count) != 0 {
			return MultiGPU{}, &MultiGPUError{Pod: pod, Field: fmt.Sprintf("container %q", c.Name), Value: uintString(c.Units) + " units",
				Reason: "do not divide evenly over the " + strconv.Itoa(m.Count) + " GPUs of label " + LabelPodGPUCount + "; ask for a multiple of " + strconv.Itoa(m.Count)}
		}
	}
	if len(reqs) > 0 && !regular {
		return MultiGPU{}, &MultiGPUError{Pod: pod, Field: "label " + LabelPodGPUCount, Value: strconv.Itoa(m.Count),
			Reason: "needs a regular container asking for " + string(ResourceName) + ": only init containers do"}
	}
	return m, nil
}
