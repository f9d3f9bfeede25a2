package allocator

import (
	"strconv"
	"strings"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

// Tier is a GPU's effective isolation tier (gpushare.Isolation) in one byte
// (Node.Tiers): the filter reads it for every GPU of every candidate node.
// The zero value is none, what a plugin older than tiers offers.
type Tier uint8

// The tiers a GPU can offer.
const (
	TierNone Tier = iota
	TierMPS
	TierHAMiCore
	// TierUnknown is a tier published by a plugin newer than this extender:
	// it offers nothing a pod can name here, and limits nothing.
	TierUnknown
	// TierFenced is a GPU whose configured tier is down (the plugin
	// publishes none with an isolationReason): its plugin refuses every
	// container there, so it offers nothing, not even to a pod asking any.
	TierFenced
)

// tierNames are the contract's names of the tiers, indexed by Tier.
var tierNames = [...]gpushare.Isolation{
	TierNone: gpushare.IsolationNone, TierMPS: gpushare.IsolationMPS, TierHAMiCore: gpushare.IsolationHAMiCore,
}

// TierOf reads a published tier; empty (an older plugin) is none.
func TierOf(t gpushare.Isolation) Tier {
	if t == "" {
		return TierNone
	}
	for i, name := range tierNames {
		if t == name {
			return Tier(i)
		}
	}
	return TierUnknown
}

// String is the tier's contract name, "unknown" for TierUnknown and what the
// plugin publishes, none, for TierFenced (its reason follows in reasons).
func (t Tier) String() string {
	switch {
	case int(t) < len(tierNames):
		return string(tierNames[t])
	case t == TierFenced:
		return string(gpushare.IsolationNone)
	}
	return "unknown"
}

// Limits reports whether the tier can enforce a compute share.
func (t Tier) Limits() bool { return t == TierMPS || t == TierHAMiCore }

// PodIsolation is what a pod's isolation annotations (gpushare.io/isolation,
// gpushare.io/compute-percent) ask of the GPUs it runs on. It takes two bytes
// because the cache keeps one per pod, and it is comparable because the
// hold-back rule compares it: the device plugin's answer depends on it, so it
// is part of a container's signature. The zero value asks for nothing: any
// tier, no compute share (every pod written before tiers existed).
type PodIsolation struct {
	need    uint8 // needAny, 1+Tier for that tier, or needUnreadable
	percent uint8 // 1-100; 0 when the pod sets none
}

const (
	needAny uint8 = 0
	// needUnreadable marks annotations that could not be read. Such a pod is
	// never placed; when one is bound already, its signature equals no
	// readable one, so no pod of a size it has goes beside it on a guess.
	needUnreadable uint8 = 0xff
)

// ReadPodIsolation reads a pod's isolation annotations: absent means any tier
// and no compute share. A compute share with a required tier of none is
// refused here, since no GPU could ever take the pod. On error the result is
// unreadable (Readable is false), which a bound pod's charge can still carry.
func ReadPodIsolation(annotations map[string]string) (PodIsolation, error) {
	unreadable := PodIsolation{need: needUnreadable}
	want, percent, err := gpushare.PodIsolationRequest(annotations)
	if err != nil {
		return unreadable, err
	}
	if want == gpushare.IsolationAny {
		return PodIsolation{need: needAny, percent: uint8(percent)}, nil
	}
	tier := TierOf(want)
	if tier == TierUnknown {
		// A tier the contract added after this extender was built.
		return unreadable, &gpushare.IsolationError{Field: gpushare.AnnotationIsolation, Value: string(want), Reason: "is not a tier this extender knows"}
	}
	return PodIsolation{need: 1 + uint8(tier), percent: uint8(percent)}, nil
}

// Tier is the required tier: any, none, mps or hami-core; empty when unreadable.
func (p PodIsolation) Tier() gpushare.Isolation {
	switch p.need {
	case needAny:
		return gpushare.IsolationAny
	case needUnreadable:
		return ""
	}
	return tierNames[p.need-1]
}

// ComputePercent is the compute share asked for, 0 for none.
func (p PodIsolation) ComputePercent() int { return int(p.percent) }

// Readable reports whether the annotations could be read.
func (p PodIsolation) Readable() bool { return p.need != needUnreadable }

// Any reports whether p asks nothing of a GPU's tier.
func (p PodIsolation) Any() bool { return p == PodIsolation{} }

// offers reports whether a GPU of tier t has the tier p requires.
func (p PodIsolation) offers(t Tier) bool {
	return t != TierFenced && (p.need == needAny || p.need == 1+uint8(t))
}

// allows reports whether a GPU of tier t can run the pod: t is the required
// tier (or any is required) and, for a compute share, t can limit it. Byte
// compares only: the filter asks this of every GPU of thousands of nodes.
func (p PodIsolation) allows(t Tier) bool { return p.offers(t) && (p.percent == 0 || t.Limits()) }

// usable reports whether a pod asking p may take g, GPU i of n, at all:
// healthy, and offering what p asks. Callers copy p out of the Request
// first: a local two-byte value stays in registers, and pods without
// annotations, nearly all, then cost one predictable branch per GPU (the
// filter asks this of every GPU of thousands of nodes; BenchmarkFilterCore).
func (p PodIsolation) usable(g GPU, n *Node, i int) bool {
	return g.Healthy && (n.Tiers == nil || n.Tiers[i] != TierFenced) && (p.Any() || p.allows(n.TierAt(i)))
}

// Usable reports whether a pod asking p may take GPU i (a position in
// n.GPUs) at all, the test Place applies to every GPU: healthy, not fenced,
// offering what p asks. Exported for kubectl inspect gpushare why, which
// explains a decision with the allocator's own rule.
func (p PodIsolation) Usable(n *Node, i int) bool { return p.usable(n.GPUs[i], n, i) }

// String describes p for reasons: `isolation "mps", compute-percent 30`.
func (p PodIsolation) String() string {
	if !p.Readable() {
		return "unreadable isolation annotations"
	}
	s := "isolation " + strconv.Quote(string(p.Tier()))
	if p.percent == 0 {
		return s + ", no compute-percent"
	}
	return s + ", compute-percent " + strconv.Itoa(int(p.percent))
}

// qualifier narrows "healthy GPU" in a reason to the GPUs p allows.
func (p PodIsolation) qualifier() string {
	switch {
	case p.need != needAny:
		return " offering isolation " + strconv.Quote(string(p.Tier()))
	case p.percent > 0:
		return " able to limit compute"
	}
	return ""
}

// unoffered says why no healthy GPU of n, which has one, can run a pod
// asking p (Place calls it when none can). The reason lists each GPU's
// effective tier and why it fell back, since that is what an operator must fix.
func (p PodIsolation) unoffered(n *Node) string {
	if !p.Readable() {
		// NewRequest refuses such a pod; a caller that built one is told so.
		return "the pod's isolation annotations are unreadable"
	}
	offered := false
	for i, g := range n.GPUs {
		offered = offered || g.Healthy && p.offers(n.TierAt(i))
	}
	if offered {
		return "no GPU can enforce " + gpushare.AnnotationComputePercent + " " + strconv.Itoa(int(p.percent)) +
			", which needs isolation mps or hami-core (" + describeTiers(n) + ")"
	}
	return "no GPU offers isolation " + strconv.Quote(string(p.Tier())) + " (" + describeTiers(n) + ")"
}

// describeTiers lists each GPU's effective tier, unhealthy mark and fallback
// reason, GPUs that read the same grouped: "GPU 0: none, MPS control daemon
// not answering; GPUs 1, 2: none".
func describeTiers(n *Node) string {
	var order []string
	byText := map[string][]string{}
	for i, g := range n.GPUs {
		text := n.TierAt(i).String()
		if !g.Healthy {
			text += ", unhealthy"
		}
		if why := n.IsolationReasons[g.Index]; why != "" {
			text += ", " + why
		}
		if _, seen := byText[text]; !seen {
			order = append(order, text)
		}
		byText[text] = append(byText[text], strconv.Itoa(g.Index))
	}
	parts := make([]string, 0, len(order))
	for _, text := range order {
		label := "GPU "
		if len(byText[text]) > 1 {
			label = "GPUs "
		}
		parts = append(parts, label+strings.Join(byText[text], ", ")+": "+text)
	}
	return strings.Join(parts, "; ")
}
