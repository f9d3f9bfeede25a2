package allocate

import (
	"errors"
	"fmt"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

// ErrIsolationDown marks an Allocate call refused because the isolation tier
// its GPU is configured for is down: answering would start the container
// without the limit its node promises.
var ErrIsolationDown = errors.New("isolation tier unavailable")

// IsolationDownError names the GPU, its tier and why the tier is down.
type IsolationDownError struct {
	Node      string
	GPU       int
	Tier      gpushare.Isolation // "" when the node's configured tier is unknown (an invalid label)
	Reason    string
	Container string // namespace/name/container refused
}

func (e *IsolationDownError) Error() string {
	tier := "its isolation tier"
	if e.Tier != "" {
		tier = fmt.Sprintf("isolation tier %q", e.Tier)
	}
	return fmt.Sprintf("gpushare: %v: GPU %d of node %q is configured for %s, which is down: %s; "+
		"refusing %s rather than start it without its memory limit (it is retried when the pod is created again)",
		ErrIsolationDown, e.GPU, e.Node, tier, e.Reason, e.Container)
}

// Unwrap returns ErrIsolationDown.
func (e *IsolationDownError) Unwrap() error { return ErrIsolationDown }

// tierUp refuses decision d when one of its GPUs' tier is down. It looks at
// the GPUs only, never at the pod: every candidate of a call on that GPU is
// refused alike, so the refusal is right whichever of them the kubelet is
// serving.
func tierUp(in Input, d Decision) error {
	for _, g := range d.Env.Set().Indices() {
		if s := in.Isolation[g]; s.Down {
			return &IsolationDownError{Node: in.Node, GPU: g, Tier: s.Tier, Reason: s.Reason,
				Container: d.Pod.Namespace + "/" + d.Pod.Name + "/" + d.Container.Name}
		}
	}
	return nil
}

// checkTiers says why a pod cannot be served on its GPUs' tiers: a
// malformed isolation annotation, a multi-GPU container on GPUs of different
// tiers, a required tier a GPU is not configured for, or a compute share on a
// tier that cannot enforce it. A GPU whose
// tier is down is not checked: every call on it is refused (tierUp), and
// that refusal, naming why the tier is down, is the one that helps.
func checkTiers(in Input, info *podInfo, sets []gpushare.GPUSet) string {
	if info.tierProblem != "" {
		return info.tierProblem
	}
	if reason := mixedTiers(in, sets); reason != "" {
		return reason
	}
	var all gpushare.GPUSet
	for _, s := range sets {
		all |= s
	}
	for _, g := range all.Indices() {
		s := in.Isolation[g]
		if s.Down {
			continue
		}
		tier := s.Tier
		switch {
		case !tier.Offers(info.tier):
			return fmt.Sprintf("it requires isolation tier %q (%s) and GPU %d of this node is configured for %q",
				info.tier, gpushare.AnnotationIsolation, g, tier.OrNone())
		case info.percent > 0 && !tier.Limits():
			return fmt.Sprintf("it asks for %d%% of a GPU's compute (%s) and GPU %d's isolation tier %q cannot limit compute",
				info.percent, gpushare.AnnotationComputePercent, g, tier.OrNone())
		}
	}
	return ""
}

// mixedTiers says why a container on several GPUs cannot be served when
// they are configured for different tiers: its one answer carries one
// tier's limits. The extender never chooses such a set; a GPU whose tier
// changed since, or a hand-written assignment, can still name one.
func mixedTiers(in Input, sets []gpushare.GPUSet) string {
	for _, s := range sets {
		gs := s.Indices()
		for _, g := range gs[min(1, len(gs)):] {
			if a, b := in.Isolation[gs[0]].Tier, in.Isolation[g].Tier; a != b {
				return fmt.Sprintf("its GPUs %s are configured for different isolation tiers (GPU %d %q, GPU %d %q)", s, gs[0], a.OrNone(), g, b.OrNone())
			}
		}
	}
	return ""
}
