package gpushare

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// AnnotationContainerEnv is our pod annotation (contract section 7) on which
// the device plugin records the gpushare environment it gave each container,
// keyed by container name, see ContainerEnvs. It is what lets a restarted
// plugin know which containers it already served, and what the inspector
// shows as each container's limit.
const AnnotationContainerEnv = "gpushare.io/container-env"

// ErrInvalidContainerEnvs marks a malformed AnnotationContainerEnv value.
const ErrInvalidContainerEnvs Error = "invalid gpushare container-env record"

// ContainerEnvs is the value of AnnotationContainerEnv: container name (init
// containers included, names are unique across both lists) → the environment
// Allocate returned for it. JSON, e.g.
// {"main":{"gpu":0,"pod":4,"container":2,"dev":80}}, with "gpus":"0,1" only
// for a container on several GPUs ("gpu" is then the first), "cgpuDisable":true
// only when isolation was turned off, "isolation":"<tier>" when the answer
// carried a tier and "computePercent":<1–100> when it carried a compute
// share (records written before tiers have neither, and encode to the same
// bytes as before).
type ContainerEnvs map[string]ContainerEnv

// ContainerEnvsError reports why a container-env record is invalid.
type ContainerEnvsError struct {
	Path   string // where in the JSON, e.g. `"main".pod`; empty for the whole value
	Reason string
}

// Error names the place in the JSON and the reason.
func (e *ContainerEnvsError) Error() string {
	if e.Path == "" {
		return fmt.Sprintf("%s: %s", ErrInvalidContainerEnvs, e.Reason)
	}
	return fmt.Sprintf("%s at %s: %s", ErrInvalidContainerEnvs, e.Path, e.Reason)
}

// Unwrap returns ErrInvalidContainerEnvs.
func (e *ContainerEnvsError) Unwrap() error { return ErrInvalidContainerEnvs }

// Validate checks what DecodeContainerEnvs checks: container names are
// DNS-1123 labels (what the API server allows), GPU indices in
// [0, MaxGPUsPerNode), container and device units in [1, MaxUnits], and pod
// units in [container units, MaxUnits], since a pod's total can never be
// below one of its containers; the tier, when set, is none, mps or
// hami-core, and a compute share, when set, is 1–100 on a tier that limits
// compute.
func (c ContainerEnvs) Validate() error {
	for _, name := range slices.Sorted(maps.Keys(c)) {
		if err := validateContainerEnv(name, c[name]); err != nil {
			return err
		}
	}
	return nil
}

// validateContainerEnv checks one entry of a record.
func validateContainerEnv(name string, e ContainerEnv) error {
	path := strconv.Quote(name)
	if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
		return &ContainerEnvsError{Path: clip(name), Reason: "container name is not valid: " + strings.Join(errs, "; ")}
	}
	switch {
	case e.GPUIndex < 0 || e.GPUIndex >= MaxGPUsPerNode:
		return &ContainerEnvsError{Path: path + ".gpu", Reason: strconv.Itoa(e.GPUIndex) + " is outside [0, " + strconv.Itoa(MaxGPUsPerNode) + ")"}
	case e.ContainerUnits == 0 || e.ContainerUnits > MaxUnits:
		return &ContainerEnvsError{Path: path + ".container", Reason: uintString(e.ContainerUnits) + " is outside [1, " + uintString(MaxUnits) + "]"}
	case e.DevUnits == 0 || e.DevUnits > MaxUnits:
		return &ContainerEnvsError{Path: path + ".dev", Reason: uintString(e.DevUnits) + " is outside [1, " + uintString(MaxUnits) + "]"}
	case e.PodUnits < e.ContainerUnits || e.PodUnits > MaxUnits:
		return &ContainerEnvsError{Path: path + ".pod", Reason: uintString(e.PodUnits) + " is outside [" + uintString(e.ContainerUnits) + " (the container's units), " + uintString(MaxUnits) + "]"}
	}
	if e.GPUs != 0 {
		switch n := e.GPUs.Len(); {
		case n < 2 || e.GPUs.First() != e.GPUIndex:
			return &ContainerEnvsError{Path: path + ".gpus", Reason: e.GPUs.String() + " is not a list of several GPUs starting with gpu " + strconv.Itoa(e.GPUIndex)}
		case e.ContainerUnits%uint64(n) != 0:
			return &ContainerEnvsError{Path: path + ".container", Reason: uintString(e.ContainerUnits) + " does not divide evenly over GPUs " + e.GPUs.String()}
		}
	}
	if e.Isolation != "" {
		if _, reason := parseTier(string(e.Isolation)); reason != "" {
			return &ContainerEnvsError{Path: path + ".isolation", Reason: clip(string(e.Isolation)) + " " + reason}
		}
	}
	if reason := tierPercentReason(e.Isolation, e.ComputePercent); reason != "" {
		return &ContainerEnvsError{Path: path + ".computePercent", Reason: strconv.Itoa(e.ComputePercent) + " " + reason}
	}
	return nil
}

// EncodeContainerEnvs validates c and writes it as JSON with container names
// in sorted order, so an unchanged record never causes a spurious PATCH. An
// invalid c is a *ContainerEnvsError.
func EncodeContainerEnvs(c ContainerEnvs) (string, error) {
	if err := c.Validate(); err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteByte('{')
	for i, name := range slices.Sorted(maps.Keys(c)) {
		if i > 0 {
			b.WriteByte(',')
		}
		e := c[name]
		// Names are DNS labels, so quoting needs no escaping beyond strconv's.
		fmt.Fprintf(&b, `%s:{"gpu":%d,"pod":%d,"container":%d,"dev":%d`, strconv.Quote(name), e.GPUIndex, e.PodUnits, e.ContainerUnits, e.DevUnits)
		if e.GPUs != 0 {
			fmt.Fprintf(&b, `,"gpus":%q`, e.GPUs.String())
		}
		if e.DisableIsolation {
			b.WriteString(`,"cgpuDisable":true`)
		}
		// Only when set, so records without a tier keep their bytes.
		if e.Isolation != "" {
			fmt.Fprintf(&b, `,"isolation":%s`, strconv.Quote(string(e.Isolation)))
		}
		if e.ComputePercent > 0 {
			fmt.Fprintf(&b, `,"computePercent":%d`, e.ComputePercent)
		}
		b.WriteByte('}')
	}
	b.WriteByte('}')
	return b.String(), nil
}

// containerEnvJSON is one entry as read, numbers kept raw so that floats,
// signs and exponents are refused instead of silently truncated.
type containerEnvJSON struct {
	GPU         json.RawMessage `json:"gpu"`
	Pod         json.RawMessage `json:"pod"`
	Container   json.RawMessage `json:"container"`
	Dev         json.RawMessage `json:"dev"`
	GPUs        *string         `json:"gpus"`
	CGPUDisable *bool           `json:"cgpuDisable"`
	Isolation   *string         `json:"isolation"`
	// ComputePercent is raw for the same reason as the numbers above.
	ComputePercent json.RawMessage `json:"computePercent"`
}

// decodeTier reads an entry's optional tier and compute share into e; a
// share must be a plain integer from 1 to 100 (0 is written as absence).
func decodeTier(path string, entry *containerEnvJSON, e *ContainerEnv) error {
	if entry.Isolation != nil {
		t, reason := parseTier(*entry.Isolation)
		if reason != "" {
			return &ContainerEnvsError{Path: path + ".isolation", Reason: clip(*entry.Isolation) + " " + reason}
		}
		e.Isolation = t
	}
	raw := string(bytes.TrimSpace(entry.ComputePercent))
	if raw == "" || raw == "null" { // absent, like a null tier
		return nil
	}
	n, reason := parseDigits(raw, 100)
	if reason == "" && n == 0 {
		reason = "is outside [1, 100]"
	}
	if reason != "" {
		return &ContainerEnvsError{Path: path + ".computePercent", Reason: clip(raw) + " " + reason}
	}
	e.ComputePercent = int(n)
	return nil
}

// DecodeContainerEnvs reads an AnnotationContainerEnv value. "{}" is a valid,
// empty record. Unknown fields are ignored so an older reader accepts a newer
// plugin's additions; the four numbers are required plain JSON integers.
// Anything else is a *ContainerEnvsError (ErrInvalidContainerEnvs).
func DecodeContainerEnvs(s string) (ContainerEnvs, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal([]byte(s), &raw); err != nil {
		return nil, &ContainerEnvsError{Reason: "not a JSON object: " + err.Error()}
	}
	if raw == nil {
		return nil, &ContainerEnvsError{Reason: "not a JSON object: null"}
	}
	out := make(ContainerEnvs, len(raw))
	for _, name := range slices.Sorted(maps.Keys(raw)) {
		path := strconv.Quote(name)
		var entry *containerEnvJSON
		if err := json.Unmarshal(raw[name], &entry); err != nil || entry == nil {
			reason := "null"
			if err != nil {
				reason = err.Error()
			}
			return nil, &ContainerEnvsError{Path: path, Reason: "not a JSON object: " + reason}
		}
		var e ContainerEnv
		var gpu uint64
		for _, f := range []struct {
			key string
			raw json.RawMessage
			dst *uint64
		}{
			{"gpu", entry.GPU, &gpu},
			{"pod", entry.Pod, &e.PodUnits},
			{"container", entry.Container, &e.ContainerUnits},
			{"dev", entry.Dev, &e.DevUnits},
		} {
			if f.raw == nil {
				return nil, &ContainerEnvsError{Path: path + "." + f.key, Reason: "is missing"}
			}
			v, reason := parseDigits(string(bytes.TrimSpace(f.raw)), MaxUnits)
			if reason != "" {
				return nil, &ContainerEnvsError{Path: path + "." + f.key, Reason: clip(string(f.raw)) + " " + reason}
			}
			*f.dst = v
		}
		if gpu >= MaxGPUsPerNode {
			return nil, &ContainerEnvsError{Path: path + ".gpu", Reason: uintString(gpu) + " is outside [0, " + strconv.Itoa(MaxGPUsPerNode) + ")"}
		}
		e.GPUIndex = int(gpu)
		if entry.GPUs != nil {
			set, reason := parseGPUList(*entry.GPUs)
			if reason != "" {
				return nil, &ContainerEnvsError{Path: path + ".gpus", Reason: clip(*entry.GPUs) + " " + reason}
			}
			e.GPUs = set
		}
		e.DisableIsolation = entry.CGPUDisable != nil && *entry.CGPUDisable
		if err := decodeTier(path, entry, &e); err != nil {
			return nil, err
		}
		if err := validateContainerEnv(name, e); err != nil {
			return nil, err
		}
		out[name] = e
	}
	return out, nil
}
