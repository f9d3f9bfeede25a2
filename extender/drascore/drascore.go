// Package drascore scores a node for a pod's gpu-mem.gpushare.io claims as
// the extender's policies score a device-plugin pod's placement.
//
// In DRA mode kube-scheduler's structured allocator picks the GPUs inside a
// node (the first devices in slice order with room), and none of its scores
// sees a device's consumable capacity: every node where the claim fits
// scores the same, so the node is a random one of them (docs/dra.md, the
// packing tables). gpushare-scheduler's Score closes that gap with this
// package: it predicts the devices the allocator will take on the node
// (Predict, checked against the real allocator in packbench's tests) and
// scores how full they end, the extender's bestfit; a multi-GPU claim
// scores a node where those devices share one NVLink domain above any where
// they do not, since the allocator cannot be told to prefer it.
//
// The score is a preference only: what fits is still the allocator's call
// in Filter, so a wrong prediction costs packing, never a GPU's memory.
package drascore

import (
	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

// MaxScore is the top score, kube-scheduler's MaxNodeScore.
const MaxScore = 100

// Device is one GPU of a node, in the allocator's order.
type Device struct {
	// Pool and Name identify it in its driver's ResourceSlices.
	Pool, Name string
	// Capacity and Consumed are its memory and what allocated claims hold
	// of it, in bytes.
	Capacity, Consumed int64
	// Domain is its NVLink domain attribute; empty when unknown.
	Domain string
	// Tier is its isolation attribute.
	Tier gpushare.Isolation
	// Usable is false for a device with a NoSchedule or NoExecute taint,
	// which no claim of ours tolerates.
	Usable bool
}

// Request is one request of a claim: Bytes on each of Count distinct GPUs,
// of Tier (IsolationAny: any tier).
type Request struct {
	Bytes int64
	Count int
	Tier  gpushare.Isolation
}

// Claim is what a pod's gpu-mem claims ask of one node.
type Claim struct {
	Requests []Request
	// OneGPU keeps every request on one GPU (matchAttribute on the uuid).
	OneGPU bool
	// OneDomain keeps every GPU in one NVLink domain (matchAttribute on
	// the domain).
	OneDomain bool
	// PreferDomain asks for OneDomain first and, where that does not fit,
	// for any GPUs (a request of two alternatives, the webhook's form for
	// topology preferred).
	PreferDomain bool
}

// Predict returns the positions in devs of the devices the allocator takes
// for each request of c, or false where c does not fit. The allocator
// searches depth first in device order: each request takes the first
// devices with room, distinct within the request, and a device may serve
// several requests while its memory lasts; with OneDomain, the first domain
// (by its first device) where the whole claim fits; with PreferDomain, that
// where some domain fits, else as without it.
func Predict(devs []Device, c Claim) ([][]int, bool) {
	if c.PreferDomain {
		linked := c
		linked.OneDomain, linked.PreferDomain = true, false
		if set, ok := Predict(devs, linked); ok {
			return set, true
		}
	}
	if !c.OneDomain {
		return predictIn(devs, c, "")
	}
	tried := map[string]bool{}
	for _, d := range devs {
		if d.Domain == "" || tried[d.Domain] {
			continue
		}
		tried[d.Domain] = true
		if set, ok := predictIn(devs, c, d.Domain); ok {
			return set, true
		}
	}
	return nil, false
}

// predictIn is Predict within domain ("" any device).
func predictIn(devs []Device, c Claim, domain string) ([][]int, bool) {
	left := make([]int64, len(devs))
	for i, d := range devs {
		left[i] = d.Capacity - d.Consumed
	}
	eligible := func(i int, r Request) bool {
		d := devs[i]
		return d.Usable && (domain == "" || d.Domain == domain) && (r.Tier == gpushare.IsolationAny || r.Tier == "" || d.Tier == r.Tier)
	}
	out := make([][]int, len(c.Requests))
	if c.OneGPU {
		for i := range devs {
			if fitsAll(i, left[i], c.Requests, eligible) {
				for k := range out {
					out[k] = []int{i}
				}
				return out, true
			}
		}
		return nil, false
	}
	for k, r := range c.Requests {
		for i := 0; i < len(devs) && len(out[k]) < r.Count; i++ {
			if eligible(i, r) && left[i] >= r.Bytes {
				out[k] = append(out[k], i)
				left[i] -= r.Bytes
			}
		}
		if len(out[k]) < r.Count {
			return nil, false
		}
	}
	return out, true
}

// fitsAll reports whether device i, with left bytes free, takes every
// request (each of one GPU) at once.
func fitsAll(i int, left int64, reqs []Request, eligible func(int, Request) bool) bool {
	for _, r := range reqs {
		if r.Count != 1 || !eligible(i, r) || left < r.Bytes {
			return false
		}
		left -= r.Bytes
	}
	return true
}

// Score is the node's score for c under policy, in 0-MaxScore, and false
// where c does not fit (the allocator's Filter then rejects the node). Best
// fit scores how full the predicted devices end, spread how empty, first fit
// every fitting node alike; a claim on several GPUs scores a node whose
// predicted devices share one NVLink domain in the upper half, others in
// the lower.
func Score(devs []Device, c Claim, policy allocator.Policy) (int64, bool) {
	set, ok := Predict(devs, c)
	if !ok {
		return 0, false
	}
	return ScorePredicted(devs, c, set, policy), true
}

// ScorePredicted is Score for the devices Predict returned, for a caller
// that keeps the prediction too.
func ScorePredicted(devs []Device, c Claim, set [][]int, policy allocator.Policy) int64 {
	if policy == allocator.FirstFit {
		return MaxScore
	}
	added := map[int]int64{}
	for k, positions := range set {
		for _, i := range positions {
			added[i] += c.Requests[k].Bytes
		}
	}
	var used, size int64
	domains := map[string]bool{}
	for i, b := range added {
		used += devs[i].Consumed + b
		size += devs[i].Capacity
		domains[devs[i].Domain] = true
	}
	if size <= 0 {
		return 0
	}
	full := min(used, size) * MaxScore / size
	if policy == allocator.Spread {
		full = MaxScore - full
	}
	if len(added) < 2 {
		return full
	}
	if len(domains) == 1 && !domains[""] {
		return MaxScore/2 + full/2
	}
	return full / 2
}
