package prepare_test

import (
	"errors"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpushare/gpushare/plugin/dra/prepare"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

// opaque is an allocation's configuration entry of driver for requests.
func opaque(driver, params string, requests ...string) resourceapi.DeviceAllocationConfiguration {
	return resourceapi.DeviceAllocationConfiguration{Source: resourceapi.AllocationConfigSourceClaim, Requests: requests,
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: driver, Parameters: runtime.RawExtension{Raw: []byte(params)}}}}
}

const params30 = `{"apiVersion":"gpu-mem.gpushare.io/v1","kind":"ClaimParameters","computePercent":30}`

func TestClaimParams(t *testing.T) {
	shares := []prepare.Share{{Request: "gpu", Pool: node, Device: dev(0), Units: 8}}
	for _, tc := range []struct {
		name    string
		config  []resourceapi.DeviceAllocationConfiguration
		want    int
		refused string
	}{
		{"none", nil, 0, ""},
		{"for every request", []resourceapi.DeviceAllocationConfiguration{opaque(gpushare.DRADriverName, params30)}, 30, ""},
		{"for this request", []resourceapi.DeviceAllocationConfiguration{opaque(gpushare.DRADriverName, params30, "gpu")}, 30, ""},
		{"for another request", []resourceapi.DeviceAllocationConfiguration{opaque(gpushare.DRADriverName, params30, "other")}, 0, ""},
		{"another driver's", []resourceapi.DeviceAllocationConfiguration{opaque("gpu.nvidia.com", `{"whatever":1}`)}, 0, ""},
		{"the claim's after the class's", []resourceapi.DeviceAllocationConfiguration{
			opaque(gpushare.DRADriverName, params30),
			opaque(gpushare.DRADriverName, `{"apiVersion":"gpu-mem.gpushare.io/v1","kind":"ClaimParameters","computePercent":55}`)}, 55, ""},
		{"unknown field", []resourceapi.DeviceAllocationConfiguration{opaque(gpushare.DRADriverName,
			`{"apiVersion":"gpu-mem.gpushare.io/v1","kind":"ClaimParameters","computePercent":30,"memory":"80Gi"}`)}, 0, "unknown field"},
		{"other kind", []resourceapi.DeviceAllocationConfiguration{opaque(gpushare.DRADriverName, `{"apiVersion":"v1","kind":"Pod"}`)}, 0, "want apiVersion"},
		{"over 100", []resourceapi.DeviceAllocationConfiguration{opaque(gpushare.DRADriverName,
			`{"apiVersion":"gpu-mem.gpushare.io/v1","kind":"ClaimParameters","computePercent":101}`)}, 0, "not within 0-100"},
		{"not JSON", []resourceapi.DeviceAllocationConfiguration{opaque(gpushare.DRADriverName, `computePercent: 30`)}, 0, "parameters"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := claim(result("gpu", 0, "8Gi"))
			c.Status.Allocation.Devices.Config = tc.config
			p, err := prepare.ClaimParams(c, gpushare.DRADriverName, shares)
			if tc.refused != "" {
				if !errors.Is(err, prepare.ErrInvalidClaim) || !strings.Contains(err.Error(), tc.refused) {
					t.Fatalf("ClaimParams: %v; want refused with %q", err, tc.refused)
				}
				return
			}
			if err != nil || p.ComputePercent != tc.want {
				t.Fatalf("ClaimParams = %+v, %v; want computePercent %d", p, err, tc.want)
			}
		})
	}
}

// TestBuildComputeShare: a claim's compute share reaches its tier's variable, and a tier that
// cannot cap compute refuses it rather than run it uncapped.
func TestBuildComputeShare(t *testing.T) {
	c := claim(result("gpu", 0, "8Gi"))
	cfg := prepare.Config{Unit: gpushare.GiB, Isolation: paths}
	shares, err := prepare.Shares(c, gpushare.DRADriverName, node, cfg.Unit)
	if err != nil {
		t.Fatal(err)
	}
	pc := prepare.Claim{UID: c.UID, Namespace: c.Namespace, Name: c.Name, Params: map[string]prepare.Params{"gpu": {ComputePercent: 30}}}
	ans, err := prepare.Build(pc, shares, gpus(gpushare.IsolationMPS), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if env := strings.Join(ans.Spec.Devices[0].ContainerEdits.Env, " "); !strings.Contains(env, gpushare.EnvMPSActiveThreadPercentage+"=30") {
		t.Errorf("mps claim with a 30%% compute share: edits %s lack %s=30", env, gpushare.EnvMPSActiveThreadPercentage)
	}
	if _, err := prepare.Build(pc, shares, gpus(gpushare.IsolationNone), cfg); !errors.Is(err, prepare.ErrInvalidClaim) || !strings.Contains(err.Error(), "compute share") {
		t.Errorf("a compute share on tier none: %v; want refused naming the compute share", err)
	}
}
