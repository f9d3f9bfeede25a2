package allocate

import (
	"errors"
	"fmt"
	"slices"

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

// tierUp refuses decision d when its GPU's tier is down. It looks at the
// GPU only, never at the pod: every candidate of a call on that GPU is
// refused alike, so the refusal is right whichever of them the kubelet is
// serving.
func tierUp(in Input, d Decision) error {
	s := in.Isolation[d.Env.GPUIndex]
	if !s.Down {
		return nil
	}
	return &IsolationDownError{Node: in.Node, GPU: d.Env.GPUIndex, Tier: s.Tier, Reason: s.Reason,
		Container: d.Pod.Namespace + "/" + d.Pod.Name + "/" + d.Container.Name}
}

// checkTiers says why a pod cannot be served on its GPUs' tiers: a
// malformed isolation annotation, a required tier a GPU is not configured
// for, or a compute share on a tier that cannot enforce it. A GPU whose
// tier is down is not checked: every call on it is refused (tierUp), and
// that refusal, naming why the tier is down, is the one that helps.
func checkTiers(in Input, info *podInfo, gpus []int) string {
	if info.tierProblem != "" {
		return info.tierProblem
	}
	seen := make([]int, 0, 1)
	for _, g := range gpus {
		if slices.Contains(seen, g) {
			continue
		}
		seen = append(seen, g)
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
