package allocate

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/inventory"
	"github.com/gpushare/gpushare/plugin/isolation"
)

// ErrNoMatch marks an Allocate call that no in-flight container matches.
var ErrNoMatch = errors.New("no pending pod matches this allocation")

// ErrInvalidRequest marks an Allocate call the kubelet cannot have meant, such as zero devices.
var ErrInvalidRequest = errors.New("invalid allocate request")

// Served is the in-memory record of containers already given their
// environment, by pod UID then container name. It covers the time between an
// answer and the moment the pod's record annotation reaches the informer.
type Served map[types.UID]map[string]gpushare.ContainerEnv

// Add records that container of pod uid got env.
func (s Served) Add(uid types.UID, container string, env gpushare.ContainerEnv) {
	if s[uid] == nil {
		s[uid] = map[string]gpushare.ContainerEnv{}
	}
	s[uid][container] = env
}

// clone copies s two levels deep.
func (s Served) clone() Served {
	out := make(Served, len(s))
	for uid, m := range s {
		out[uid] = make(map[string]gpushare.ContainerEnv, len(m))
		for k, v := range m {
			out[uid][k] = v
		}
	}
	return out
}

// Input is everything Match looks at.
type Input struct {
	Node             string               // this node's name, for messages and the spec.nodeName check
	Inventory        *inventory.Inventory // this node's GPUs
	DisableIsolation bool                 // the node's cgpu.disable.isolation label
	Pods             []*corev1.Pod        // pods bound to this node; read only
	Served           Served               // containers served but maybe not yet visible on the pods; read only
	// Memo keeps decoded pods between calls; nil decodes every pod on every call.
	Memo *Memo
	// Isolation is each GPU's tier by index, read only. A GPU without one
	// has no tier: its answers carry no GPUSHARE_ISOLATION (the seed's), and
	// it offers only none.
	Isolation map[int]isolation.Status
}

// Decision is the answer for one container of an Allocate call.
type Decision struct {
	Pod       *corev1.Pod               // the pod, as given in Input.Pods; read only
	Container gpushare.ContainerRequest // the container served
	Env       gpushare.ContainerEnv     // what it gets
	// Conflicts lists the other candidates (namespace/name/container) that a
	// call of this size could also be for but whose environment would differ:
	// the extender's rule was broken and the answer may be for the wrong pod.
	Conflicts []string
}

// Skipped is a pod with gpu-mem on this node that cannot be served, and why.
type Skipped struct {
	Pod    string // namespace/name
	Reason string
}

// NoMatchError explains a call that matches no container.
type NoMatchError struct {
	Node    string
	Units   uint64
	Unit    gpushare.Unit
	Waiting []string  // in-flight containers of other sizes, "namespace/name/container=units"
	Skipped []Skipped // pods that might have been meant but cannot be served
}

// Error says what was asked, what is waiting and what was skipped, so a
// user reading the pod's UnexpectedAdmissionError can act on it.
func (e *NoMatchError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "gpushare: %v: no pod bound to node %q waits for a container of %d %s units of %s",
		ErrNoMatch, e.Node, e.Units, e.Unit, gpushare.ResourceName)
	if len(e.Skipped) == 0 && len(e.Waiting) == 0 {
		b.WriteString("; the pod is not bound with gpushare annotations for this node, or was already served (deleted and re-created pods must be re-scheduled)")
	}
	for i, s := range e.Skipped {
		if i == 3 {
			fmt.Fprintf(&b, "; and %d more pods cannot be served", len(e.Skipped)-i)
			break
		}
		fmt.Fprintf(&b, "; pod %s cannot be served: %s", s.Pod, s.Reason)
	}
	if len(e.Waiting) > 0 {
		shown := e.Waiting[:min(len(e.Waiting), 5)]
		fmt.Fprintf(&b, "; containers waiting with other sizes: %s", strings.Join(shown, ", "))
		if len(e.Waiting) > len(shown) {
			fmt.Fprintf(&b, " and %d more", len(e.Waiting)-len(shown))
		}
	}
	return b.String()
}

// Unwrap returns ErrNoMatch.
func (e *NoMatchError) Unwrap() error { return ErrNoMatch }

// candidate is an in-flight pod with the containers it still needs served.
type candidate struct {
	pod    *corev1.Pod
	order  int64                       // assume time, or creation time for pods without one
	reqs   []gpushare.ContainerRequest // every gpu-mem container, init first
	sets   []gpushare.GPUSet           // GPUs of each entry of reqs
	units  uint64                      // the pod's total
	served map[string]bool             // containers already served
	// percent is the pod's compute share (gpushare.io/compute-percent), part
	// of every container's environment on a tier that limits compute.
	percent int
}

// Match returns one Decision per entry of units (the device counts of the
// call's container requests, in order), treating earlier entries as served
// when choosing later ones. It fails with a *NoMatchError when some entry
// matches nobody, with an *OvercommitError when a chosen GPU holds more than
// it has, and never returns a partial answer.
func Match(in Input, units []uint64) ([]Decision, error) {
	if in.Inventory == nil {
		return nil, fmt.Errorf("%w: no GPU inventory", ErrInvalidRequest)
	}
	if len(units) == 0 {
		return nil, fmt.Errorf("%w: no container requests", ErrInvalidRequest)
	}
	served := in.Served.clone()
	out := make([]Decision, 0, len(units))
	for _, n := range units {
		if n == 0 {
			return nil, fmt.Errorf("%w: a container request with no devices", ErrInvalidRequest)
		}
		cands, skipped := candidates(in, served)
		d, ok := pick(in, cands, n)
		if !ok {
			return nil, &NoMatchError{Node: in.Node, Units: n, Unit: in.Inventory.Unit(), Waiting: waiting(cands), Skipped: skipped}
		}
		if err := tierUp(in, d); err != nil {
			return nil, err
		}
		served.Add(d.Pod.UID, d.Container.Name, d.Env)
		out = append(out, d)
	}
	if err := checkFits(in, in.Memo, out); err != nil {
		return nil, err
	}
	return out, nil
}

// pick applies rule 3 for a call of n units.
func pick(in Input, cands []candidate, n uint64) (Decision, bool) {
	var chosen *Decision
	for _, c := range cands {
		for i, r := range c.reqs {
			if r.Units != n || c.served[r.Name] {
				continue
			}
			// The tier and the share are part of the signature (docs/design.md):
			// every field of env is compared below.
			env := envOf(in, c, i)
			if chosen == nil {
				chosen = &Decision{Pod: c.pod, Container: r, Env: env}
			} else if env != chosen.Env {
				chosen.Conflicts = append(chosen.Conflicts, c.pod.Namespace+"/"+c.pod.Name+"/"+r.Name)
			}
			// Only a pod's first unserved container of this size can be the one
			// the kubelet serves next: it allocates a pod's containers in order.
			break
		}
	}
	if chosen == nil {
		return Decision{}, false
	}
	return *chosen, true
}

// envOf is the environment of c's i-th container: its GPUs, the units, and
// its GPUs' tier with the pod's compute share. A multi-GPU container names
// its first GPU's size and tier: its GPUs share one tier (checkTiers), and
// the set, in the environment, fixes their sizes on this node.
func envOf(in Input, c candidate, i int) gpushare.ContainerEnv {
	set := c.sets[i]
	first := set.First()
	g, _ := in.Inventory.GPU(first) // checked in candidates
	env := gpushare.ContainerEnv{
		GPUIndex: first, PodUnits: c.units, ContainerUnits: c.reqs[i].Units, DevUnits: g.Units,
		DisableIsolation: in.DisableIsolation, Isolation: in.Isolation[first].Tier, ComputePercent: c.percent,
	}
	if set.Len() > 1 {
		env.GPUs = set
	}
	return env
}

// waiting lists the unserved containers of every candidate, for messages.
func waiting(cands []candidate) []string {
	var out []string
	for _, c := range cands {
		for _, r := range c.reqs {
			if !c.served[r.Name] {
				out = append(out, c.pod.Namespace+"/"+c.pod.Name+"/"+r.Name+"="+strconv.FormatUint(r.Units, 10))
			}
		}
	}
	return out
}

// candidates returns the in-flight pods of in (rule 1), sorted by rule 3's
// pod order, and the pods with gpu-mem that cannot be served, with why.
func candidates(in Input, served Served) ([]candidate, []Skipped) {
	var out []candidate
	var skipped []Skipped
	for _, pod := range in.Pods {
		if pod == nil || pod.DeletionTimestamp != nil || (in.Node != "" && pod.Spec.NodeName != in.Node) {
			continue
		}
		// A running pod stays a candidate until its record is complete: the
		// kubelet may have served it under another pod's answer (equal
		// signatures make that harmless), and that pod's call is still to come.
		if finished(pod) {
			continue
		}
		c, reason := candidateOf(in, pod, in.Memo.info(pod), served[pod.UID])
		switch {
		case reason != "":
			skipped = append(skipped, Skipped{Pod: pod.Namespace + "/" + pod.Name, Reason: reason})
		case c != nil:
			out = append(out, *c)
		}
	}
	slices.SortStableFunc(out, func(a, b candidate) int {
		return cmp.Or(
			cmp.Compare(a.order, b.order),
			a.pod.CreationTimestamp.Compare(b.pod.CreationTimestamp.Time),
			cmp.Compare(a.pod.Namespace, b.pod.Namespace),
			cmp.Compare(a.pod.Name, b.pod.Name),
			cmp.Compare(a.pod.UID, b.pod.UID),
		)
	})
	return out, skipped
}

// candidateOf returns pod as a candidate, nil when it waits for nothing, or
// why it cannot be served.
func candidateOf(in Input, pod *corev1.Pod, info *podInfo, servedNow map[string]gpushare.ContainerEnv) (*candidate, string) {
	if info.problem != "" {
		return nil, info.problem
	}
	if len(info.reqs) == 0 || (info.placed && info.asg.Assigned) {
		return nil, ""
	}
	c := candidate{pod: pod, reqs: info.reqs, units: gpushare.PodUnits(info.reqs), sets: info.sets,
		served: make(map[string]bool, len(info.recorded)+len(servedNow))}
	for name := range info.recorded {
		c.served[name] = true
	}
	for name := range servedNow {
		c.served[name] = true
	}
	if !info.placed {
		// Seed behaviour: with one GPU there is only one place to be, so a
		// pod the extender never saw (default scheduler) still works.
		gpus := in.Inventory.GPUs()
		if len(gpus) != 1 {
			return nil, fmt.Sprintf("it has no %s annotation and the node has %d GPUs; schedule it through the gpushare scheduler extender",
				gpushare.AnnotationGPUIndex, len(gpus))
		}
		c.sets = make([]gpushare.GPUSet, len(c.reqs))
		for i := range c.sets {
			c.sets[i] = gpushare.NewGPUSet(gpus[0].Index)
		}
	}
	if reason := checkContainers(in.Inventory, &c); reason != "" {
		return nil, reason
	}
	if allServed(c) {
		return nil, ""
	}
	if reason := checkTiers(in, info, c.sets); reason != "" {
		return nil, reason
	}
	c.percent = info.percent
	c.order = info.asg.AssumeTime
	if c.order == 0 {
		c.order = pod.CreationTimestamp.UnixNano()
	}
	return &c, ""
}

// allServed reports whether every gpu-mem container of c was served.
func allServed(c candidate) bool {
	for _, r := range c.reqs {
		if !c.served[r.Name] {
			return false
		}
	}
	return true
}

// checkContainers refuses GPUs the node lacks and containers larger than
// their GPUs (per GPU, for a container spanning several); it returns why on
// failure.
func checkContainers(inv *inventory.Inventory, c *candidate) string {
	for i, r := range c.reqs {
		per := r.Units / uint64(max(1, c.sets[i].Len()))
		for _, g := range c.sets[i].Indices() {
			state, ok := inv.GPU(g)
			if !ok {
				return fmt.Sprintf("its annotations name GPU %d for container %q, and this node has no GPU %d", g, r.Name, g)
			}
			if per > state.Units {
				return fmt.Sprintf("container %q asks for %d units, more than GPU %d's %d", r.Name, per, g, state.Units)
			}
		}
	}
	return ""
}
