package gpushare

import (
	"errors"
	"maps"
	"math"
	"slices"
	"strconv"
)

// PodAssignment is what the extender writes on a pod at bind (contract
// section 2): the five ALIYUN_COM_GPU_MEM_* annotations and, when it places
// containers one by one, the allocation annotation.
type PodAssignment struct {
	GPUIndex   int        // AnnotationGPUIndex; -1 when only Allocation names the GPUs
	PodUnits   uint64     // AnnotationPodUnits
	DevUnits   uint64     // AnnotationDevUnits
	Assigned   bool       // AnnotationAssigned
	AssumeTime int64      // AnnotationAssumeTime, Unix nanoseconds
	Allocation Allocation // AnnotationAllocation; nil or empty when absent
}

// Encode returns the annotations of p, all five ALIYUN_COM_GPU_MEM_* keys (IDX
// only when GPUIndex >= 0) plus AnnotationAllocation when Allocation is
// non-empty. Values the decoder would reject are an *AnnotationError, so a
// bad assignment never reaches the API server.
func (p PodAssignment) Encode() (map[string]string, error) {
	bad := func(key, value, reason string) error {
		return &AnnotationError{Key: key, Value: value, Err: errors.New(reason)}
	}
	switch {
	case p.GPUIndex < -1 || p.GPUIndex >= MaxGPUsPerNode:
		return nil, bad(AnnotationGPUIndex, strconv.Itoa(p.GPUIndex), "GPU index is outside [0, "+strconv.Itoa(MaxGPUsPerNode)+")")
	case p.GPUIndex == -1 && len(p.Allocation) == 0:
		return nil, bad(AnnotationGPUIndex, "", "neither a GPU index nor an allocation is set")
	case p.PodUnits > MaxUnits:
		return nil, bad(AnnotationPodUnits, uintString(p.PodUnits), "above the limit of "+uintString(MaxUnits))
	case p.DevUnits > MaxUnits:
		return nil, bad(AnnotationDevUnits, uintString(p.DevUnits), "above the limit of "+uintString(MaxUnits))
	case p.AssumeTime < 0:
		return nil, bad(AnnotationAssumeTime, strconv.FormatInt(p.AssumeTime, 10), "negative time")
	}
	m := map[string]string{
		AnnotationPodUnits:   uintString(p.PodUnits),
		AnnotationDevUnits:   uintString(p.DevUnits),
		AnnotationAssigned:   strconv.FormatBool(p.Assigned),
		AnnotationAssumeTime: strconv.FormatInt(p.AssumeTime, 10),
	}
	if p.GPUIndex >= 0 {
		m[AnnotationGPUIndex] = strconv.Itoa(p.GPUIndex)
	}
	if len(p.Allocation) > 0 {
		s, err := EncodeAllocation(p.Allocation)
		if err != nil {
			return nil, &AnnotationError{Key: AnnotationAllocation, Err: err}
		}
		m[AnnotationAllocation] = s
	}
	return m, nil
}

// DecodePodAssignment reads a pod's assignment from its annotations. ok is
// false, with no error, when neither AnnotationGPUIndex nor a non-empty
// AnnotationAllocation is present: the pod is not placed yet ("pending" in CLI
// terms) and the returned value is zero. It is lenient where the old gpushare
// was: POD, DEV, ASSIGNED and ASSUME_TIME may be absent (zero, false). A
// present value that cannot be read is an *AnnotationError
// (ErrMalformedAnnotation).
func DecodePodAssignment(annotations map[string]string) (p PodAssignment, ok bool, err error) {
	rawIdx, hasIdx := annotations[AnnotationGPUIndex]
	rawAlloc, hasAlloc := annotations[AnnotationAllocation]
	if !hasIdx && !hasAlloc {
		return PodAssignment{}, false, nil
	}
	if hasAlloc {
		a, err := DecodeAllocation(rawAlloc)
		if err != nil {
			return PodAssignment{}, false, &AnnotationError{Key: AnnotationAllocation, Value: rawAlloc, Err: err}
		}
		// An empty allocation names no GPU; the old CLI then falls back to IDX too.
		if len(a) > 0 {
			p.Allocation = a
		}
	}
	if !hasIdx && p.Allocation == nil {
		return PodAssignment{}, false, nil
	}
	p.GPUIndex = -1
	if hasIdx {
		idx, reason := parseGPUIndex(rawIdx)
		if reason != "" {
			return PodAssignment{}, false, &AnnotationError{Key: AnnotationGPUIndex, Value: rawIdx, Err: errors.New(reason)}
		}
		p.GPUIndex = idx
	}
	for _, f := range []struct {
		key string
		dst *uint64
	}{{AnnotationPodUnits, &p.PodUnits}, {AnnotationDevUnits, &p.DevUnits}} {
		raw, has := annotations[f.key]
		if !has {
			continue
		}
		v, reason := parseUnits(raw)
		if reason != "" {
			return PodAssignment{}, false, &AnnotationError{Key: f.key, Value: raw, Err: errors.New(reason)}
		}
		*f.dst = v
	}
	if raw, has := annotations[AnnotationAssigned]; has {
		// Only the spellings the old extender and plugin wrote; "1" or "TRUE" hint at a foreign writer.
		switch raw {
		case "true":
			p.Assigned = true
		case "false":
		default:
			return PodAssignment{}, false, &AnnotationError{Key: AnnotationAssigned, Value: raw, Err: errors.New(`is neither "true" nor "false"`)}
		}
	}
	if raw, has := annotations[AnnotationAssumeTime]; has {
		t, reason := parseDigits(raw, math.MaxInt64)
		if reason != "" {
			return PodAssignment{}, false, &AnnotationError{Key: AnnotationAssumeTime, Value: raw, Err: errors.New(reason)}
		}
		p.AssumeTime = int64(t)
	}
	return p, true, nil
}

// GPUFor returns the GPU container c must run on. The allocation takes
// precedence over the index (contract section 2) and must agree with c's
// request; init containers, which the allocation cannot name, use the index,
// or the allocation's only GPU when no index was written. Anything that
// cannot be decided is an *AssignmentError (ErrAssignmentMismatch or
// ErrMultiGPUContainer): a container must never start on a guessed GPU.
func (p PodAssignment) GPUFor(c ContainerRequest) (int, error) {
	mismatch := func(reason string) error {
		return &AssignmentError{Container: c.Name, Index: c.Index, Init: c.Init, Reason: reason, Err: ErrAssignmentMismatch}
	}
	if !c.Init && len(p.Allocation) > 0 {
		share, ok, err := p.Allocation.ContainerShare(c.Index)
		if err != nil {
			var ae *AssignmentError
			if errors.As(err, &ae) {
				named := *ae
				named.Container = c.Name
				return -1, &named
			}
			return -1, err
		}
		if !ok {
			return -1, mismatch("the allocation annotation has no entry for this container")
		}
		if share.Units != c.Units {
			return -1, mismatch("the allocation gives " + uintString(share.Units) + " units, the container requests " + uintString(c.Units))
		}
		return share.GPU, nil
	}
	if p.GPUIndex >= 0 {
		return p.GPUIndex, nil
	}
	if gpus := p.Allocation.GPUs(); len(gpus) == 1 {
		return gpus[0], nil
	}
	return -1, mismatch("no GPU index annotation and the allocation spans several GPUs")
}

// ContainerGPUs maps each regular container of reqs that asks for gpu-mem
// (by index in pod.spec.containers) to its GPU; with only a GPU index, all are
// on it. It also fails when the allocation charges a container that asks for
// nothing, since per-GPU accounting would then drift from the requests.
func (p PodAssignment) ContainerGPUs(reqs []ContainerRequest) (map[int]int, error) {
	out := map[int]int{}
	for _, r := range reqs {
		if r.Init {
			continue
		}
		g, err := p.GPUFor(r)
		if err != nil {
			return nil, err
		}
		out[r.Index] = g
	}
	for _, c := range slices.Sorted(maps.Keys(p.Allocation)) {
		if _, ok := out[c]; !ok {
			return nil, &AssignmentError{Index: c, Reason: "the allocation charges a container that requests no gpu-mem", Err: ErrAssignmentMismatch}
		}
	}
	return out, nil
}
