package dra

import (
	"strconv"
	"strings"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpushare/gpushare/plugin/dra/prepare"
	"github.com/gpushare/gpushare/plugin/dra/slice"
	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/inventory"
	"github.com/gpushare/gpushare/plugin/isolation"
	"github.com/gpushare/gpushare/plugin/nvml"
)

// node is the node's GPUs as the driver sees them now: what NVML said at
// start, their health (the device-plugin mode's rules, kept by
// plugin/inventory) with the taint each fault calls for, and the
// isolation tier's state. Every change wakes Changed.
type node struct {
	mu     sync.Mutex
	base   []slice.GPU // by index, as read at start
	unit   gpushare.Unit
	inv    *inventory.Inventory
	faults map[int]slice.Fault // taint of each unhealthy GPU
	tier   isolation.Status
	// changed holds one wake-up for the publisher, healthChanged one for
	// the kubelet's health stream; neither blocks a writer.
	changed, healthChanged chan struct{}
}

func newNode(base []slice.GPU, unit gpushare.Unit, tier isolation.Status) (*node, error) {
	in := make([]inventory.GPU, len(base))
	for i, g := range base {
		in[i] = inventory.GPU{Index: g.Index, UUID: g.UUID, Model: g.Model, MemoryMiB: g.MemoryMiB}
	}
	inv, err := inventory.New(in, unit)
	if err != nil {
		return nil, err
	}
	return &node{base: base, unit: unit, inv: inv, faults: map[int]slice.Fault{}, tier: tier,
		changed: make(chan struct{}, 1), healthChanged: make(chan struct{}, 1)}, nil
}

// Changed is woken after every change.
func (n *node) Changed() <-chan struct{} { return n.changed }

// HealthChanged is woken after every change, for the health stream.
func (n *node) HealthChanged() <-chan struct{} { return n.healthChanged }

func (n *node) wake() {
	for _, ch := range []chan struct{}{n.changed, n.healthChanged} {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// publish returns the GPUs as the slice shows them now.
func (n *node) publish() []slice.GPU {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]slice.GPU, len(n.base))
	for i, g := range n.base {
		g.Tier = n.tier.Effective()
		if st, ok := n.inv.GPU(g.Index); ok && !st.Healthy {
			f := n.faults[g.Index]
			g.Fault = &f
		}
		out[i] = g
	}
	return out
}

// prepareView returns the GPUs as Prepare checks them now.
func (n *node) prepareView() []prepare.GPU {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]prepare.GPU, len(n.base))
	for i, g := range n.base {
		p := prepare.GPU{Index: g.Index, UUID: g.UUID, Units: slice.CapacityUnits(g.MemoryMiB, n.unit), Tier: n.tier}
		if st, ok := n.inv.GPU(g.Index); ok && !st.Healthy {
			p.Fault = st.Reason
		}
		out[i] = p
	}
	return out
}

// setTier installs the tier's state; it reports whether anything changed.
func (n *node) setTier(st isolation.Status) bool {
	n.mu.Lock()
	changed := n.tier != st
	n.tier = st
	n.mu.Unlock()
	if changed {
		n.wake()
	}
	return changed
}

// tierStatus is the tier's state now.
func (n *node) tierStatus() isolation.Status {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.tier
}

// update applies fn to the health inventory; fn returns the new one and
// whether the published health changed.
func (n *node) update(fn func(*inventory.Inventory) (*inventory.Inventory, bool)) {
	n.mu.Lock()
	next, changed := fn(n.inv)
	n.inv = next
	n.mu.Unlock()
	if changed {
		n.wake()
	}
}

// health applies one NVML health event at now. The taint follows the
// fault that holds: a weaker fault leaves the stronger one's taint.
func (n *node) health(ev nvml.HealthEvent, now time.Time) (idx int, changed bool, err error) {
	n.mu.Lock()
	defer func() {
		n.mu.Unlock()
		if changed {
			n.wake()
		}
	}()
	idx, ok := n.inv.IndexOfUUID(ev.UUID)
	if !ok {
		idx = ev.Index
	}
	if ev.Cause == nvml.CauseWatched {
		next, c, err := n.inv.Watched(idx)
		if err == nil {
			n.inv = next
		}
		return idx, c, err
	}
	next, c, err := n.inv.SetUnhealthy(idx, ev.Reason, recoveryOf(ev.Cause), now)
	if err != nil {
		return idx, false, err
	}
	n.inv = next
	if st, _ := next.GPU(idx); st.Reason == ev.Reason {
		f := faultOf(ev)
		c = c || n.faults[idx] != f
		n.faults[idx] = f
	}
	return idx, c, nil
}

// recoveryOf is what brings a GPU back after a fault of cause c
// (docs/device-plugin.md, "Health").
func recoveryOf(c nvml.Cause) inventory.Recovery {
	switch c {
	case nvml.CauseFatal:
		return inventory.Never
	case nvml.CauseUnwatched:
		return inventory.WhenWatched
	default:
		return inventory.AfterQuiet
	}
}

// xidLost is the Xid of a GPU that fell off the bus.
const xidLost = 79

// faultOf is the taint for a health event: NoExecute for a GPU that is
// gone (its pods cannot run; evicting them lets their controllers place
// them elsewhere), NoSchedule for any other fault (running pods may still
// finish; new claims must not land there).
func faultOf(ev nvml.HealthEvent) slice.Fault {
	xid := ""
	if ev.Xid != 0 {
		xid = "-xid-" + strconv.FormatUint(ev.Xid, 10)
	}
	switch {
	case ev.Xid == xidLost || (ev.Cause == nvml.CauseFatal && strings.Contains(ev.Reason, "GPU_IS_LOST")):
		return slice.Fault{Effect: resourceapi.DeviceTaintEffectNoExecute, Value: gpushare.DRATaintValueLost}
	case ev.Cause == nvml.CauseFatal:
		return slice.Fault{Effect: resourceapi.DeviceTaintEffectNoSchedule, Value: gpushare.DRATaintValueFatal + xid}
	case ev.Cause == nvml.CauseUnwatched:
		return slice.Fault{Effect: resourceapi.DeviceTaintEffectNoSchedule, Value: gpushare.DRATaintValueUnwatched}
	default:
		return slice.Fault{Effect: resourceapi.DeviceTaintEffectNoSchedule, Value: gpushare.DRATaintValueTransient + xid}
	}
}
