package gpushare

import (
	"fmt"
	"strconv"
)

// Error is the type of this package's sentinel errors. Being constants, they
// cannot be reassigned by any importer; match them with errors.Is.
type Error string

// Error returns the sentinel's text.
func (e Error) Error() string { return string(e) }

// Sentinel errors, one per kind of failure.
const (
	// ErrInvalidUnit marks a memory unit that is not GiB, MiB or a divisor of a GiB in MiB.
	ErrInvalidUnit Error = "invalid gpushare memory unit"
	// ErrInvalidRequest marks a gpu-mem request that is negative, fractional or too large.
	ErrInvalidRequest Error = "invalid gpu-mem request"
	// ErrInvalidAllocation marks a malformed allocation annotation value.
	ErrInvalidAllocation Error = "invalid gpushare allocation"
	// ErrMalformedAnnotation marks a pod annotation whose value cannot be read.
	ErrMalformedAnnotation Error = "malformed gpushare annotation"
	// ErrAssignmentMismatch marks a pod assignment that does not fit the pod's containers.
	ErrAssignmentMismatch Error = "gpushare assignment does not match the pod"
	// ErrMultiGPUContainer marks an allocation giving one container several GPUs, which we do not support.
	ErrMultiGPUContainer Error = "container allocated on more than one GPU"
	// ErrInvalidNodeGPUs marks a malformed node GPU description.
	ErrInvalidNodeGPUs Error = "invalid node GPU description"
	// ErrInvalidGPUList marks a malformed unhealthy-GPU list.
	ErrInvalidGPUList Error = "invalid GPU index list"
	// ErrInvalidEnv marks a container environment that is not a gpushare allocation.
	ErrInvalidEnv Error = "invalid gpushare container environment"
)

// UnitError reports a memory unit string that ParseUnit rejects.
type UnitError struct {
	Value string // the rejected text
}

// Error names the value and the allowed forms, so a bad flag explains itself.
func (e *UnitError) Error() string {
	return fmt.Sprintf("%s %s: want GiB, MiB, 1GiB or <n>MiB where n divides 1024 (1, 2, 4, ..., 512, 1024)",
		ErrInvalidUnit, clip(e.Value))
}

// Unwrap returns ErrInvalidUnit.
func (e *UnitError) Unwrap() error { return ErrInvalidUnit }

// RequestError reports an unusable gpu-mem request of one container.
type RequestError struct {
	Pod       string // namespace/name; empty when the quantity was checked alone
	Container string // container name; empty when the quantity was checked alone
	Value     string // the quantity as written
	Reason    string // what is wrong with it
}

// Error names the pod, the container and the value.
func (e *RequestError) Error() string {
	where := ""
	if e.Pod != "" || e.Container != "" {
		where = fmt.Sprintf(" in pod %s container %q", e.Pod, e.Container)
	}
	return fmt.Sprintf("%s%s: %s %s", ErrInvalidRequest, where, clip(e.Value), e.Reason)
}

// Unwrap returns ErrInvalidRequest.
func (e *RequestError) Unwrap() error { return ErrInvalidRequest }

// AllocationError reports why an allocation annotation value is invalid.
type AllocationError struct {
	Path   string // where in the JSON, e.g. `"0"."1"`; empty for the whole value
	Reason string
}

// Error names the place in the JSON and the reason.
func (e *AllocationError) Error() string {
	if e.Path == "" {
		return fmt.Sprintf("%s: %s", ErrInvalidAllocation, e.Reason)
	}
	return fmt.Sprintf("%s at %s: %s", ErrInvalidAllocation, e.Path, e.Reason)
}

// Unwrap returns ErrInvalidAllocation.
func (e *AllocationError) Unwrap() error { return ErrInvalidAllocation }

// AnnotationError reports one pod annotation whose value cannot be read or written.
type AnnotationError struct {
	Key   string
	Value string
	Err   error // the cause, e.g. a *AllocationError or a strconv error
}

// Error names the key, the value and the cause.
func (e *AnnotationError) Error() string {
	return fmt.Sprintf("%s %s=%s: %v", ErrMalformedAnnotation, e.Key, clip(e.Value), e.Err)
}

// Unwrap returns both ErrMalformedAnnotation and the cause, so errors.Is
// matches either (e.g. ErrInvalidAllocation for the allocation key).
func (e *AnnotationError) Unwrap() []error { return []error{ErrMalformedAnnotation, e.Err} }

// AssignmentError reports a container that its pod's assignment cannot place.
type AssignmentError struct {
	Container string // container name; empty when only the index is known
	Index     int    // index in pod.spec.containers (or initContainers when Init); -1 for the whole pod
	Init      bool
	Reason    string
	Err       error // ErrAssignmentMismatch or ErrMultiGPUContainer
}

// Error names the container and the reason.
func (e *AssignmentError) Error() string {
	list := "containers"
	if e.Init {
		list = "initContainers"
	}
	if e.Index < 0 && e.Container == "" { // about the pod as a whole
		return fmt.Sprintf("%v: %s", e.Err, e.Reason)
	}
	name := ""
	if e.Container != "" {
		name = fmt.Sprintf(" %q", e.Container)
	}
	return fmt.Sprintf("%v: %s[%d]%s: %s", e.Err, list, e.Index, name, e.Reason)
}

// Unwrap returns the kind, ErrAssignmentMismatch or ErrMultiGPUContainer.
func (e *AssignmentError) Unwrap() error { return e.Err }

// NodeGPUsError reports why a node GPU description is invalid.
type NodeGPUsError struct {
	Field  string // e.g. "unit" or "gpus[2].index"; empty for the whole value
	Reason string
}

// Error names the field and the reason.
func (e *NodeGPUsError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("%s: %s", ErrInvalidNodeGPUs, e.Reason)
	}
	return fmt.Sprintf("%s: %s: %s", ErrInvalidNodeGPUs, e.Field, e.Reason)
}

// Unwrap returns ErrInvalidNodeGPUs.
func (e *NodeGPUsError) Unwrap() error { return ErrInvalidNodeGPUs }

// GPUListError reports an item of an unhealthy-GPU list that is not a GPU index.
type GPUListError struct {
	Item   string // the offending item, spaces trimmed
	Reason string
}

// Error names the item and the reason.
func (e *GPUListError) Error() string {
	return fmt.Sprintf("%s: item %s %s", ErrInvalidGPUList, clip(e.Item), e.Reason)
}

// Unwrap returns ErrInvalidGPUList.
func (e *GPUListError) Unwrap() error { return ErrInvalidGPUList }

// EnvError reports a container environment variable that is missing or malformed.
type EnvError struct {
	Key    string
	Value  string
	Reason string
}

// Error names the variable, its value and the reason.
func (e *EnvError) Error() string {
	return fmt.Sprintf("%s: %s=%s: %s", ErrInvalidEnv, e.Key, clip(e.Value), e.Reason)
}

// Unwrap returns ErrInvalidEnv.
func (e *EnvError) Unwrap() error { return ErrInvalidEnv }

// clip quotes a value for an error message, cut short so that a huge
// annotation cannot flood logs or events.
func clip(s string) string {
	const limit = 80
	if len(s) > limit {
		return strconv.Quote(s[:limit]) + "..."
	}
	return strconv.Quote(s)
}
