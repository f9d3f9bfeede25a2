package gpushare

import (
	"math/bits"
	"strings"
)

// GPUSet is a set of GPU indices of one node, in [0, MaxGPUsPerNode): the
// GPUs a multi-GPU container runs on (issue 15). Its order is ascending
// index, the order NVIDIA_VISIBLE_DEVICES lists them in, so "the ordered GPU
// set" of the race-free signature is the set itself. A bit per index keeps it
// a comparable value: answers that hold one compare with ==.
type GPUSet uint64

// Bits per GPUSet: MaxGPUsPerNode must not exceed it.
const _ = uint(64 - MaxGPUsPerNode)

// NewGPUSet returns the set of indices; indices outside [0, MaxGPUsPerNode)
// are left out (callers validate them first).
func NewGPUSet(indices ...int) GPUSet {
	var s GPUSet
	for _, g := range indices {
		if g >= 0 && g < MaxGPUsPerNode {
			s |= 1 << uint(g)
		}
	}
	return s
}

// Has reports whether g is in s.
func (s GPUSet) Has(g int) bool { return g >= 0 && g < MaxGPUsPerNode && s&(1<<uint(g)) != 0 }

// Len is the number of GPUs in s.
func (s GPUSet) Len() int { return bits.OnesCount64(uint64(s)) }

// First is the lowest index in s, -1 when s is empty.
func (s GPUSet) First() int {
	if s == 0 {
		return -1
	}
	return bits.TrailingZeros64(uint64(s))
}

// Indices lists s ascending.
func (s GPUSet) Indices() []int {
	out := make([]int, 0, s.Len())
	for v := uint64(s); v != 0; v &= v - 1 {
		out = append(out, bits.TrailingZeros64(v))
	}
	return out
}

// String lists s as NVIDIA_VISIBLE_DEVICES does: "0,1".
func (s GPUSet) String() string { return formatInts(s.Indices()) }

// parseGPUList reads "i,j,..." (ascending, no repeats, each a GPU index):
// the form String writes.
func parseGPUList(v string) (GPUSet, string) {
	var s GPUSet
	last := -1
	for _, part := range strings.Split(v, ",") {
		g, reason := parseGPUIndex(part)
		if reason != "" {
			return 0, "has " + clip(part) + ", which " + reason
		}
		if g <= last {
			return 0, "is not in ascending order without repeats"
		}
		last = g
		s |= 1 << uint(g)
	}
	return s, ""
}
