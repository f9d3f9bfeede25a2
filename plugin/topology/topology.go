// Package topology turns what NVML says about how a node's GPUs are
// connected into one score per pair, published in gpushare.io/gpus
// (gpushare.GPULink) for the extender to choose well connected GPU sets.
// It is pure: no NVML, no I/O.
//
// # Scale
//
// A pair's score is its PCIe score plus 100 per NVLink link between the two,
// the scheme of NVIDIA's go-gpuallocator (gpuallocator/besteffort_policy.go,
// calculateGPUPairScore), written afresh here:
//
//	PCIe common ancestor (nvmlDeviceGetTopologyCommonAncestor)   score
//	SYSTEM     across CPU sockets (SMP interconnect)               10
//	NODE       same NUMA node, different host bridges             20
//	HOSTBRIDGE same host bridge                                   30
//	MULTIPLE   through several PCIe switches                      40
//	SINGLE     through one PCIe switch                            50
//	INTERNAL   same board (dual-GPU cards)                        60
//	unknown    NVML could not say                                  0
//	each NVLink link                                            +100
//
// So any NVLink beats any PCIe path, and more links beat fewer.
//
// NVSwitch systems (DGX/HGX A100, H100, H200, B200) connect every GPU's links
// to NVSwitches, not to other GPUs, so counting links that end at the other
// GPU finds none. As HAMi does, such GPUs count as all connected: two GPUs
// that both have active links to a switch get, as NVLinks, the smaller of
// their two switch link counts (18 on a healthy DGX H100, so every pair
// scores the same), added to any direct links between them.
package topology

import (
	"slices"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

// Level is the closest PCIe ancestor two GPUs share, best last.
type Level int

// Levels, ordered worst to best; LevelUnknown when NVML cannot say.
const (
	LevelUnknown Level = iota
	LevelSystem
	LevelNode
	LevelHostBridge
	LevelMultiple
	LevelSingle
	LevelInternal
)

// String is NVML's name of the level.
func (l Level) String() string {
	switch l {
	case LevelSystem:
		return "SYSTEM"
	case LevelNode:
		return "NODE"
	case LevelHostBridge:
		return "HOSTBRIDGE"
	case LevelMultiple:
		return "MULTIPLE"
	case LevelSingle:
		return "SINGLE"
	case LevelInternal:
		return "INTERNAL"
	default:
		return "UNKNOWN"
	}
}

// Scores of the scale (package comment).
const (
	ScorePerNVLink = 100
	scorePerLevel  = 10 // LevelSystem 10, LevelNode 20, ... LevelInternal 60
)

// LevelScore is the PCIe part of a pair's score.
func LevelScore(l Level) int {
	if l < LevelSystem || l > LevelInternal {
		return 0
	}
	return int(l) * scorePerLevel
}

// GPU is one GPU's part of a reading.
type GPU struct {
	Index    int    // NVML index
	PCIBusID string // NVML's form, "00000000:1B:00.0"
	NUMANode int    // -1 when unknown
	// SwitchLinks is the number of its active NVLink links that end at an
	// NVSwitch (or at anything that is not one of the node's GPUs).
	SwitchLinks int
}

// Pair is what NVML says about two GPUs, A < B.
type Pair struct {
	A, B    int
	Level   Level
	NVLinks int // active links from A that end at B
}

// Reading is a node's topology as read from NVML.
type Reading struct {
	GPUs  []GPU
	Pairs []Pair
}

// PairScore scores a pair whose NVLink count is already complete.
func PairScore(level Level, nvlinks int) int {
	return LevelScore(level) + ScorePerNVLink*max(nvlinks, 0)
}

// NVSwitch reports whether every GPU of r (two at least) reaches an NVSwitch.
func (r Reading) NVSwitch() bool {
	if len(r.GPUs) < 2 {
		return false
	}
	for _, g := range r.GPUs {
		if g.SwitchLinks <= 0 {
			return false
		}
	}
	return true
}

// Links scores every pair of GPUs in r: one GPULink per pair of GPUs listed
// in r.GPUs (A < B, sorted by A then B). A pair r.Pairs does not mention
// scores as unknown PCIe without direct links; pairs naming GPUs r.GPUs does
// not list are dropped. Never nil when r has two GPUs or more.
func Links(r Reading) []gpushare.GPULink {
	gpus := slices.Clone(r.GPUs)
	slices.SortFunc(gpus, func(a, b GPU) int { return a.Index - b.Index })
	gpus = slices.CompactFunc(gpus, func(a, b GPU) bool { return a.Index == b.Index })
	type key struct{ a, b int }
	pairs := make(map[key]Pair, len(r.Pairs))
	for _, p := range r.Pairs {
		if p.A > p.B {
			p.A, p.B = p.B, p.A
		}
		pairs[key{p.A, p.B}] = p
	}
	var out []gpushare.GPULink
	for i, a := range gpus {
		for _, b := range gpus[i+1:] {
			p := pairs[key{a.Index, b.Index}]
			n := max(p.NVLinks, 0)
			if a.SwitchLinks > 0 && b.SwitchLinks > 0 {
				n += min(a.SwitchLinks, b.SwitchLinks)
			}
			out = append(out, gpushare.GPULink{A: a.Index, B: b.Index, Score: PairScore(p.Level, n), NVLinks: n})
		}
	}
	return out
}
