package prepare

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

// Params are a claim's own settings, given as opaque configuration of this
// driver in the claim (or its DeviceClass):
//
//	config:
//	- opaque:
//	    driver: gpu-mem.gpushare.io
//	    parameters: {apiVersion: gpu-mem.gpushare.io/v1, kind: ClaimParameters, computePercent: 30}
//
// Compute is a parameter, not a second capacity: a capacity would have to
// be asked for by every claim or refuse those that ask for none.
type Params struct {
	// ComputePercent caps the claim's share of the GPU's SMs (1-100) on the
	// mps and hami-core tiers; 0 means no cap.
	ComputePercent int `json:"computePercent,omitempty"`
}

// paramsDoc is the parameters' wire form.
type paramsDoc struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Params
}

// ClaimParams reads the parameters of driver that apply to the requests of
// shares, from the configuration the allocation carries (the class's and
// the claim's, in that order). A later entry's setting replaces an earlier
// one's, as the DRA API orders them. Unknown fields, another apiVersion or
// kind, and a compute share outside 0-100 are refused.
func ClaimParams(claim *resourceapi.ResourceClaim, driver string, shares []Share) (Params, error) {
	var p Params
	if claim == nil || claim.Status.Allocation == nil {
		return p, nil
	}
	for i, c := range claim.Status.Allocation.Devices.Config {
		if c.Opaque == nil || c.Opaque.Driver != driver || !appliesTo(c.Requests, shares) {
			continue
		}
		got, err := decodeParams(c.Opaque.Parameters.Raw)
		if err != nil {
			return Params{}, fmt.Errorf("%w: configuration %d of driver %s: %w", ErrInvalidClaim, i, driver, err)
		}
		if got.ComputePercent != 0 {
			p.ComputePercent = got.ComputePercent
		}
	}
	return p, nil
}

// appliesTo tells whether a configuration for requests (none: all) covers
// a request of shares.
func appliesTo(requests []string, shares []Share) bool {
	if len(requests) == 0 {
		return true
	}
	return slices.ContainsFunc(shares, func(s Share) bool {
		return slices.Contains(requests, s.Request) || slices.Contains(requests, BaseRequest(s.Request))
	})
}

func decodeParams(raw []byte) (Params, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var d paramsDoc
	if err := dec.Decode(&d); err != nil {
		return Params{}, fmt.Errorf("parameters: %w", err)
	}
	if d.APIVersion != gpushare.DRAParamsAPIVersion || d.Kind != gpushare.DRAParamsKind {
		return Params{}, fmt.Errorf("parameters are %s %s, want apiVersion %s, kind %s", d.APIVersion, d.Kind, gpushare.DRAParamsAPIVersion, gpushare.DRAParamsKind)
	}
	if d.ComputePercent < 0 || d.ComputePercent > 100 {
		return Params{}, fmt.Errorf("computePercent %d is not within 0-100", d.ComputePercent)
	}
	return d.Params, nil
}
