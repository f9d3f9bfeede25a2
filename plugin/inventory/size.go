package inventory

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

// KubeletMaxMessageSize is the largest ListAndWatch message the kubelet
// accepts: its device-manager client uses gRPC's default receive limit.
const KubeletMaxMessageSize = 4 << 20

// ErrMessageTooLarge marks a unit that would make ListAndWatch exceed the limit.
var ErrMessageTooLarge = errors.New("ListAndWatch message too large for the kubelet")

// MessageTooLargeError explains a refused unit and names one that works.
type MessageTooLargeError struct {
	Unit    gpushare.Unit // the refused unit
	Devices uint64        // device IDs it would advertise
	Size    int           // message bytes it would take
	Limit   int           // the kubelet's limit in bytes
	Suggest gpushare.Unit // the smallest unit that fits; 0 when none does
}

// Error says what was refused and what to use instead.
func (e *MessageTooLargeError) Error() string {
	msg := fmt.Sprintf("%s: --memory-unit=%s advertises %d devices in a %d-byte ListAndWatch message, above the kubelet's limit of %d bytes",
		ErrMessageTooLarge, e.Unit, e.Devices, e.Size, e.Limit)
	if e.Suggest != 0 {
		return msg + fmt.Sprintf("; use --memory-unit=%s or larger", e.Suggest)
	}
	return msg + "; no unit fits this node"
}

// Unwrap returns ErrMessageTooLarge.
func (e *MessageTooLargeError) Unwrap() error { return ErrMessageTooLarge }

// MessageSize returns the exact wire size in bytes of the ListAndWatch
// response Devices would fill, computed without building it (a MiB unit on
// 8 × H200 is over a million devices). Unhealthy GPUs are counted with the
// longer health string, so the size is exact for the current health.
func (inv *Inventory) MessageSize() int {
	size := 0
	for _, g := range inv.gpus {
		size += gpuMessageSize(g.Index, g.Units, health(g.Healthy))
	}
	return size
}

// maxMessageSize is MessageSize with every GPU unhealthy: the largest the
// message can grow to as health changes.
func (inv *Inventory) maxMessageSize() int {
	size := 0
	for _, g := range inv.gpus {
		size += gpuMessageSize(g.Index, g.Units, pluginapi.Unhealthy)
	}
	return size
}

// gpuMessageSize sums the encoded size of the devices of one GPU: each is a
// length-delimited field 1 of ListAndWatchResponse holding a Device with ID
// (field 1) and Health (field 2). IDs of equal decimal length have equal
// size, so the sum runs over digit lengths, not devices.
func gpuMessageSize(index int, units uint64, health string) int {
	prefix := len(fmt.Sprint(index)) + 1 // "<index>-"
	healthField := protowire.SizeTag(2) + protowire.SizeBytes(len(health))
	total := 0
	for lo, digits := uint64(0), 1; lo < units; digits++ {
		hi := min(units, pow10(digits)) // slices [lo, hi) have `digits` digits
		idLen := prefix + digits
		inner := protowire.SizeTag(1) + protowire.SizeBytes(idLen) + healthField
		total += int(hi-lo) * (protowire.SizeTag(1) + protowire.SizeBytes(inner))
		lo = hi
	}
	return total
}

// pow10 returns 10^n for the small n used here.
func pow10(n int) uint64 {
	p := uint64(1)
	for range n {
		p *= 10
	}
	return p
}

// CheckMessageSize returns a *MessageTooLargeError when the ListAndWatch
// message could exceed limit bytes as GPUs turn unhealthy; it suggests the
// smallest unit that would fit. gpus and unit are what New takes.
func (inv *Inventory) CheckMessageSize(limit int) error {
	size := inv.maxMessageSize()
	if size <= limit {
		return nil
	}
	e := &MessageTooLargeError{Unit: inv.unit, Devices: inv.TotalUnits(), Size: size, Limit: limit}
	// Valid units are the powers of two up to a GiB, so try each larger one in turn.
	for u := inv.unit * 2; u <= gpushare.GiB; u *= 2 {
		larger := &Inventory{unit: u, gpus: make([]State, len(inv.gpus))}
		for i, g := range inv.gpus {
			larger.gpus[i] = g
			larger.gpus[i].Units = u.UnitsFromMiB(g.MemoryMiB)
		}
		if larger.maxMessageSize() <= limit {
			e.Suggest = u
			break
		}
	}
	return e
}
