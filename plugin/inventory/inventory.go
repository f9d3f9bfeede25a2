package inventory

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

// ErrInvalidInventory marks GPUs or a unit that cannot form an inventory.
var ErrInvalidInventory = errors.New("invalid GPU inventory")

// ErrUnknownDevice marks a device ID that names no device of the inventory.
var ErrUnknownDevice = errors.New("unknown device ID")

// ErrUnknownGPU marks a GPU index or UUID that is not in the inventory.
var ErrUnknownGPU = errors.New("unknown GPU")

// GPU is one physical GPU as NVML describes it.
type GPU struct {
	Index     int    // NVML index, the value of NVIDIA_VISIBLE_DEVICES
	UUID      string // stable identity, the key health events use
	Model     string // product name, for the node description
	MemoryMiB uint64 // total memory in MiB
	// NUMANode is the GPU's NUMA node (-1 when unknown), nil when the
	// topology could not be read; PCIBusID is NVML's bus ID, "" likewise.
	NUMANode *int
	PCIBusID string
}

// Recovery says what brings an unhealthy GPU back. The values are ordered:
// a GPU with faults of several kinds needs the strongest one's recovery.
type Recovery int

const (
	// AfterQuiet is for transient faults: the GPU is healthy again once no
	// event came for the quiet period.
	AfterQuiet Recovery = iota
	// WhenWatched is for a GPU whose health cannot be watched: it is healthy
	// again once the watch covers it (Watched).
	WhenWatched
	// Never is for fatal faults: nothing in this process brings the GPU
	// back; a restarted plugin reads the GPUs afresh.
	Never
)

// permanentNote ends the published reason of a GPU that will not recover,
// so whoever reads the node knows that waiting will not help.
const permanentNote = " (permanent: the GPU needs a reset or a repair, then a restart of the device plugin)"

// State is a GPU with its size in units and its health.
type State struct {
	GPU
	Units    uint64 // floor(MemoryMiB / unit)
	Healthy  bool
	Reason   string    // why it is unhealthy; empty when healthy
	Recovery Recovery  // what brings it back; meaningful only when unhealthy
	LastBad  time.Time // time of the last health event, zero when never unhealthy
}

// Inventory is the node's GPUs in one unit. The zero value is empty; build
// one with New.
type Inventory struct {
	unit gpushare.Unit
	gpus []State // sorted by Index
	// links are the pairs' connections as published (A < B, sorted); nil
	// when the topology could not be read. Never modified once set.
	links []gpushare.GPULink
}

// New builds an all-healthy inventory of gpus in unit; no GPUs is an empty
// inventory (a node whose every GPU is skipped). It refuses an invalid
// unit, duplicate indices or UUIDs, indices outside
// [0, gpushare.MaxGPUsPerNode), and a GPU smaller than one unit or larger than
// gpushare.MaxUnits units, each as an error wrapping ErrInvalidInventory.
func New(gpus []GPU, unit gpushare.Unit) (*Inventory, error) {
	if !unit.Valid() {
		return nil, fmt.Errorf("%w: %w", ErrInvalidInventory, &gpushare.UnitError{Value: unit.String()})
	}
	if len(gpus) > gpushare.MaxGPUsPerNode {
		return nil, fmt.Errorf("%w: %d GPUs, more than %d", ErrInvalidInventory, len(gpus), gpushare.MaxGPUsPerNode)
	}
	inv := &Inventory{unit: unit, gpus: make([]State, 0, len(gpus))}
	seenIdx, seenUUID := map[int]bool{}, map[string]bool{}
	for _, g := range gpus {
		switch {
		case g.Index < 0 || g.Index >= gpushare.MaxGPUsPerNode:
			return nil, fmt.Errorf("%w: GPU index %d is outside [0, %d)", ErrInvalidInventory, g.Index, gpushare.MaxGPUsPerNode)
		case seenIdx[g.Index]:
			return nil, fmt.Errorf("%w: GPU index %d appears twice", ErrInvalidInventory, g.Index)
		case g.UUID == "":
			return nil, fmt.Errorf("%w: GPU %d has no UUID", ErrInvalidInventory, g.Index)
		case seenUUID[g.UUID]:
			return nil, fmt.Errorf("%w: GPU UUID %s appears twice", ErrInvalidInventory, g.UUID)
		}
		seenIdx[g.Index], seenUUID[g.UUID] = true, true
		units := unit.UnitsFromMiB(g.MemoryMiB)
		if units == 0 || units > gpushare.MaxUnits {
			return nil, fmt.Errorf("%w: GPU %d has %d MiB, which is %d units of %s; want 1 to %d units",
				ErrInvalidInventory, g.Index, g.MemoryMiB, units, unit, gpushare.MaxUnits)
		}
		inv.gpus = append(inv.gpus, State{GPU: g, Units: units, Healthy: true})
	}
	slices.SortFunc(inv.gpus, func(a, b State) int { return a.Index - b.Index })
	return inv, nil
}

// Unit returns the memory unit every Units value is counted in.
func (inv *Inventory) Unit() gpushare.Unit { return inv.unit }

// GPUs returns a copy of the GPUs' states, sorted by index.
func (inv *Inventory) GPUs() []State { return slices.Clone(inv.gpus) }

// GPU returns the state of the GPU with NVML index index.
func (inv *Inventory) GPU(index int) (State, bool) {
	i, ok := inv.find(index)
	if !ok {
		return State{}, false
	}
	return inv.gpus[i], true
}

// find returns the position of GPU index in inv.gpus.
func (inv *Inventory) find(index int) (int, bool) {
	return slices.BinarySearchFunc(inv.gpus, index, func(s State, idx int) int { return s.Index - idx })
}

// IndexOfUUID returns the index of the GPU with the given UUID.
func (inv *Inventory) IndexOfUUID(uuid string) (int, bool) {
	for _, g := range inv.gpus {
		if g.UUID == uuid {
			return g.Index, true
		}
	}
	return 0, false
}

// TotalUnits sums every GPU's units, healthy or not: the node's gpu-mem capacity.
func (inv *Inventory) TotalUnits() uint64 {
	var total uint64
	for _, g := range inv.gpus {
		total += g.Units
	}
	return total
}

// HealthyUnits sums the units of healthy GPUs: what the kubelet can hand out.
func (inv *Inventory) HealthyUnits() uint64 {
	var total uint64
	for _, g := range inv.gpus {
		if g.Healthy {
			total += g.Units
		}
	}
	return total
}

// DeviceID returns the virtual device ID of slice j of GPU index. IDs are
// short on purpose: the ListAndWatch message repeats one per unit, and its
// size bounds the smallest unit a node can use.
func DeviceID(index int, j uint64) string {
	return strconv.Itoa(index) + "-" + strconv.FormatUint(j, 10)
}

// ParseDevice returns the GPU index and slice that id names in inv. IDs
// not written by DeviceID (non-canonical numbers included) or outside the
// inventory are an error wrapping ErrUnknownDevice.
func (inv *Inventory) ParseDevice(id string) (index int, j uint64, err error) {
	bad := func(why string) error { return fmt.Errorf("%w %q: %s", ErrUnknownDevice, clip(id), why) }
	gs, js, ok := strings.Cut(id, "-")
	if !ok {
		return 0, 0, bad(`want "<gpu index>-<slice>"`)
	}
	g, err1 := strconv.Atoi(gs)
	n, err2 := strconv.ParseUint(js, 10, 64)
	if err1 != nil || err2 != nil || DeviceID(g, n) != id {
		return 0, 0, bad(`want "<gpu index>-<slice>" in canonical decimal`)
	}
	i, ok := inv.find(g)
	if !ok {
		return 0, 0, bad(fmt.Sprintf("the node has no GPU %d", g))
	}
	if n >= inv.gpus[i].Units {
		return 0, 0, bad(fmt.Sprintf("GPU %d has only %d units", g, inv.gpus[i].Units))
	}
	return g, n, nil
}

// clip bounds a foreign string quoted in an error.
func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// health returns the kubelet's health string for a GPU.
func health(healthy bool) string {
	if healthy {
		return pluginapi.Healthy
	}
	return pluginapi.Unhealthy
}

// Devices returns the ListAndWatch device list: every unit of every GPU, in
// GPU then slice order, marked with its GPU's health.
func (inv *Inventory) Devices() []*pluginapi.Device {
	out := make([]*pluginapi.Device, 0, inv.TotalUnits())
	for _, g := range inv.gpus {
		h := health(g.Healthy)
		for j := range g.Units {
			out = append(out, &pluginapi.Device{ID: DeviceID(g.Index, j), Health: h})
		}
	}
	return out
}

// NodeGPUs returns the node GPU description the plugin publishes on its Node.
func (inv *Inventory) NodeGPUs(simulated bool) gpushare.NodeGPUs {
	n := gpushare.NodeGPUs{Unit: inv.unit, Simulated: simulated, GPUs: make([]gpushare.GPUInfo, 0, len(inv.gpus))}
	for _, g := range inv.gpus {
		info := gpushare.GPUInfo{Index: g.Index, UUID: g.UUID, Model: g.Model, Units: g.Units, Healthy: g.Healthy, Reason: g.Reason,
			PCIBusID: g.PCIBusID}
		if g.NUMANode != nil {
			numa := *g.NUMANode
			info.NUMANode = &numa
		}
		if !g.Healthy && g.Recovery == Never {
			info.Permanent, info.Reason = true, g.Reason+permanentNote
		}
		n.GPUs = append(n.GPUs, info)
	}
	n.Links = slices.Clone(inv.links)
	return n
}

// WithLinks returns inv with the links between its GPUs, as
// gpushare.NodeGPUs.Links publishes them: one per pair of its GPUs, A < B,
// sorted by A then B. It refuses any other set, so that a wrong reading can
// never make the published description invalid.
func (inv *Inventory) WithLinks(links []gpushare.GPULink) (*Inventory, error) {
	k := 0
	for i, a := range inv.gpus {
		for _, b := range inv.gpus[i+1:] {
			if k >= len(links) || links[k].A != a.Index || links[k].B != b.Index {
				return inv, fmt.Errorf("%w: links do not name every pair of GPUs once, in order (want %d-%d at %d)",
					ErrInvalidInventory, a.Index, b.Index, k)
			}
			if links[k].Score < 0 || links[k].NVLinks < 0 {
				return inv, fmt.Errorf("%w: link %d-%d has a negative score or NVLink count", ErrInvalidInventory, a.Index, b.Index)
			}
			k++
		}
	}
	if k != len(links) {
		return inv, fmt.Errorf("%w: %d links for %d pairs of GPUs", ErrInvalidInventory, len(links), k)
	}
	out := inv.clone()
	out.links = slices.Clone(links)
	return out, nil
}

// SetUnhealthy returns inv with GPU index marked unhealthy for reason as of
// at, until rec. A GPU already unhealthy keeps the stronger of the two
// recoveries, with its reason: a transient fault does not shorten a fatal
// one. changed is false when the published state (health, reason, whether
// permanent) stays the same; LastBad moves to at in every case, restarting
// the quiet period.
func (inv *Inventory) SetUnhealthy(index int, reason string, rec Recovery, at time.Time) (out *Inventory, changed bool, err error) {
	i, ok := inv.find(index)
	if !ok {
		return inv, false, fmt.Errorf("%w: no GPU with index %d", ErrUnknownGPU, index)
	}
	out = inv.clone()
	g := &out.gpus[i]
	g.LastBad = at
	if !g.Healthy && g.Recovery > rec {
		return out, false, nil
	}
	changed = g.Healthy || g.Reason != reason || g.Recovery != rec
	g.Healthy, g.Reason, g.Recovery = false, reason, rec
	return out, changed, nil
}

// Watched returns inv with GPU index healthy again if it was unhealthy only
// because it could not be watched; changed says whether it was.
func (inv *Inventory) Watched(index int) (out *Inventory, changed bool, err error) {
	i, ok := inv.find(index)
	if !ok {
		return inv, false, fmt.Errorf("%w: no GPU with index %d", ErrUnknownGPU, index)
	}
	if g := inv.gpus[i]; g.Healthy || g.Recovery != WhenWatched {
		return inv, false, nil
	}
	out = inv.clone()
	out.gpus[i].Healthy, out.gpus[i].Reason, out.gpus[i].Recovery = true, "", AfterQuiet
	return out, true, nil
}

// Recover returns inv with every GPU unhealthy from transient faults whose
// last event is at least quiet before now marked healthy again, and the
// indices that recovered. NVML reports no recovery, so quiet time is the
// only evidence there is; GPUs waiting for the watch or fatally unhealthy
// are left alone.
func (inv *Inventory) Recover(now time.Time, quiet time.Duration) (*Inventory, []int) {
	var recovered []int
	for _, g := range inv.gpus {
		if !g.Healthy && g.Recovery == AfterQuiet && !now.Before(g.LastBad.Add(quiet)) {
			recovered = append(recovered, g.Index)
		}
	}
	if len(recovered) == 0 {
		return inv, nil
	}
	out := inv.clone()
	for _, idx := range recovered {
		i, _ := out.find(idx)
		out.gpus[i].Healthy, out.gpus[i].Reason = true, ""
	}
	return out, recovered
}

// NextRecovery returns when the earliest GPU unhealthy from transient faults
// becomes due to recover after quiet; ok is false when there is none.
func (inv *Inventory) NextRecovery(quiet time.Duration) (at time.Time, ok bool) {
	for _, g := range inv.gpus {
		if g.Healthy || g.Recovery != AfterQuiet {
			continue
		}
		if due := g.LastBad.Add(quiet); !ok || due.Before(at) {
			at, ok = due, true
		}
	}
	return at, ok
}

// clone copies inv so that health changes leave the original untouched.
func (inv *Inventory) clone() *Inventory {
	return &Inventory{unit: inv.unit, gpus: slices.Clone(inv.gpus), links: inv.links}
}
