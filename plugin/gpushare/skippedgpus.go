package gpushare

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
)

// ErrInvalidSkippedGPUs marks a malformed skipped-GPU list.
const ErrInvalidSkippedGPUs Error = "invalid skipped-GPU list"

// SkippedGPU is one element of AnnotationSkippedGPUs: a GPU of the node that
// the device plugin neither advertises nor counts, so that whoever wonders
// why a node shows fewer GPUs than it has finds the reason on the Node.
type SkippedGPU struct {
	Index  int    `json:"index"` // NVML index
	UUID   string `json:"uuid"`
	Model  string `json:"model"`
	Reason string `json:"reason"` // human-readable, e.g. that MIG mode is enabled
}

// SkippedGPUsError reports why a skipped-GPU list is invalid.
type SkippedGPUsError struct {
	Field  string // e.g. "[2].index"; empty for the whole value
	Reason string
}

// Error names the field and the reason.
func (e *SkippedGPUsError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("%s: %s", ErrInvalidSkippedGPUs, e.Reason)
	}
	return fmt.Sprintf("%s: %s: %s", ErrInvalidSkippedGPUs, e.Field, e.Reason)
}

// Unwrap returns ErrInvalidSkippedGPUs.
func (e *SkippedGPUsError) Unwrap() error { return ErrInvalidSkippedGPUs }

// ValidateSkippedGPUs checks what DecodeSkippedGPUs checks: at most
// MaxGPUsPerNode GPUs, unique indices in [0, MaxGPUsPerNode).
func ValidateSkippedGPUs(gpus []SkippedGPU) error {
	if len(gpus) > MaxGPUsPerNode {
		return &SkippedGPUsError{Reason: strconv.Itoa(len(gpus)) + " GPUs, more than " + strconv.Itoa(MaxGPUsPerNode)}
	}
	seen := map[int]bool{}
	for i, g := range gpus {
		field := "[" + strconv.Itoa(i) + "].index"
		if g.Index < 0 || g.Index >= MaxGPUsPerNode {
			return &SkippedGPUsError{Field: field, Reason: strconv.Itoa(g.Index) + " is outside [0, " + strconv.Itoa(MaxGPUsPerNode) + ")"}
		}
		if seen[g.Index] {
			return &SkippedGPUsError{Field: field, Reason: "index " + strconv.Itoa(g.Index) + " appears twice"}
		}
		seen[g.Index] = true
	}
	return nil
}

// EncodeSkippedGPUs validates gpus and writes them as a JSON array sorted by
// index, so an unchanged node never gets a spurious PATCH. It does not
// modify gpus.
func EncodeSkippedGPUs(gpus []SkippedGPU) (string, error) {
	if err := ValidateSkippedGPUs(gpus); err != nil {
		return "", err
	}
	b, err := json.Marshal(sortedSkipped(gpus))
	if err != nil {
		// Unreachable for a validated value; kept typed all the same.
		return "", &SkippedGPUsError{Reason: err.Error()}
	}
	return string(b), nil
}

// DecodeSkippedGPUs reads and validates a skipped-GPU list; the GPUs come
// back sorted by index and never nil. Unknown fields are ignored so an older
// reader accepts a newer plugin's additions. Failures are a
// *SkippedGPUsError (ErrInvalidSkippedGPUs).
func DecodeSkippedGPUs(s string) ([]SkippedGPU, error) {
	var gpus []SkippedGPU
	if err := json.Unmarshal([]byte(s), &gpus); err != nil {
		return nil, &SkippedGPUsError{Reason: "not a JSON array of GPUs: " + err.Error()}
	}
	if gpus == nil {
		// JSON null is no list at all, not an empty one.
		return nil, &SkippedGPUsError{Reason: "not a JSON array of GPUs: null"}
	}
	if err := ValidateSkippedGPUs(gpus); err != nil {
		return nil, err
	}
	return sortedSkipped(gpus), nil
}

// sortedSkipped returns a sorted, non-nil copy, leaving the caller's slice alone.
func sortedSkipped(gpus []SkippedGPU) []SkippedGPU {
	out := slices.Clone(gpus)
	if out == nil {
		out = []SkippedGPU{}
	}
	slices.SortFunc(out, func(a, b SkippedGPU) int { return a.Index - b.Index })
	return out
}
