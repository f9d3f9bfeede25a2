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
}

// State is a GPU with its size in units and its health.
type State struct {
	GPU
	Units   uint64 // floor(MemoryMiB / unit)
	Healthy bool
	Reason  string    // why it is unhealthy; empty when healthy
	LastBad time.Time // time of the last health event, zero when never unhealthy
}

// Inventory is the node's GPUs in one unit. The zero value is empty; build
// one with New.
type Inventory struct {
	unit gpushare.Unit
	gpus []State // sorted by Index
}

// New builds an all-healthy inventory of gpus in unit. It refuses an invalid
// unit, no GPUs, duplicate indices or UUIDs, indices outside
// [0, gpushare.MaxGPUsPerNode), and a GPU smaller than one unit or larger than
// gpushare.MaxUnits units, each as an error wrapping ErrInvalidInventory.
func New(gpus []GPU, unit gpushare.Unit) (*Inventory, error) {
	if !unit.Valid() {
		return nil, fmt.Errorf("%w: %w", ErrInvalidInventory, &gpushare.UnitError{Value: unit.String()})
	}
	if len(gpus) == 0 {
		return nil, fmt.Errorf("%w: no GPUs found", ErrInvalidInventory)
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
		n.GPUs = append(n.GPUs, gpushare.GPUInfo{
			Index: g.Index, UUID: g.UUID, Model: g.Model, Units: g.Units, Healthy: g.Healthy, Reason: g.Reason,
		})
	}
	return n
}

// SetUnhealthy returns inv with GPU index marked unhealthy for reason as of
// at. changed is false when it already was unhealthy (its LastBad still
// moves to at, restarting the quiet period).
func (inv *Inventory) SetUnhealthy(index int, reason string, at time.Time) (out *Inventory, changed bool, err error) {
	i, ok := inv.find(index)
	if !ok {
		return inv, false, fmt.Errorf("%w: no GPU with index %d", ErrUnknownGPU, index)
	}
	out = inv.clone()
	g := &out.gpus[i]
	changed = g.Healthy || g.Reason != reason
	g.Healthy, g.Reason, g.LastBad = false, reason, at
	return out, changed, nil
}

// Recover returns inv with every unhealthy GPU whose last event is at least
// quiet before now marked healthy again, and the indices that recovered.
// NVML reports no recovery, so quiet time is the only evidence there is.
func (inv *Inventory) Recover(now time.Time, quiet time.Duration) (*Inventory, []int) {
	var recovered []int
	for _, g := range inv.gpus {
		if !g.Healthy && !now.Before(g.LastBad.Add(quiet)) {
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

// NextRecovery returns when the earliest unhealthy GPU becomes due to
// recover after quiet; ok is false when every GPU is healthy.
func (inv *Inventory) NextRecovery(quiet time.Duration) (at time.Time, ok bool) {
	for _, g := range inv.gpus {
		if g.Healthy {
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
	return &Inventory{unit: inv.unit, gpus: slices.Clone(inv.gpus)}
}
