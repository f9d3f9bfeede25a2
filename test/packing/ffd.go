package packing

import (
	"cmp"
	"slices"
)

// FFDResult is what an offline first-fit-decreasing placement achieved.
type FFDResult struct {
	PlacedGiB uint64 `json:"placed_gib"`
	Placed    int    `json:"placed"`
	Unplaced  int    `json:"unplaced"`
	BinsUsed  int    `json:"cards_used"`
}

// sizeCount is how many items of one size there are.
type sizeCount struct {
	size  uint64
	count int
}

// FFD packs items into empty bins the classic way: largest item first, each
// into the first bin (in the given order) with room; an item no bin holds is
// left out and packing goes on with the next. Bins are GPUs, items pods.
func FFD(bins, items []uint64) FFDResult {
	counts := map[uint64]int{}
	for _, s := range items {
		counts[s]++
	}
	return ffdCounts(bins, countsOf(counts))
}

// countsOf turns a size histogram into its non-empty sizes, largest first.
func countsOf(h map[uint64]int) []sizeCount {
	out := make([]sizeCount, 0, len(h))
	for s, c := range h {
		if c > 0 {
			out = append(out, sizeCount{s, c})
		}
	}
	slices.SortFunc(out, func(a, b sizeCount) int { return cmp.Compare(b.size, a.size) })
	return out
}

// ffdCounts is FFD over items given as counts per size, largest size first.
// Items of one size go through the bins once: the first bin with room for
// that size only moves forward while they are placed, so the cost is
// O(distinct sizes x bins + items).
func ffdCounts(bins []uint64, items []sizeCount) FFDResult {
	free := slices.Clone(bins)
	used := make([]bool, len(bins))
	var r FFDResult
	for _, it := range items {
		b := 0
		for n := 0; n < it.count; n++ {
			for b < len(free) && free[b] < it.size {
				b++
			}
			if b == len(free) {
				r.Unplaced += it.count - n
				break
			}
			free[b] -= it.size
			if it.size > 0 && !used[b] {
				used[b] = true
				r.BinsUsed++
			}
			r.Placed++
			r.PlacedGiB += it.size
		}
	}
	return r
}

// FFDPrefix returns the longest prefix of items (in their given order) that
// FFD packs whole, and that packing. FFD is not monotone in general (a
// longer list can pack where a shorter one does not), so this is found by
// bisection between a prefix that packs and one that does not: the prefix
// returned packs and the next one does not.
func FFDPrefix(bins, items []uint64) (int, FFDResult) {
	return bisectPrefix(len(items), func(k int) (bool, FFDResult) {
		r := FFD(bins, items[:k])
		return r.Unplaced == 0, r
	})
}

// bisectPrefix returns the largest k in [0, n] for which packs reports true
// (n itself when it does), by bisection between a k that packs and one that
// does not, and packs' result for it.
func bisectPrefix(n int, packs func(k int) (bool, FFDResult)) (int, FFDResult) {
	if ok, r := packs(n); ok {
		return n, r
	}
	lo, hi := 0, n // lo packs, hi does not
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if ok, _ := packs(mid); ok {
			lo = mid
		} else {
			hi = mid
		}
	}
	_, r := packs(lo)
	return lo, r
}

// Fragmented returns the free memory that no pending request can use: the
// free GiB of every GPU with less free than the smallest pending request.
// With nothing pending nothing is wanted, and it is zero.
func Fragmented(free []uint64, smallestPending uint64) uint64 {
	var out uint64
	for _, f := range free {
		if f < smallestPending {
			out += f
		}
	}
	return out
}

// SizeShare is one request size and the share of pods that ask for it.
type SizeShare struct {
	GiB   uint64
	Share float64
}

// SizeShares returns the workload's sizes and their shares, smallest first.
// A multi-GPU pod counts as its share of one GPU (Pod.PerGPU).
func SizeShares(pods []Pod) []SizeShare {
	h := map[uint64]int{}
	for _, p := range pods {
		h[p.PerGPU()]++
	}
	out := make([]SizeShare, 0, len(h))
	for _, sc := range countsOf(h) {
		out = append(out, SizeShare{GiB: sc.size, Share: float64(sc.count) / float64(len(pods))})
	}
	slices.Reverse(out)
	return out
}

// Stranded returns the free memory a new pod of the workload could not use,
// in expectation over its sizes: the sum over sizes s of share(s) times
// Fragmented(free, s). Unlike Fragmented it does not depend on what happens
// to wait, so it tells policies apart even when every policy keeps pods
// waiting (then Fragmented is all the free memory, for every policy).
func Stranded(free []uint64, sizes []SizeShare) float64 {
	var out float64
	for _, s := range sizes {
		out += s.Share * float64(Fragmented(free, s.GiB))
	}
	return out
}
