package slice_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	apiresource "k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/gpushare/gpushare/plugin/dra/slice"
	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/topology"
)

const h100UUID = "GPU-5a1d6a0e-7c3e-4f0d-9b8e-2f6c1b9d0a11"

func h100(index int) slice.GPU {
	return slice.GPU{Index: index, UUID: fmt.Sprintf("GPU-5a1d6a0e-7c3e-4f0d-9b8e-2f6c1b9d0a%02d", index), Model: "NVIDIA H100 80GB HBM3",
		MemoryMiB: 81559, PCIBusID: fmt.Sprintf("0000:%02x:00.0", 0x18+index), NUMANode: index / 4, NVLinkDomain: "nvlink-" + h100UUID,
		Architecture: "Hopper", ComputeCapability: "9.0", DriverVersion: "550.54.15", Tier: gpushare.IsolationMPS}
}

func TestDeviceName(t *testing.T) {
	for _, tc := range []struct {
		uuid, want string
	}{
		{h100UUID, "gpu-5a1d6a0e-7c3e-4f0d-9b8e-2f6c1b9d0a11"},
		{"GPU-ABCDEF01-0000-0000-0000-000000000000", "gpu-abcdef01-0000-0000-0000-000000000000"},
		{"", ""},
		{"GPU-", ""},
		{"5a1d6a0e", ""},
		{"GPU-has space", ""},
		{"GPU-" + strings.Repeat("a", 60), ""},
		{"GPU-under_score", ""},
	} {
		got, err := slice.DeviceName(tc.uuid)
		if got != tc.want || (err == nil) != (tc.want != "") {
			t.Errorf("DeviceName(%q) = %q, %v; want %q", tc.uuid, got, err, tc.want)
		}
		if err != nil && !errors.Is(err, slice.ErrInvalidGPU) {
			t.Errorf("DeviceName(%q): %v does not wrap ErrInvalidGPU", tc.uuid, err)
		}
	}
}

func TestDevicesCapacity(t *testing.T) {
	for _, tc := range []struct {
		name           string
		mib            uint64
		unit           gpushare.Unit
		value, minimum string
		step           string // "" for none
	}{
		{"H100 in GiB rounds down to 79", 81559, gpushare.GiB, "79Gi", "1Gi", "1Gi"},
		{"H100 in 256MiB", 81559, 256, "81408Mi", "256Mi", "256Mi"},
		{"H100 in MiB", 81559, gpushare.MiB, "81559Mi", "1Mi", "1Mi"},
		{"one unit has no step", 1500, gpushare.GiB, "1Gi", "1Gi", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := h100(0)
			g.MemoryMiB = tc.mib
			devs, err := slice.Devices([]slice.GPU{g}, tc.unit)
			if err != nil {
				t.Fatal(err)
			}
			c := devs[0].Capacity[gpushare.DRACapacityMemory]
			p := c.RequestPolicy
			if c.Value.String() != tc.value || p.ValidRange.Min.String() != tc.minimum || p.ValidRange.Max.String() != tc.value || p.Default.String() != tc.value {
				t.Errorf("capacity %s min %s max %s default %s; want value=max=default %s, min %s", c.Value.String(), p.ValidRange.Min.String(),
					p.ValidRange.Max.String(), p.Default.String(), tc.value, tc.minimum)
			}
			if got := quantityString(p.ValidRange.Step); got != tc.step {
				t.Errorf("step %q, want %q", got, tc.step)
			}
			if errs := validateDevice(devs[0]); len(errs) > 0 {
				t.Errorf("invalid device: %v", errs)
			}
		})
	}
}

func quantityString(q *apiresource.Quantity) string {
	if q == nil {
		return ""
	}
	return q.String()
}

func TestDevicesAttributesAndTaints(t *testing.T) {
	healthy, lost, unknown := h100(0), h100(1), h100(2)
	lost.Fault = &slice.Fault{Effect: resourceapi.DeviceTaintEffectNoExecute, Value: gpushare.DRATaintValueLost}
	unknown.PCIBusID, unknown.NUMANode, unknown.NVLinkDomain, unknown.Architecture, unknown.ComputeCapability, unknown.DriverVersion, unknown.Tier =
		"", -1, "", "", "", "", ""
	unknown.Simulated = true
	devs, err := slice.Devices([]slice.GPU{healthy, lost, unknown}, gpushare.GiB)
	if err != nil {
		t.Fatal(err)
	}
	a := devs[0].Attributes
	for name, want := range map[resourceapi.QualifiedName]string{
		gpushare.DRAAttributeUUID: healthy.UUID, gpushare.DRAAttributeProductName: "NVIDIA H100 80GB HBM3", gpushare.DRAAttributeArchitecture: "Hopper",
		gpushare.DRAAttributeIsolation: "mps", gpushare.DRAAttributeNVLinkDomain: "nvlink-" + h100UUID, gpushare.DRAAttributePCIBusID: "0000:18:00.0",
	} {
		if got := a[name].StringValue; got == nil || *got != want {
			t.Errorf("attribute %s = %v, want %q", name, got, want)
		}
	}
	if v := a[gpushare.DRAAttributeCUDAComputeCapability].VersionValue; v == nil || *v != "9.0.0" {
		t.Errorf("cudaComputeCapability = %v, want 9.0.0", v)
	}
	if v := a[gpushare.DRAAttributeDriverVersion].VersionValue; v == nil || *v != "550.54.15" {
		t.Errorf("driverVersion = %v, want 550.54.15", v)
	}
	if v := a[gpushare.DRAAttributeIndex].IntValue; v == nil || *v != 0 {
		t.Errorf("index = %v, want 0", v)
	}
	if v := a[gpushare.DRAAttributeNUMANode].IntValue; v == nil || *v != 0 {
		t.Errorf("numaNode = %v, want 0", v)
	}
	if len(devs[0].Taints) != 0 || devs[0].AllowMultipleAllocations == nil || !*devs[0].AllowMultipleAllocations {
		t.Errorf("healthy device: taints %v, allowMultipleAllocations %v", devs[0].Taints, devs[0].AllowMultipleAllocations)
	}
	want := resourceapi.DeviceTaint{Key: gpushare.DRATaintUnhealthy, Value: "lost", Effect: resourceapi.DeviceTaintEffectNoExecute}
	if len(devs[1].Taints) != 1 || devs[1].Taints[0] != want {
		t.Errorf("lost GPU's taints %v, want [%v]", devs[1].Taints, want)
	}
	u := devs[2].Attributes
	for _, name := range []resourceapi.QualifiedName{gpushare.DRAAttributePCIBusID, gpushare.DRAAttributeNUMANode, gpushare.DRAAttributeNVLinkDomain,
		gpushare.DRAAttributeArchitecture, gpushare.DRAAttributeCUDAComputeCapability, gpushare.DRAAttributeDriverVersion} {
		if _, ok := u[name]; ok {
			t.Errorf("unknown %s published: %v", name, u[name])
		}
	}
	if v := u[gpushare.DRAAttributeIsolation].StringValue; v == nil || *v != "none" {
		t.Errorf("isolation without a tier = %v, want none", v)
	}
	if v := u[gpushare.DRAAttributeSimulated].BoolValue; v == nil || !*v {
		t.Errorf("simulated = %v, want true", v)
	}
	for _, d := range devs {
		if errs := validateDevice(d); len(errs) > 0 {
			t.Errorf("device %s invalid: %v", d.Name, errs)
		}
	}
}

func TestDevicesRefuses(t *testing.T) {
	small, huge, badUUID, dup := h100(0), h100(1), h100(2), h100(3)
	small.MemoryMiB = 1000
	huge.MemoryMiB = (gpushare.MaxUnits + 1) * 1024
	badUUID.UUID = "MIG-1234"
	dup.Index = 4
	for name, tc := range map[string]struct {
		gpus []slice.GPU
		unit gpushare.Unit
	}{
		"smaller than a unit": {[]slice.GPU{small}, gpushare.GiB},
		"over MaxUnits":       {[]slice.GPU{huge}, gpushare.GiB},
		"bad UUID":            {[]slice.GPU{badUUID}, gpushare.GiB},
		"same UUID twice":     {[]slice.GPU{h100(3), dup}, gpushare.GiB},
		"invalid unit":        {[]slice.GPU{h100(0)}, 3},
	} {
		if _, err := slice.Devices(tc.gpus, tc.unit); !errors.Is(err, slice.ErrInvalidGPU) {
			t.Errorf("%s: err %v, want ErrInvalidGPU", name, err)
		}
	}
}

func TestResourcesSplitsAt64(t *testing.T) {
	for _, tc := range []struct{ devices, slices int }{{0, 1}, {8, 1}, {64, 1}, {65, 2}} {
		devs := make([]resourceapi.Device, tc.devices)
		r := slice.Resources("node-a", devs)
		pool, ok := r.Pools["node-a"]
		if !ok || len(r.Pools) != 1 || len(pool.Slices) != tc.slices {
			t.Errorf("%d devices: pools %v, %d slices; want pool node-a with %d", tc.devices, r.Pools, len(pool.Slices), tc.slices)
		}
	}
}

func TestNVLinkDomains(t *testing.T) {
	uuids := map[int]string{}
	var gpus []topology.GPU
	for i := range 4 {
		uuids[i] = fmt.Sprintf("GPU-%d", 9-i) // the smallest UUID is the highest index's
		gpus = append(gpus, topology.GPU{Index: i, NUMANode: 0})
	}
	islands := topology.Reading{GPUs: gpus, Pairs: []topology.Pair{{A: 0, B: 1, NVLinks: 4}, {A: 2, B: 3, NVLinks: 2}, {A: 1, B: 2, Level: topology.LevelSystem}}}
	switched := topology.Reading{GPUs: []topology.GPU{{Index: 0, SwitchLinks: 18}, {Index: 1, SwitchLinks: 18}, {Index: 2, SwitchLinks: 18}, {Index: 3}}}
	for name, tc := range map[string]struct {
		r    topology.Reading
		want map[int]string
	}{
		"islands":  {islands, map[int]string{0: "nvlink-GPU-8", 1: "nvlink-GPU-8", 2: "nvlink-GPU-6", 3: "nvlink-GPU-6"}},
		"pcie":     {topology.Reading{GPUs: gpus}, map[int]string{0: "nvlink-GPU-9", 1: "nvlink-GPU-8", 2: "nvlink-GPU-7", 3: "nvlink-GPU-6"}},
		"nvswitch": {switched, map[int]string{0: "nvlink-GPU-7", 1: "nvlink-GPU-7", 2: "nvlink-GPU-7", 3: "nvlink-GPU-6"}},
	} {
		got := slice.NVLinkDomains(tc.r, uuids)
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%s: %v, want %v", name, got, tc.want)
		}
	}
}

func TestArchitecture(t *testing.T) {
	for model, want := range map[string][2]string{
		"NVIDIA H100 80GB HBM3":      {"Hopper", "9.0"},
		"NVIDIA H200 141GB HBM3e":    {"Hopper", "9.0"},
		"NVIDIA B200 180GB HBM3e":    {"Blackwell", "10.0"},
		"NVIDIA A100-SXM4-40GB":      {"Ampere", "8.0"},
		"Mock NVIDIA A100-SXM4-40GB": {"Ampere", "8.0"},
		"NVIDIA A30-PCIE-24GB":       {"Ampere", "8.0"},
		"NVIDIA L4":                  {"Ada Lovelace", "8.9"},
		"Tesla T4":                   {"Turing", "7.5"},
		"NVIDIA GeForce RTX 9999":    {"", ""},
		"":                           {"", ""},
	} {
		arch, cc := slice.Architecture(model)
		if arch != want[0] || cc != want[1] {
			t.Errorf("Architecture(%q) = %q, %q; want %q, %q", model, arch, cc, want[0], want[1])
		}
	}
}

// validateDevice checks d against the resource.k8s.io rules a driver's
// device must meet (k8s.io/kubernetes pkg/apis/resource/validation, which
// the module cannot import without all of Kubernetes): a DNS-label name,
// at most 32 attributes and capacities, qualified names, string values
// within 64 bytes, and a consumable capacity's requestPolicy: default set,
// min <= default <= max <= value, min+step <= value, default and max on
// the step's grid from min; taints with a label-name key and label value.
func validateDevice(d resourceapi.Device) []string {
	var errs []string
	errs = append(errs, validation.IsDNS1123Label(d.Name)...)
	if n := len(d.Attributes) + len(d.Capacity); n > resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice {
		errs = append(errs, fmt.Sprintf("%d attributes and capacities", n))
	}
	for name, a := range d.Attributes {
		errs = append(errs, validation.IsQualifiedName(string(name))...)
		if a.StringValue != nil && len(*a.StringValue) > resourceapi.DeviceAttributeMaxValueLength {
			errs = append(errs, string(name)+" too long")
		}
	}
	for name, c := range d.Capacity {
		errs = append(errs, validateCapacity(string(name), c, d.AllowMultipleAllocations)...)
	}
	for _, taint := range d.Taints {
		errs = append(errs, validation.IsQualifiedName(taint.Key)...)
		errs = append(errs, validation.IsValidLabelValue(taint.Value)...)
	}
	return errs
}

func validateCapacity(name string, c resourceapi.DeviceCapacity, multi *bool) []string {
	p := c.RequestPolicy
	if p == nil {
		return nil
	}
	if multi == nil || !*multi {
		return []string{name + ": requestPolicy needs allowMultipleAllocations"}
	}
	r := p.ValidRange
	if p.Default == nil || r == nil || r.Min == nil {
		return []string{name + ": default and validRange.min are required"}
	}
	var errs []string
	value, def, minimum := c.Value.Value(), p.Default.Value(), r.Min.Value()
	if minimum > value || def < minimum {
		errs = append(errs, name+": min above value or default below min")
	}
	if r.Max != nil && (r.Max.Value() > value || def > r.Max.Value() || minimum > r.Max.Value()) {
		errs = append(errs, name+": max out of range")
	}
	if s := r.Step; s != nil {
		step := s.Value()
		if step <= 0 || minimum+step > value || (def-minimum)%step != 0 || (r.Max != nil && (r.Max.Value()-minimum)%step != 0) {
			errs = append(errs, name+": step")
		}
	}
	return errs
}

// TestDriverVersionAttribute: NVIDIA's versions become semantic versions, zero padding dropped;
// what is no version is left out.
func TestDriverVersionAttribute(t *testing.T) {
	for in, want := range map[string]string{
		"550.54.15": "550.54.15", "535.104.05": "535.104.5", "570.00.07": "570.0.7", "9.0": "9.0.0", "0.5.0": "0.5.0",
		"": "", "r550": "", "550.54.15.1": "",
	} {
		g := h100(0)
		g.DriverVersion = in
		devs, err := slice.Devices([]slice.GPU{g}, gpushare.GiB)
		if err != nil {
			t.Fatal(err)
		}
		got := ""
		if v := devs[0].Attributes[gpushare.DRAAttributeDriverVersion].VersionValue; v != nil {
			got = *v
		}
		if got != want {
			t.Errorf("driver version %q published as %q, want %q", in, got, want)
		}
	}
}
