package gpushare

import (
	"encoding/json"
	"slices"
	"strconv"
)

// NodeGPUs is the value of AnnotationNodeGPUs, written by our device plugin so
// the extender and the inspector see each GPU's own size and health instead of
// dividing the node total by the GPU count (wrong on mixed-size nodes).
type NodeGPUs struct {
	Unit      Unit      `json:"unit"`      // the unit every Units field is counted in
	Simulated bool      `json:"simulated"` // true when the plugin runs on its simulated NVML backend
	GPUs      []GPUInfo `json:"gpus"`      // sorted by Index
	// Links are the connections between the GPUs, one per pair (A < B),
	// sorted by A then B; omitted by plugins that predate topology.
	Links []GPULink `json:"links,omitempty"`
}

// GPUInfo describes one physical GPU.
type GPUInfo struct {
	Index   int    `json:"index"` // NVML index, also the value of NVIDIA_VISIBLE_DEVICES
	UUID    string `json:"uuid"`
	Model   string `json:"model"`
	Units   uint64 `json:"units"` // memory in units, floor(MiB / unit)
	Healthy bool   `json:"healthy"`
	Reason  string `json:"reason"` // why the GPU is unhealthy; empty when healthy
	// Permanent is true for a GPU unhealthy from a fault it will not recover
	// from by itself (it needs a reset or a repair, then a plugin restart);
	// omitted when false, so older readers and older values are unaffected.
	Permanent bool `json:"permanent,omitempty"`
	// Isolation is the tier this GPU offers now (its effective tier); empty
	// from plugins that predate tiers, which offer none.
	Isolation Isolation `json:"isolation,omitempty"`
	// IsolationReason says why the GPU offers less than its node is
	// configured for (the MPS control daemon does not answer, the HAMi-core
	// library is missing); empty when it offers what was asked.
	IsolationReason string `json:"isolationReason,omitempty"`
	// NUMANode is the GPU's NUMA node as the kernel reports it (sysfs), -1
	// when the kernel does not know; omitted by plugins that predate topology.
	NUMANode *int `json:"numa,omitempty"`
	// PCIBusID is the GPU's PCI bus ID, e.g. "00000000:1B:00.0".
	PCIBusID string `json:"pciBusId,omitempty"`
}

// TotalUnits sums the units of all GPUs, healthy or not, as the node's
// aliyun.com/gpu-mem capacity counts them.
func (n NodeGPUs) TotalUnits() uint64 {
	var total uint64
	for _, g := range n.GPUs {
		total += g.Units
	}
	return total
}

// GPU returns the GPU with the given index.
func (n NodeGPUs) GPU(index int) (GPUInfo, bool) {
	for _, g := range n.GPUs {
		if g.Index == index {
			return g, true
		}
	}
	return GPUInfo{}, false
}

// Validate checks what DecodeNodeGPUs checks: a valid unit, at most
// MaxGPUsPerNode GPUs, unique indices in [0, MaxGPUsPerNode), units in
// [1, MaxUnits], and links each naming two of the GPUs (A < B), no pair
// twice, with no negative score or NVLink count. A pair without a link is
// allowed: its connection is unknown.
func (n NodeGPUs) Validate() error {
	if !n.Unit.Valid() {
		return &NodeGPUsError{Field: "unit", Reason: (&UnitError{Value: n.Unit.String()}).Error()}
	}
	if len(n.GPUs) > MaxGPUsPerNode {
		return &NodeGPUsError{Field: "gpus", Reason: strconv.Itoa(len(n.GPUs)) + " GPUs, more than " + strconv.Itoa(MaxGPUsPerNode)}
	}
	seen := map[int]bool{}
	for i, g := range n.GPUs {
		field := "gpus[" + strconv.Itoa(i) + "]"
		if g.Index < 0 || g.Index >= MaxGPUsPerNode {
			return &NodeGPUsError{Field: field + ".index", Reason: strconv.Itoa(g.Index) + " is outside [0, " + strconv.Itoa(MaxGPUsPerNode) + ")"}
		}
		if seen[g.Index] {
			return &NodeGPUsError{Field: field + ".index", Reason: "index " + strconv.Itoa(g.Index) + " appears twice"}
		}
		seen[g.Index] = true
		if g.Units == 0 || g.Units > MaxUnits {
			return &NodeGPUsError{Field: field + ".units", Reason: uintString(g.Units) + " is outside [1, " + uintString(MaxUnits) + "]"}
		}
	}
	pairs := map[[2]int]bool{}
	for i, l := range n.Links {
		field := "links[" + strconv.Itoa(i) + "]"
		switch {
		case !seen[l.A] || !seen[l.B]:
			return &NodeGPUsError{Field: field, Reason: "names a GPU the node does not list (" + strconv.Itoa(l.A) + "-" + strconv.Itoa(l.B) + ")"}
		case l.A >= l.B:
			return &NodeGPUsError{Field: field, Reason: "a must be below b, not " + strconv.Itoa(l.A) + "-" + strconv.Itoa(l.B)}
		case pairs[[2]int{l.A, l.B}]:
			return &NodeGPUsError{Field: field, Reason: "pair " + strconv.Itoa(l.A) + "-" + strconv.Itoa(l.B) + " appears twice"}
		case l.Score < 0 || l.NVLinks < 0:
			return &NodeGPUsError{Field: field, Reason: "negative score or NVLink count"}
		}
		pairs[[2]int{l.A, l.B}] = true
	}
	return nil
}

// EncodeNodeGPUs validates n and writes it as JSON with GPUs sorted by index,
// so an unchanged node never gets a spurious PATCH. It does not modify n.
func EncodeNodeGPUs(n NodeGPUs) (string, error) {
	if err := n.Validate(); err != nil {
		return "", err
	}
	n.GPUs, n.Links = sortedGPUs(n.GPUs), sortedLinks(n.Links)
	b, err := json.Marshal(n)
	if err != nil {
		// Unreachable for a validated value; kept typed all the same.
		return "", &NodeGPUsError{Reason: err.Error()}
	}
	return string(b), nil
}

// DecodeNodeGPUs reads and validates a node GPU description; GPUs come back
// sorted by index and never nil, links sorted by A then B and nil when none. Unknown fields are ignored so an older reader
// accepts a newer plugin's additions. Failures are a *NodeGPUsError
// (ErrInvalidNodeGPUs).
func DecodeNodeGPUs(s string) (NodeGPUs, error) {
	// Decode the unit as text first, so a bad unit reports as a field error.
	var raw struct {
		Unit      *string   `json:"unit"`
		Simulated bool      `json:"simulated"`
		GPUs      []GPUInfo `json:"gpus"`
		Links     []GPULink `json:"links"`
	}
	if err := json.Unmarshal([]byte(s), &raw); err != nil {
		return NodeGPUs{}, &NodeGPUsError{Reason: "not valid JSON: " + err.Error()}
	}
	if raw.Unit == nil {
		return NodeGPUs{}, &NodeGPUsError{Field: "unit", Reason: "missing"}
	}
	unit, err := ParseUnit(*raw.Unit)
	if err != nil {
		return NodeGPUs{}, &NodeGPUsError{Field: "unit", Reason: err.Error()}
	}
	n := NodeGPUs{Unit: unit, Simulated: raw.Simulated, GPUs: raw.GPUs, Links: raw.Links}
	if err := n.Validate(); err != nil {
		return NodeGPUs{}, err
	}
	n.GPUs, n.Links = sortedGPUs(n.GPUs), sortedLinks(n.Links)
	return n, nil
}

// sortedLinks returns a copy sorted by A then B, nil when there are none
// (as an omitted "links" decodes), leaving the caller's slice alone.
func sortedLinks(links []GPULink) []GPULink {
	if len(links) == 0 {
		return nil
	}
	out := slices.Clone(links)
	slices.SortFunc(out, func(x, y GPULink) int {
		if x.A != y.A {
			return x.A - y.A
		}
		return x.B - y.B
	})
	return out
}

// sortedGPUs returns a sorted, non-nil copy, leaving the caller's slice alone.
func sortedGPUs(gpus []GPUInfo) []GPUInfo {
	out := slices.Clone(gpus)
	if out == nil {
		out = []GPUInfo{}
	}
	slices.SortFunc(out, func(a, b GPUInfo) int { return a.Index - b.Index })
	return out
}
