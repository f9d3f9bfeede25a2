package gpushare

import (
	"cmp"
	"encoding/json"
	"slices"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
)

// AnnotationNodeUsage is our node annotation (contract section 7) on which
// the device plugin's usage loop publishes the memory each container really
// uses on each GPU beside its slice, see NodeUsage. Absent on nodes whose
// plugin does not measure use (-usage-interval unset).
const AnnotationNodeUsage = "gpushare.io/usage"

// MaxUsageContainers bounds NodeUsage.Containers, so the annotation stays a
// few tens of KiB however many processes a node runs: 256 entries of about
// 120 bytes. The plugin keeps the largest users and counts the rest in
// Truncated.
const MaxUsageContainers = 256

// maxUsageMiB bounds every MiB figure: 1<<24 MiB is 16 TiB, beyond any GPU.
const maxUsageMiB = 1 << 24

// ErrInvalidNodeUsage marks a malformed AnnotationNodeUsage value.
const ErrInvalidNodeUsage Error = "invalid gpushare node usage"

// NodeUsage is the value of AnnotationNodeUsage: one reading of the node's
// GPUs, attributed to containers. JSON, e.g.
// {"at":"2026-12-05T13:00:00Z","intervalSeconds":10,"gpus":[{"index":0,"usedMiB":9216,"utilization":40}],
// "containers":[{"namespace":"default","pod":"a","container":"main","gpu":0,"usedMiB":9216,"sliceMiB":8192}]}.
type NodeUsage struct {
	// At is when the GPUs were read. The plugin rewrites the value only
	// when a figure moved by a memory unit or more (at most every 30 s), so
	// an old At on a node whose plugin runs means nothing moved since.
	At time.Time `json:"at"`
	// IntervalSeconds is how often the plugin reads the GPUs.
	IntervalSeconds int `json:"intervalSeconds"`
	// GPUs are sorted by index.
	GPUs []GPUUsage `json:"gpus"`
	// Containers are sorted by namespace, pod, container, then GPU.
	Containers []ContainerUsage `json:"containers"`
	// Truncated is how many container entries were left out beyond
	// MaxUsageContainers (the smallest users); omitted when none.
	Truncated int `json:"truncated,omitempty"`
}

// GPUUsage is one GPU's memory in use and utilisation.
type GPUUsage struct {
	Index int `json:"index"`
	// UsedMiB is all memory in use on the GPU, as NVML counts it (contexts
	// of every process, the driver's reservation).
	UsedMiB uint64 `json:"usedMiB"`
	// Utilization is the percentage of time a kernel ran; omitted when the
	// GPU does not report it.
	Utilization *int `json:"utilization,omitempty"`
	// UnattributedMiB is what processes used that no container of a pod on
	// the node accounts for: host processes, the MPS server, pods the plugin
	// cannot see; omitted when 0.
	UnattributedMiB uint64 `json:"unattributedMiB,omitempty"`
}

// ContainerUsage is what one container's processes use on one GPU.
type ContainerUsage struct {
	Namespace string `json:"namespace"`
	Pod       string `json:"pod"`
	Container string `json:"container"`
	GPU       int    `json:"gpu"`
	UsedMiB   uint64 `json:"usedMiB"`
	// SliceMiB is the container's slice of this GPU (its units on it times
	// the unit); 0 for a container using the GPU without a gpushare slice.
	SliceMiB uint64 `json:"sliceMiB"`
}

// Over reports whether the container uses more than its slice; a container
// without a slice is never over (it has no slice to exceed).
func (c ContainerUsage) Over() bool { return c.SliceMiB > 0 && c.UsedMiB > c.SliceMiB }

// NodeUsageError reports why a node usage value is invalid.
type NodeUsageError struct {
	Field  string // e.g. "containers[3].pod"; empty for the whole value
	Reason string
}

// Error names the field and the reason.
func (e *NodeUsageError) Error() string {
	if e.Field == "" {
		return string(ErrInvalidNodeUsage) + ": " + e.Reason
	}
	return string(ErrInvalidNodeUsage) + " at " + e.Field + ": " + e.Reason
}

// Unwrap returns ErrInvalidNodeUsage.
func (e *NodeUsageError) Unwrap() error { return ErrInvalidNodeUsage }

// Validate checks what DecodeNodeUsage checks: a time, a positive interval,
// GPU indices unique in [0, MaxGPUsPerNode), utilisation in [0, 100], MiB
// figures below 16 TiB, at most MaxUsageContainers containers with valid
// names, each (namespace, pod, container, GPU) once and on a listed GPU.
func (u NodeUsage) Validate() error {
	if u.At.IsZero() {
		return &NodeUsageError{Field: "at", Reason: "missing"}
	}
	// In UTC, as it is written: "0000-01-01T00:00:00+01:00" parses, but is
	// year -1 there, which RFC 3339 cannot write.
	if y := u.At.UTC().Year(); y < 1 || y > 9999 {
		return &NodeUsageError{Field: "at", Reason: "year " + strconv.Itoa(y) + " in UTC is outside 1-9999"}
	}
	if u.IntervalSeconds <= 0 {
		return &NodeUsageError{Field: "intervalSeconds", Reason: strconv.Itoa(u.IntervalSeconds) + " is not positive"}
	}
	if len(u.GPUs) > MaxGPUsPerNode || len(u.Containers) > MaxUsageContainers || u.Truncated < 0 {
		return &NodeUsageError{Reason: "more than " + strconv.Itoa(MaxGPUsPerNode) + " GPUs or " + strconv.Itoa(MaxUsageContainers) +
			" containers, or a negative truncation"}
	}
	gpus := map[int]bool{}
	for i, g := range u.GPUs {
		field := "gpus[" + strconv.Itoa(i) + "]"
		switch {
		case g.Index < 0 || g.Index >= MaxGPUsPerNode || gpus[g.Index]:
			return &NodeUsageError{Field: field + ".index", Reason: strconv.Itoa(g.Index) + " is out of range or repeated"}
		case g.UsedMiB > maxUsageMiB || g.UnattributedMiB > maxUsageMiB:
			return &NodeUsageError{Field: field, Reason: "a MiB figure is beyond any GPU"}
		case g.Utilization != nil && (*g.Utilization < 0 || *g.Utilization > 100):
			return &NodeUsageError{Field: field + ".utilization", Reason: strconv.Itoa(*g.Utilization) + " is not a percentage"}
		}
		gpus[g.Index] = true
	}
	seen := map[ContainerUsage]bool{}
	for i, c := range u.Containers {
		field := "containers[" + strconv.Itoa(i) + "]"
		if err := validUsageNames(c); err != "" {
			return &NodeUsageError{Field: field, Reason: err}
		}
		if !gpus[c.GPU] {
			return &NodeUsageError{Field: field + ".gpu", Reason: "GPU " + strconv.Itoa(c.GPU) + " is not listed"}
		}
		if c.UsedMiB > maxUsageMiB || c.SliceMiB > maxUsageMiB {
			return &NodeUsageError{Field: field, Reason: "a MiB figure is beyond any GPU"}
		}
		key := ContainerUsage{Namespace: c.Namespace, Pod: c.Pod, Container: c.Container, GPU: c.GPU}
		if seen[key] {
			return &NodeUsageError{Field: field, Reason: "the container appears twice on GPU " + strconv.Itoa(c.GPU)}
		}
		seen[key] = true
	}
	return nil
}

// validUsageNames checks the names as the API server would have; "" when valid.
func validUsageNames(c ContainerUsage) string {
	for what, errs := range map[string][]string{
		"namespace": validation.IsDNS1123Label(c.Namespace),
		"pod":       validation.IsDNS1123Subdomain(c.Pod),
		"container": validation.IsDNS1123Label(c.Container),
	} {
		if len(errs) > 0 {
			return what + " " + strconv.Quote(c.Namespace+"/"+c.Pod+"/"+c.Container) + " is not a valid name"
		}
	}
	return ""
}

// EncodeNodeUsage validates u and writes it as JSON, GPUs and containers
// sorted, the time in whole seconds, so equal readings encode equally. It
// does not modify u.
func EncodeNodeUsage(u NodeUsage) (string, error) {
	u = u.sorted()
	if err := u.Validate(); err != nil {
		return "", err
	}
	b, err := json.Marshal(u)
	if err != nil {
		return "", &NodeUsageError{Reason: err.Error()}
	}
	return string(b), nil
}

// DecodeNodeUsage reads and validates a node usage value; unknown fields are
// ignored so an older reader accepts a newer plugin's additions. Failures
// are a *NodeUsageError (ErrInvalidNodeUsage).
func DecodeNodeUsage(s string) (NodeUsage, error) {
	var u NodeUsage
	if err := json.Unmarshal([]byte(s), &u); err != nil {
		return NodeUsage{}, &NodeUsageError{Reason: "not valid JSON: " + err.Error()}
	}
	if err := u.Validate(); err != nil {
		return NodeUsage{}, err
	}
	return u.sorted(), nil
}

// sorted returns a copy in the encoded order, never with nil lists.
func (u NodeUsage) sorted() NodeUsage {
	u.At = u.At.UTC().Truncate(time.Second)
	u.GPUs = slices.Clone(u.GPUs)
	if u.GPUs == nil {
		u.GPUs = []GPUUsage{}
	}
	slices.SortFunc(u.GPUs, func(a, b GPUUsage) int { return a.Index - b.Index })
	u.Containers = slices.Clone(u.Containers)
	if u.Containers == nil {
		u.Containers = []ContainerUsage{}
	}
	slices.SortFunc(u.Containers, CompareContainerUsage)
	return u
}

// CompareContainerUsage orders by namespace, pod, container, then GPU.
func CompareContainerUsage(a, b ContainerUsage) int {
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Pod, b.Pod),
		cmp.Compare(a.Container, b.Container), cmp.Compare(a.GPU, b.GPU))
}
