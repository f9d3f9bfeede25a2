package allocator

import (
	"slices"
	"strings"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

// placeMulti places a multi-GPU pod (r.GPUs.Count > 1): one set of Count
// GPUs, each holding r.Units / Count, chosen by ChooseSet. The placement
// policy does not apply: a set is chosen by its links first and then by best
// fit, whatever the policy. Every GPU of the set has one effective isolation
// tier, since the device plugin answers a container with one tier; the
// groups of GPUs by tier are tried in the order of their lowest index. The
// hold-back rule applies to the set as a whole: an in-flight container of
// one of r's sizes forces its GPUs, which must then be a set of Count GPUs
// that fits.
func placeMulti(n *Node, r Request, cons map[uint64]constraint) (Placement, *Unfit) {
	m := r.GPUs.Count
	per := r.Units / uint64(m)
	forced, why := forcedSet(cons, r.Containers)
	switch {
	case why != "":
		return Placement{}, &Unfit{Reason: why, Waiting: true}
	case forced != 0:
		return placeForced(n, r, cons, forced, per)
	}
	groups := tierGroups(n, r)
	var reasons []string
	unresolvable := true
	for _, t := range groups {
		usable := func(i int) bool { return r.Isolation.usable(n.GPUs[i], n, i) && n.TierAt(i) == t }
		pos, unfit := ChooseSet(n.GPUs, usable, n.Links, m, per, r.GPUs.LinksRequired)
		if unfit == nil {
			return setPlacement(n, pos), nil
		}
		unresolvable = unresolvable && unfit.Unresolvable
		if len(groups) > 1 {
			unfit.Reason = "among the GPUs of isolation tier " + t.String() + ": " + unfit.Reason
		}
		reasons = append(reasons, unfit.Reason)
	}
	return Placement{}, &Unfit{Reason: strings.Join(reasons, "; "), Unresolvable: unresolvable}
}

// tierGroups lists the effective tiers of the GPUs r may use, by their
// lowest GPU: one group on nodes without tiers.
func tierGroups(n *Node, r Request) []Tier {
	var out []Tier
	for i, g := range n.GPUs {
		if t := n.TierAt(i); r.Isolation.usable(g, n, i) && !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	return out
}

// forcedSet returns the GPUs the hold-back rule forces on every container of
// a multi-GPU pod (0 when none), or why the node must wait: a size is
// blocked, or two sizes are forced onto different GPUs.
func forcedSet(cons map[uint64]constraint, containers []gpushare.ContainerRequest) (gpushare.GPUSet, string) {
	var forced gpushare.GPUSet
	for _, c := range containers {
		k, ok := cons[c.Units]
		switch {
		case !ok || k.gpus == 0 && k.blocked == "":
			continue
		case k.blocked != "":
			return 0, k.blocked
		case forced != 0 && forced != k.gpus:
			return 0, blockedOn(cons, containers, forced)
		}
		forced = k.gpus
	}
	return forced, ""
}

// placeForced places r on forced, the set the hold-back rule leaves it, when
// that is a set r may have: Count GPUs of the node, of one tier r may use,
// each with per units free, all NVLink-connected when r requires it.
// Otherwise r waits for the in-flight pod that holds the set.
func placeForced(n *Node, r Request, cons map[uint64]constraint, forced gpushare.GPUSet, per uint64) (Placement, *Unfit) {
	wait := &Unfit{Reason: blockedOn(cons, r.Containers, 0), Waiting: true}
	if forced.Len() != r.GPUs.Count {
		return Placement{}, wait
	}
	pos := make([]int, 0, forced.Len())
	for i, g := range n.GPUs {
		if !forced.Has(g.Index) {
			continue
		}
		if !r.Isolation.usable(g, n, i) || g.Free() < per || len(pos) > 0 && n.TierAt(i) != n.TierAt(pos[0]) {
			return Placement{}, wait
		}
		for _, j := range pos {
			if r.GPUs.LinksRequired && !n.Links.NVLink(i, j) {
				return Placement{}, wait
			}
		}
		pos = append(pos, i)
	}
	if len(pos) != forced.Len() {
		return Placement{}, wait
	}
	return setPlacement(n, pos), nil
}

// setPlacement is the placement on the GPUs at positions pos (ascending).
func setPlacement(n *Node, pos []int) Placement {
	var set gpushare.GPUSet
	for _, i := range pos {
		set |= gpushare.NewGPUSet(n.GPUs[i].Index)
	}
	return Placement{Home: n.GPUs[pos[0]].Index, Set: set, DevUnits: n.GPUs[pos[0]].Units}
}
