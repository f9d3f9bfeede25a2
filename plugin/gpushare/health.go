package gpushare

import (
	"slices"
	"strings"
)

// ParseUnhealthyGPUs reads the value of the unhealthy-GPU ConfigMap key, e.g.
// "0,2". People write it by hand, so spaces around items, empty items and
// repeats are tolerated; the result is sorted and without repeats, and the
// empty value is the empty list. An item that is not a GPU index in
// [0, MaxGPUsPerNode) is a *GPUListError (ErrInvalidGPUList); the indices read
// before it are still returned, so a caller can keep avoiding those GPUs.
func ParseUnhealthyGPUs(s string) ([]int, error) {
	var out []int
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		idx, reason := parseGPUIndex(item)
		if reason != "" {
			return tidy(out), &GPUListError{Item: item, Reason: reason}
		}
		out = append(out, idx)
	}
	return tidy(out), nil
}

// FormatUnhealthyGPUs writes indices as ParseUnhealthyGPUs reads them:
// ascending, without repeats, comma-separated, no spaces.
func FormatUnhealthyGPUs(indices []int) string {
	return formatInts(tidy(slices.Clone(indices)))
}

// tidy sorts and removes repeats in place.
func tidy(ns []int) []int {
	slices.Sort(ns)
	return slices.Compact(ns)
}
