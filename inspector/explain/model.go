package explain

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/gpushare/gpushare/extender/allocator"
)

// State is the cluster as the command listed it: every node and the pods
// that may hold GPU memory (finished ones may be included; they are ignored).
type State struct {
	Nodes []corev1.Node
	Pods  []corev1.Pod
}

// Kinds of node verdicts, the stable values of NodeVerdict.Kind: the
// allocator's diagnosis (allocator.Diagnose), and two of the inspector's own.
const (
	KindFits         = "fits" // the pod fits the node now
	KindNotGPUShare  = allocator.KindNotGPUShare
	KindUnhealthy    = allocator.KindUnhealthy
	KindIsolation    = allocator.KindIsolation
	KindTopology     = allocator.KindTopology
	KindWaiting      = allocator.KindWaiting
	KindTooBig       = allocator.KindTooBig
	KindFragmented   = allocator.KindFragmented
	KindInsufficient = allocator.KindInsufficient
	KindScheduler    = "scheduler" // the GPUs fit, a kube-scheduler predicate does not
)

// NodeVerdict is one node's answer for the pod.
type NodeVerdict struct {
	Name string `json:"name"`
	Kind string `json:"kind"`
	Fits bool   `json:"fits"`
	// GPUs is where the pod would go on the node (when its GPUs fit).
	GPUs []int `json:"gpus,omitempty"`
	// Score is the extender's prioritize score (0-10) when the GPUs fit.
	Score int64 `json:"score"`
	// Reason is the extender's filter reason, verbatim; empty when the GPUs fit.
	Reason string `json:"reason,omitempty"`
	// Detail is the inspector's reading of it (fragmentation, in-flight pod, ...).
	Detail string `json:"detail,omitempty"`
	// Scheduler lists kube-scheduler predicates the node fails, in its wording.
	Scheduler []string `json:"scheduler,omitempty"`
	// WaitingFor names the in-flight pods (namespace/name) the pod waits behind.
	WaitingFor []string `json:"waitingFor,omitempty"`
	// Free and LargestFree count the units free on the GPUs the pod may use.
	Free        uint64 `json:"free"`
	LargestFree uint64 `json:"largestFree"`
	// UnhealthyGPUs and MIGGPUs name GPUs the pod cannot use on the node.
	UnhealthyGPUs []int `json:"unhealthyGPUs,omitempty"`
	MIGGPUs       []int `json:"migGPUs,omitempty"`
}

// PodInfo is the request the verdicts are about.
type PodInfo struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Units     uint64 `json:"units"`
	// GPUCount is the aliyun.com/gpu-count label's count, when above 1.
	GPUCount int `json:"gpuCount,omitempty"`
	// Isolation and ComputePercent are what the pod's annotations ask; omitted when nothing.
	Isolation      string `json:"isolation,omitempty"`
	ComputePercent int    `json:"computePercent,omitempty"`
	// TopologyRequired is gpushare.io/topology: required.
	TopologyRequired bool `json:"topologyRequired,omitempty"`
}

// Choice is a placement: a node and the GPUs there.
type Choice struct {
	Node  string `json:"node"`
	GPUs  []int  `json:"gpus"`
	Score int64  `json:"score"`
}

// Condition is the pod's PodScheduled condition, where kube-scheduler says why.
type Condition struct {
	Status  string `json:"status"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

// Bound describes a pod already bound: where, and why there.
type Bound struct {
	Node string `json:"node"`
	// GPUs are the GPUs its annotations name; empty when it has no assignment.
	GPUs []int `json:"gpus,omitempty"`
	// Assigned is true once the device plugin served it (ALIYUN_COM_GPU_MEM_ASSIGNED).
	Assigned bool `json:"assigned"`
	// Replay is where the extender places the pod now, on the cluster without it.
	Replay *Choice `json:"replay,omitempty"`
	// Why says why there, in words.
	Why string `json:"why"`
}

// Skip is an object that could not be read and was left out of the replay.
type Skip struct {
	Pod    string `json:"pod"`
	Reason string `json:"reason"`
}

// Why is the answer of kubectl inspect gpushare why POD.
type Why struct {
	Unit   string  `json:"unit"`
	Policy string  `json:"policy"`
	Pod    PodInfo `json:"pod"`
	// Status is "pending" or "bound".
	Status    string        `json:"status"`
	Scheduler *Condition    `json:"scheduler,omitempty"`
	Bound     *Bound        `json:"bound,omitempty"`
	Nodes     []NodeVerdict `json:"nodes"`
	// Fitting counts the nodes the pod fits now.
	Fitting int      `json:"fitting"`
	Summary string   `json:"summary"`
	Help    []string `json:"help,omitempty"`
	Skipped []Skip   `json:"skipped,omitempty"`
}

// Stop is the first copy of a fit that fits nowhere, with every node's verdict for it.
type Stop struct {
	Copy  int           `json:"copy"`
	Nodes []NodeVerdict `json:"nodes"`
}

// Fit is the answer of kubectl inspect gpushare fit -f FILE.
type Fit struct {
	Unit     string  `json:"unit"`
	Policy   string  `json:"policy"`
	Pod      PodInfo `json:"pod"`
	Replicas int     `json:"replicas"`
	// Placed counts the copies that fit, placed one after another.
	Placed     int      `json:"placed"`
	Placements []Choice `json:"placements"`
	// Nodes are the verdicts for the first copy.
	Nodes []NodeVerdict `json:"nodes"`
	// Stopped is set when a copy after the first fits nowhere.
	Stopped *Stop    `json:"stopped,omitempty"`
	Summary string   `json:"summary"`
	Help    []string `json:"help,omitempty"`
	Skipped []Skip   `json:"skipped,omitempty"`
}
