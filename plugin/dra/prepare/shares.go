// Package prepare decides what the DRA driver's Prepare hands a claim: the
// shares the scheduler allocated on this node's GPUs, whether they can be
// served (healthy GPU, tier up, within the GPU), and the CDI specification
// that gives a container every GPU of the claim with the gpushare
// variables and its tier's limit for exactly the share's memory. It is
// pure: the driver (plugin/dra) reads the claim and writes the files.
package prepare

import (
	"errors"
	"fmt"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpushare/gpushare/plugin/dra/slice"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

// ErrInvalidClaim marks a claim whose allocation this driver cannot serve
// as it stands: the kubelet reports it in the pod's events and retries.
var ErrInvalidClaim = errors.New("cannot prepare claim")

// Share is one allocation result on one of this node's GPUs: a part of the
// GPU's memory the scheduler set aside for the claim.
type Share struct {
	Request string     `json:"request"` // the result's request (maybe "<request>/<subrequest>")
	Pool    string     `json:"pool"`
	Device  string     `json:"device"`
	ShareID *types.UID `json:"shareID,omitempty"`
	Units   uint64     `json:"units"` // consumedCapacity["memory"] in units
}

// Shares reads claim's allocation results of driver on pool (this node's)
// in unit. Results of other drivers are not ours and are skipped; a result
// of ours on another pool, without consumed memory, or whose memory is not
// a whole number of units is refused. The scheduler rounds a request up to
// the capacity's step, one unit, so a fraction means the slice and the
// driver disagree on the unit (a -memory-unit changed under allocated claims).
func Shares(claim *resourceapi.ResourceClaim, driver, pool string, unit gpushare.Unit) ([]Share, error) {
	if claim == nil || claim.Status.Allocation == nil {
		return nil, fmt.Errorf("%w: it is not allocated", ErrInvalidClaim)
	}
	if !unit.Valid() {
		return nil, fmt.Errorf("%w: %w", ErrInvalidClaim, &gpushare.UnitError{Value: unit.String()})
	}
	var out []Share
	for i, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != driver {
			continue
		}
		s, err := share(r, pool, unit)
		if err != nil {
			return nil, fmt.Errorf("%w: result %d (request %q, device %s/%s): %w", ErrInvalidClaim, i, r.Request, r.Pool, r.Device, err)
		}
		out = append(out, s)
	}
	return out, nil
}

// share reads one result of ours.
func share(r resourceapi.DeviceRequestAllocationResult, pool string, unit gpushare.Unit) (Share, error) {
	if r.Pool != pool {
		return Share{}, fmt.Errorf("pool %q is not this node's (%q)", r.Pool, pool)
	}
	q, ok := r.ConsumedCapacity[gpushare.DRACapacityMemory]
	if !ok {
		return Share{}, fmt.Errorf("no consumed %q capacity: a scheduler without consumable capacity (DRAConsumableCapacity) allocated it", gpushare.DRACapacityMemory)
	}
	bytesPerUnit := int64(unit.MiB()) << 20
	v, exact := q.AsInt64()
	switch {
	case !exact || v <= 0:
		return Share{}, fmt.Errorf("consumed memory %s is not a positive whole number of bytes", q.String())
	case v%bytesPerUnit != 0:
		return Share{}, fmt.Errorf("consumed memory %s is not a whole number of %s units", q.String(), unit)
	case uint64(v/bytesPerUnit) > gpushare.MaxUnits:
		return Share{}, fmt.Errorf("consumed memory %s is more than %d units of %s", q.String(), gpushare.MaxUnits, unit)
	}
	s := Share{Request: r.Request, Pool: r.Pool, Device: r.Device, Units: uint64(v / bytesPerUnit)}
	if r.ShareID != nil {
		s.ShareID = ptrUID(*r.ShareID)
	}
	return s, nil
}

func ptrUID(u types.UID) *types.UID { return &u }

// Overcommit checks that adding shares to the claims already prepared
// (by claim UID) keeps every GPU within its capacity (units by device name).
// The scheduler accounts consumed capacity itself; this is the node's last
// line of defence against a slip (an allocation made against a slice
// published with another unit, or by hand), as in device-plugin mode.
func Overcommit(prepared map[types.UID][]Share, shares []Share, capacity map[string]uint64) error {
	used := map[string]uint64{}
	holders := map[string][]string{}
	for uid, ss := range prepared {
		for _, s := range ss {
			used[s.Device] += s.Units
			holders[s.Device] = append(holders[s.Device], fmt.Sprintf("%s=%d", uid, s.Units))
		}
	}
	for _, s := range shares {
		total := used[s.Device] + s.Units
		if total > capacity[s.Device] {
			h := holders[s.Device]
			slices.Sort(h)
			return fmt.Errorf("%w: GPU device %s has %d units and would hold %d: %d for this claim, prepared claims %v",
				ErrInvalidClaim, s.Device, capacity[s.Device], total, s.Units, h)
		}
		used[s.Device] = total
	}
	return nil
}

// deviceNames maps each GPU to its device name, for lookups by result.
func deviceNames(gpus []GPU) (map[string]GPU, error) {
	out := make(map[string]GPU, len(gpus))
	for _, g := range gpus {
		name, err := slice.DeviceName(g.UUID)
		if err != nil {
			return nil, err
		}
		out[name] = g
	}
	return out, nil
}
