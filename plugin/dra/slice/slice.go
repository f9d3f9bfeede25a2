// Package slice computes what the DRA driver publishes for its node: one
// ResourceSlice device per shareable GPU, whose memory is consumable
// capacity in whole units of the node's memory unit, with its attributes
// and, for an unhealthy GPU, a taint. It is pure: no NVML, no API calls.
package slice

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	apiresource "k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

// ErrInvalidGPU marks a GPU that cannot be published as a device.
var ErrInvalidGPU = errors.New("cannot publish GPU")

// Limits of the resource.k8s.io API (resourceapi constants and
// pkg/apis/resource/validation).
const (
	// maxDevicesWithTaints is how many devices a slice may hold once any of
	// them has a taint (128 otherwise); one slice per 64 GPUs keeps every
	// slice valid whatever the health.
	maxDevicesWithTaints = 64
	// maxAttributeString is DeviceAttributeMaxValueLength.
	maxAttributeString = resourceapi.DeviceAttributeMaxValueLength
)

// GPU is one shareable GPU and what is known about it now.
type GPU struct {
	Index     int
	UUID      string // NVML's, "GPU-..."
	Model     string // NVML's product name
	MemoryMiB uint64
	PCIBusID  string // sysfs form "0000:3b:00.0"; "" when unknown
	NUMANode  int    // -1 when unknown
	// NVLinkDomain names the GPUs reachable from this one over NVLink
	// (NVLinkDomains); "" when the topology could not be read.
	NVLinkDomain string
	// Architecture and ComputeCapability ("9.0") are "" when unknown.
	Architecture      string
	ComputeCapability string
	// DriverVersion is the NVIDIA driver's version; "" when unknown.
	DriverVersion string
	// Tier is the isolation tier the GPU offers now (effective: none while
	// the configured tier is down).
	Tier gpushare.Isolation
	// Simulated marks a GPU of a simulated backend.
	Simulated bool
	// Fault is why the GPU is unhealthy; nil when healthy.
	Fault *Fault
}

// Fault is an unhealthy GPU's taint.
type Fault struct {
	// Effect is NoSchedule, or NoExecute for a GPU that is gone.
	Effect resourceapi.DeviceTaintEffect
	// Value is one of gpushare.DRATaintValue*, maybe with an Xid suffix.
	Value string
}

// DeviceName is the device's name for the GPU with NVML UUID uuid:
// "gpu-" and the UUID without its "GPU-" prefix, lower case. A UUID names
// the same physical GPU across plugin restarts, kubelet restarts and
// reboots, which an index does not promise (NVML orders by PCI bus, and a
// GPU that falls off the bus shifts every later index), so a claim
// allocated before any restart still prepares on the GPU it was charged to.
func DeviceName(uuid string) (string, error) {
	rest, ok := strings.CutPrefix(uuid, "GPU-")
	name := gpushare.DRADeviceNamePrefix + strings.ToLower(rest)
	if !ok || rest == "" || len(name) > 63 || !dnsLabel.MatchString(name) {
		return "", fmt.Errorf("%w: UUID %q does not make a device name (want GPU-<hex and dashes>)", ErrInvalidGPU, uuid)
	}
	return name, nil
}

// dnsLabel is RFC 1123's label, as Device.Name requires.
var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// CapacityUnits is how many whole units of unit the GPU's memory holds: the
// memory the device publishes, as in device-plugin mode.
func CapacityUnits(memoryMiB uint64, unit gpushare.Unit) uint64 {
	return unit.UnitsFromMiB(memoryMiB)
}

// Quantity is units of unit as a binary quantity in bytes ("80Gi").
func Quantity(units uint64, unit gpushare.Unit) apiresource.Quantity {
	return *apiresource.NewQuantity(int64(unit.ToMiB(units))<<20, apiresource.BinarySI)
}

// Devices returns the devices for gpus in unit, in the order given. It
// fails on an invalid unit, a GPU smaller than one unit or larger than
// gpushare.MaxUnits, a UUID that makes no device name, and two GPUs with
// one name.
func Devices(gpus []GPU, unit gpushare.Unit) ([]resourceapi.Device, error) {
	if !unit.Valid() {
		return nil, fmt.Errorf("%w: %w", ErrInvalidGPU, &gpushare.UnitError{Value: unit.String()})
	}
	out := make([]resourceapi.Device, 0, len(gpus))
	seen := map[string]int{}
	for _, g := range gpus {
		d, err := device(g, unit)
		if err != nil {
			return nil, err
		}
		if other, dup := seen[d.Name]; dup {
			return nil, fmt.Errorf("%w: GPUs %d and %d both make device %s", ErrInvalidGPU, other, g.Index, d.Name)
		}
		seen[d.Name] = g.Index
		out = append(out, d)
	}
	return out, nil
}

// device is one GPU's device.
func device(g GPU, unit gpushare.Unit) (resourceapi.Device, error) {
	name, err := DeviceName(g.UUID)
	if err != nil {
		return resourceapi.Device{}, err
	}
	units := CapacityUnits(g.MemoryMiB, unit)
	if units == 0 || units > gpushare.MaxUnits {
		return resourceapi.Device{}, fmt.Errorf("%w: GPU %d has %d MiB, %d units of %s; want 1 to %d units",
			ErrInvalidGPU, g.Index, g.MemoryMiB, units, unit, gpushare.MaxUnits)
	}
	d := resourceapi.Device{
		Name:                     name,
		Attributes:               attributes(g),
		Capacity:                 map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{gpushare.DRACapacityMemory: memoryCapacity(units, unit)},
		AllowMultipleAllocations: ptr.To(true),
	}
	if g.Fault != nil {
		d.Taints = []resourceapi.DeviceTaint{{Key: gpushare.DRATaintUnhealthy, Value: g.Fault.Value, Effect: g.Fault.Effect}}
	}
	return d, nil
}

// memoryCapacity is units of memory, consumable in steps of one unit. The
// default, what a request that names no memory consumes, is the whole GPU:
// a claim that asks for "a GPU" gets one to itself, never a one-unit limit
// it did not ask for. One unit's GPU has no step: validation wants
// min+step within the value.
func memoryCapacity(units uint64, unit gpushare.Unit) resourceapi.DeviceCapacity {
	value, one := Quantity(units, unit), Quantity(1, unit)
	r := &resourceapi.CapacityRequestPolicyRange{Min: ptr.To(one), Max: ptr.To(value)}
	if units > 1 {
		r.Step = ptr.To(one)
	}
	return resourceapi.DeviceCapacity{
		Value:         value,
		RequestPolicy: &resourceapi.CapacityRequestPolicy{Default: ptr.To(value), ValidRange: r},
	}
}

// attributes are the GPU's attributes; unknown ones are left out, since a
// claim's selector or matchAttribute must not match on a made-up value.
func attributes(g GPU) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	a := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		gpushare.DRAAttributeUUID:        {StringValue: ptr.To(g.UUID)},
		gpushare.DRAAttributeIndex:       {IntValue: ptr.To(int64(g.Index))},
		gpushare.DRAAttributeProductName: {StringValue: ptr.To(clip(g.Model))},
		gpushare.DRAAttributeIsolation:   {StringValue: ptr.To(string(g.Tier.OrNone()))},
	}
	putString(a, gpushare.DRAAttributeArchitecture, g.Architecture)
	putString(a, gpushare.DRAAttributeNVLinkDomain, g.NVLinkDomain)
	putVersion(a, gpushare.DRAAttributeCUDAComputeCapability, g.ComputeCapability)
	putVersion(a, gpushare.DRAAttributeDriverVersion, g.DriverVersion)
	if pciBDF.MatchString(g.PCIBusID) {
		a[gpushare.DRAAttributePCIBusID] = resourceapi.DeviceAttribute{StringValue: ptr.To(g.PCIBusID)}
	}
	// A GPU without NUMA affinity must not publish the standard attribute.
	if g.NUMANode >= 0 {
		a[gpushare.DRAAttributeNUMANode] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(g.NUMANode))}
	}
	if g.Simulated {
		a[gpushare.DRAAttributeSimulated] = resourceapi.DeviceAttribute{BoolValue: ptr.To(true)}
	}
	return a
}

// pciBDF is the extended BDF form the standard pciBusID attribute takes.
var pciBDF = regexp.MustCompile(`^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]$`)

// leadingZeros matches the zeros that pad a version component.
var leadingZeros = regexp.MustCompile(`(^|\.)0+([0-9])`)

// semver is what a version attribute must be (semver.org 2.0.0, core only).
var semver = regexp.MustCompile(`^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$`)

func putString(a map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, name resourceapi.QualifiedName, v string) {
	if v != "" {
		a[name] = resourceapi.DeviceAttribute{StringValue: ptr.To(clip(v))}
	}
}

// putVersion adds v as a version, "9.0" as "9.0.0" and NVIDIA's
// zero-padded "535.104.05" as "535.104.5"; one that is no version is left
// out rather than published as something it is not.
func putVersion(a map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, name resourceapi.QualifiedName, v string) {
	if strings.Count(v, ".") == 1 {
		v += ".0"
	}
	v = leadingZeros.ReplaceAllString(v, "$1$2")
	if semver.MatchString(v) && len(v) <= maxAttributeString {
		a[name] = resourceapi.DeviceAttribute{VersionValue: ptr.To(v)}
	}
}

// clip keeps a string attribute within the API's limit.
func clip(s string) string {
	if len(s) > maxAttributeString {
		return s[:maxAttributeString]
	}
	return s
}

// Resources is what the node publishes: one pool named after the node,
// its devices in slices of at most 64.
func Resources(node string, devices []resourceapi.Device) resourceslice.DriverResources {
	pool := resourceslice.Pool{}
	for start := 0; start < len(devices); start += maxDevicesWithTaints {
		end := min(start+maxDevicesWithTaints, len(devices))
		pool.Slices = append(pool.Slices, resourceslice.Slice{Devices: devices[start:end]})
	}
	if len(pool.Slices) == 0 {
		pool.Slices = []resourceslice.Slice{{}} // an empty pool says the node has none
	}
	return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{node: pool}}
}
