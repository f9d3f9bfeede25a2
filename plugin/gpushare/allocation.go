package gpushare

import (
	"bytes"
	"encoding/json"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Allocation is the value of AnnotationAllocation: container index (in
// pod.spec.containers) → GPU index → units, e.g. {"0":{"0":2}}.
type Allocation map[int]GPUUnits

// GPUUnits maps a GPU index to the units a container holds on it.
type GPUUnits map[int]uint64

// Share is one container's slice of one GPU.
type Share struct {
	GPU   int
	Units uint64
}

// AllocationForGPU places every regular container of reqs on gpu, the shape
// the extender writes at bind. Init containers are left out: the annotation
// keys only index pod.spec.containers. It returns nil when no regular
// container asks for gpu-mem.
func AllocationForGPU(reqs []ContainerRequest, gpu int) Allocation {
	var a Allocation
	for _, r := range reqs {
		if r.Init || r.Units == 0 {
			continue
		}
		if a == nil {
			a = Allocation{}
		}
		a[r.Index] = GPUUnits{gpu: r.Units}
	}
	return a
}

// Validate checks what DecodeAllocation checks: non-negative container
// indices, GPU indices in [0, MaxGPUsPerNode), units in [1, MaxUnits], and no
// container without GPUs.
func (a Allocation) Validate() error {
	for _, c := range slices.Sorted(maps.Keys(a)) {
		path := strconv.Quote(strconv.Itoa(c))
		if c < 0 {
			return &AllocationError{Path: path, Reason: "container index is negative"}
		}
		gpus := a[c]
		if len(gpus) == 0 {
			return &AllocationError{Path: path, Reason: "container has no GPU"}
		}
		for _, g := range slices.Sorted(maps.Keys(gpus)) {
			gpath := path + "." + strconv.Quote(strconv.Itoa(g))
			if g < 0 || g >= MaxGPUsPerNode {
				return &AllocationError{Path: gpath, Reason: "GPU index is outside [0, " + strconv.Itoa(MaxGPUsPerNode) + ")"}
			}
			if u := gpus[g]; u == 0 || u > MaxUnits {
				return &AllocationError{Path: gpath, Reason: "units must be in [1, " + uintString(MaxUnits) + "]"}
			}
		}
	}
	return nil
}

// EncodeAllocation writes a as JSON with keys in numeric order (encoding/json
// would order int keys as strings, "10" before "2"), so equal allocations
// always produce equal annotations. An invalid a is an *AllocationError.
func EncodeAllocation(a Allocation) (string, error) {
	if err := a.Validate(); err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteByte('{')
	for i, c := range slices.Sorted(maps.Keys(a)) {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`"` + strconv.Itoa(c) + `":{`)
		for j, g := range slices.Sorted(maps.Keys(a[c])) {
			if j > 0 {
				b.WriteByte(',')
			}
			b.WriteString(`"` + strconv.Itoa(g) + `":` + uintString(a[c][g]))
		}
		b.WriteByte('}')
	}
	b.WriteByte('}')
	return b.String(), nil
}

// DecodeAllocation reads an allocation annotation value. Keys must be
// canonical decimal integers (so "0" and "00" cannot both name container 0),
// units plain JSON integers; "{}" is a valid, empty allocation. Anything else
// is an *AllocationError (ErrInvalidAllocation).
func DecodeAllocation(s string) (Allocation, error) {
	outer, err := decodeObject([]byte(s), "")
	if err != nil {
		return nil, err
	}
	a := make(Allocation, len(outer))
	for _, ck := range slices.Sorted(maps.Keys(outer)) {
		path := strconv.Quote(ck)
		c, ok := parseKey(ck, math.MaxInt32)
		if !ok {
			return nil, &AllocationError{Path: path, Reason: "container index is not a canonical non-negative integer"}
		}
		inner, err := decodeObject(outer[ck], path)
		if err != nil {
			return nil, err
		}
		if len(inner) == 0 {
			return nil, &AllocationError{Path: path, Reason: "container has no GPU"}
		}
		gpus := make(GPUUnits, len(inner))
		for _, gk := range slices.Sorted(maps.Keys(inner)) {
			gpath := path + "." + strconv.Quote(gk)
			g, ok := parseKey(gk, MaxGPUsPerNode-1)
			if !ok {
				return nil, &AllocationError{Path: gpath, Reason: "GPU index is not a canonical integer in [0, " + strconv.Itoa(MaxGPUsPerNode) + ")"}
			}
			units, reason := parseUnits(string(bytes.TrimSpace(inner[gk])))
			if reason == "" && units == 0 {
				reason = "is zero"
			}
			if reason != "" {
				return nil, &AllocationError{Path: gpath, Reason: "units " + clip(string(inner[gk])) + " " + reason}
			}
			gpus[g] = units
		}
		a[c] = gpus
	}
	return a, nil
}

// decodeObject reads one JSON object level, keeping values raw.
func decodeObject(data []byte, path string) (map[string]json.RawMessage, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, &AllocationError{Path: path, Reason: "not a JSON object: " + err.Error()}
	}
	// Unmarshal accepts null into a map, leaving it nil.
	if m == nil {
		return nil, &AllocationError{Path: path, Reason: "not a JSON object: null"}
	}
	return m, nil
}

// parseKey reads a canonical decimal integer key in [0, limit].
func parseKey(s string, limit int) (int, bool) {
	n, reason := parseDigits(s, uint64(limit))
	if reason != "" || strconv.FormatUint(n, 10) != s {
		return 0, false
	}
	return int(n), true
}

// GPUs returns the distinct GPU indices a uses, ascending.
func (a Allocation) GPUs() []int {
	seen := map[int]bool{}
	for _, gpus := range a {
		for g := range gpus {
			seen[g] = true
		}
	}
	return slices.Sorted(maps.Keys(seen))
}

// UnitsByGPU sums units per GPU index over all containers, the per-GPU usage
// the extender and the inspector charge.
func (a Allocation) UnitsByGPU() map[int]uint64 {
	out := map[int]uint64{}
	for _, gpus := range a {
		for g, u := range gpus {
			out[g] += u
		}
	}
	return out
}

// ContainerShare returns the GPU and units of container index c. ok is false
// when a has no entry for c. A container listed on several GPUs is an
// *AssignmentError (ErrMultiGPUContainer): we give one GPU per container.
func (a Allocation) ContainerShare(c int) (share Share, ok bool, err error) {
	gpus, ok := a[c]
	if !ok || len(gpus) == 0 {
		return Share{}, false, nil
	}
	if len(gpus) > 1 {
		return Share{}, true, &AssignmentError{
			Index:  c,
			Reason: "allocation lists GPUs " + formatInts(slices.Sorted(maps.Keys(gpus))) + ", one GPU per container is supported",
			Err:    ErrMultiGPUContainer,
		}
	}
	for g, u := range gpus {
		share = Share{GPU: g, Units: u}
	}
	return share, true, nil
}
