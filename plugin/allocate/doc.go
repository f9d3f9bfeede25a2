// Package allocate decides, without any I/O, which container a kubelet
// Allocate call is for and what environment it gets, and computes the
// annotations the plugin writes back on the pod.
//
// The kubelet's call carries only device IDs, and the kubelet picks those
// among the free ones itself, so their number (the container's units) is the
// only information in it. Match applies the plugin's rule of the race-free
// argument (docs/design.md, "Race-free Allocate", rule 3): among the node's
// in-flight pods, the not-yet-served containers of exactly that many units,
// ordered by assume time, then init containers before regular ones in spec
// order; the first one gets its environment. Together with the extender's
// rule (equal sizes among in-flight pods have equal signatures) whichever of
// them the kubelet is really serving gets exactly the GPU and limits its own
// pod's annotations name. When the candidates' signatures differ (the
// extender's rule was not followed, e.g. an old extender), Match still answers
// as the old gpushare did but reports the conflict so the caller can warn.
//
// Two more rules live here, also without I/O: Match refuses a call whose GPU
// the node's pods together over-commit (OvercommitError, the node's own check
// behind the extender's accounting), and Repairs lists the records missing on
// pods whose containers the kubelet has started. A Memo keeps each pod decoded
// until its resourceVersion changes.
//
// Isolation tiers (tier.go): each answer carries its GPU's configured tier
// and its pod's compute share, which are part of the signature like the
// units; a pod whose required tier or compute share its GPU cannot give is
// not a candidate; and a call on a GPU whose tier is down is refused
// (IsolationDownError) whichever pod it is for, never answered without the
// limit.
//
// Every ambiguity rule lives here and is table-tested.
package allocate
