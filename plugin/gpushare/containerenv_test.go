package gpushare_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

func TestEncodeContainerEnvs(t *testing.T) {
	tests := []struct {
		name     string
		in       gpushare.ContainerEnvs
		want     string
		wantPath string // path named in the error; "-" for success
	}{
		{"empty", gpushare.ContainerEnvs{}, `{}`, "-"},
		{"nil", nil, `{}`, "-"},
		{"one", gpushare.ContainerEnvs{"main": {GPUIndex: 3, PodUnits: 4, ContainerUnits: 2, DevUnits: 80}},
			`{"main":{"gpu":3,"pod":4,"container":2,"dev":80}}`, "-"},
		{"sorted names and isolation off", gpushare.ContainerEnvs{
			"sidecar": {GPUIndex: 0, PodUnits: 6, ContainerUnits: 1, DevUnits: 15, DisableIsolation: true},
			"app":     {GPUIndex: 1, PodUnits: 6, ContainerUnits: 5, DevUnits: 15},
		}, `{"app":{"gpu":1,"pod":6,"container":5,"dev":15},"sidecar":{"gpu":0,"pod":6,"container":1,"dev":15,"cgpuDisable":true}}`, "-"},
		{"tier and share after the contract's fields", gpushare.ContainerEnvs{
			"a": {GPUIndex: 2, PodUnits: 4, ContainerUnits: 4, DevUnits: 80, Isolation: gpushare.IsolationMPS, ComputePercent: 25},
			"b": {GPUIndex: 2, PodUnits: 4, ContainerUnits: 4, DevUnits: 80, DisableIsolation: true, Isolation: gpushare.IsolationNone},
			"c": {GPUIndex: 2, PodUnits: 4, ContainerUnits: 4, DevUnits: 80, Isolation: gpushare.IsolationHAMiCore},
		}, `{"a":{"gpu":2,"pod":4,"container":4,"dev":80,"isolation":"mps","computePercent":25},` +
			`"b":{"gpu":2,"pod":4,"container":4,"dev":80,"cgpuDisable":true,"isolation":"none"},` +
			`"c":{"gpu":2,"pod":4,"container":4,"dev":80,"isolation":"hami-core"}}`, "-"},
		{"tier any", gpushare.ContainerEnvs{"a": {GPUIndex: 0, PodUnits: 1, ContainerUnits: 1, DevUnits: 1, Isolation: gpushare.IsolationAny}}, "", `"a".isolation`},
		{"unknown tier", gpushare.ContainerEnvs{"a": {GPUIndex: 0, PodUnits: 1, ContainerUnits: 1, DevUnits: 1, Isolation: "cgpu"}}, "", `"a".isolation`},
		{"share without a tier", gpushare.ContainerEnvs{"a": {GPUIndex: 0, PodUnits: 1, ContainerUnits: 1, DevUnits: 1, ComputePercent: 10}}, "", `"a".computePercent`},
		{"share on tier none", gpushare.ContainerEnvs{"a": {GPUIndex: 0, PodUnits: 1, ContainerUnits: 1, DevUnits: 1, Isolation: "none", ComputePercent: 10}}, "", `"a".computePercent`},
		{"share above 100", gpushare.ContainerEnvs{"a": {GPUIndex: 0, PodUnits: 1, ContainerUnits: 1, DevUnits: 1, Isolation: "mps", ComputePercent: 101}}, "", `"a".computePercent`},
		{"negative share", gpushare.ContainerEnvs{"a": {GPUIndex: 0, PodUnits: 1, ContainerUnits: 1, DevUnits: 1, Isolation: "mps", ComputePercent: -1}}, "", `"a".computePercent`},
		{"bad name", gpushare.ContainerEnvs{"Main": {GPUIndex: 0, PodUnits: 1, ContainerUnits: 1, DevUnits: 1}}, "", `"Main"`},
		{"empty name", gpushare.ContainerEnvs{"": {GPUIndex: 0, PodUnits: 1, ContainerUnits: 1, DevUnits: 1}}, "", `""`},
		{"GPU out of range", gpushare.ContainerEnvs{"a": {GPUIndex: 64, PodUnits: 1, ContainerUnits: 1, DevUnits: 1}}, "", `"a".gpu`},
		{"negative GPU", gpushare.ContainerEnvs{"a": {GPUIndex: -1, PodUnits: 1, ContainerUnits: 1, DevUnits: 1}}, "", `"a".gpu`},
		{"zero container", gpushare.ContainerEnvs{"a": {GPUIndex: 0, PodUnits: 1, ContainerUnits: 0, DevUnits: 1}}, "", `"a".container`},
		{"zero dev", gpushare.ContainerEnvs{"a": {GPUIndex: 0, PodUnits: 1, ContainerUnits: 1, DevUnits: 0}}, "", `"a".dev`},
		{"pod below container", gpushare.ContainerEnvs{"a": {GPUIndex: 0, PodUnits: 1, ContainerUnits: 2, DevUnits: 4}}, "", `"a".pod`},
		{"pod above limit", gpushare.ContainerEnvs{"a": {GPUIndex: 0, PodUnits: gpushare.MaxUnits + 1, ContainerUnits: 2, DevUnits: 4}}, "", `"a".pod`},
	}
	for _, tt := range tests {
		got, err := gpushare.EncodeContainerEnvs(tt.in)
		if tt.wantPath == "-" {
			if err != nil || got != tt.want {
				t.Errorf("%s: Encode = %q, %v; want %q", tt.name, got, err, tt.want)
				continue
			}
			back, err := gpushare.DecodeContainerEnvs(got)
			if err != nil || (len(tt.in) > 0 && !reflect.DeepEqual(back, tt.in)) || (len(tt.in) == 0 && len(back) != 0) {
				t.Errorf("%s: round trip = %v, %v; want %v", tt.name, back, err, tt.in)
			}
			continue
		}
		var ce *gpushare.ContainerEnvsError
		if !errors.Is(err, gpushare.ErrInvalidContainerEnvs) || !errors.As(err, &ce) || ce.Path != tt.wantPath {
			t.Errorf("%s: Encode error = %v; want *ContainerEnvsError at %s", tt.name, err, tt.wantPath)
		}
	}
}

func TestDecodeContainerEnvs(t *testing.T) {
	tests := []struct {
		name     string
		in       string
		want     gpushare.ContainerEnvs
		wantPath string // "-" for success
	}{
		{"empty object", `{}`, gpushare.ContainerEnvs{}, "-"},
		{"one", `{"main":{"gpu":1,"pod":4,"container":4,"dev":15}}`, gpushare.ContainerEnvs{"main": {GPUIndex: 1, PodUnits: 4, ContainerUnits: 4, DevUnits: 15}}, "-"},
		{"spaces and unknown field", ` { "main" : { "gpu" : 1 , "pod" : 4 , "container" : 4 , "dev" : 15 , "future" : [1] } } `,
			gpushare.ContainerEnvs{"main": {GPUIndex: 1, PodUnits: 4, ContainerUnits: 4, DevUnits: 15}}, "-"},
		{"isolation explicitly on", `{"a":{"gpu":0,"pod":1,"container":1,"dev":1,"cgpuDisable":false}}`, gpushare.ContainerEnvs{"a": {PodUnits: 1, ContainerUnits: 1, DevUnits: 1}}, "-"},
		{"isolation off", `{"a":{"gpu":0,"pod":1,"container":1,"dev":1,"cgpuDisable":true}}`, gpushare.ContainerEnvs{"a": {PodUnits: 1, ContainerUnits: 1, DevUnits: 1, DisableIsolation: true}}, "-"},
		{"not JSON", `main=0`, nil, ""},
		{"null", `null`, nil, ""},
		{"array", `[]`, nil, ""},
		{"trailing garbage", `{} x`, nil, ""},
		{"entry null", `{"a":null}`, nil, `"a"`},
		{"entry not object", `{"a":3}`, nil, `"a"`},
		{"missing dev", `{"a":{"gpu":0,"pod":1,"container":1}}`, nil, `"a".dev`},
		{"float units", `{"a":{"gpu":0,"pod":1.5,"container":1,"dev":1}}`, nil, `"a".pod`},
		{"exponent units", `{"a":{"gpu":0,"pod":1e2,"container":1,"dev":1}}`, nil, `"a".pod`},
		{"string units", `{"a":{"gpu":0,"pod":"1","container":1,"dev":1}}`, nil, `"a".pod`},
		{"negative GPU", `{"a":{"gpu":-1,"pod":1,"container":1,"dev":1}}`, nil, `"a".gpu`},
		{"GPU too large", `{"a":{"gpu":64,"pod":1,"container":1,"dev":1}}`, nil, `"a".gpu`},
		{"huge units", `{"a":{"gpu":0,"pod":99999999999999999999999,"container":1,"dev":1}}`, nil, `"a".pod`},
		{"zero container", `{"a":{"gpu":0,"pod":1,"container":0,"dev":1}}`, nil, `"a".container`},
		{"pod below container", `{"a":{"gpu":0,"pod":1,"container":2,"dev":4}}`, nil, `"a".pod`},
		{"bad name", `{"a_b":{"gpu":0,"pod":1,"container":1,"dev":1}}`, nil, `"a_b"`},
		{"bad cgpu flag", `{"a":{"gpu":0,"pod":1,"container":1,"dev":1,"cgpuDisable":"yes"}}`, nil, `"a"`},
		{"tier and share", `{"a":{"gpu":0,"pod":1,"container":1,"dev":1,"isolation":"hami-core","computePercent":100}}`,
			gpushare.ContainerEnvs{"a": {PodUnits: 1, ContainerUnits: 1, DevUnits: 1, Isolation: "hami-core", ComputePercent: 100}}, "-"},
		{"null tier and share", `{"a":{"gpu":0,"pod":1,"container":1,"dev":1,"isolation":null,"computePercent":null}}`,
			gpushare.ContainerEnvs{"a": {PodUnits: 1, ContainerUnits: 1, DevUnits: 1}}, "-"},
		{"tier any", `{"a":{"gpu":0,"pod":1,"container":1,"dev":1,"isolation":"any"}}`, nil, `"a".isolation`},
		{"empty tier", `{"a":{"gpu":0,"pod":1,"container":1,"dev":1,"isolation":""}}`, nil, `"a".isolation`},
		{"tier not a string", `{"a":{"gpu":0,"pod":1,"container":1,"dev":1,"isolation":1}}`, nil, `"a"`},
		{"share zero", `{"a":{"gpu":0,"pod":1,"container":1,"dev":1,"isolation":"mps","computePercent":0}}`, nil, `"a".computePercent`},
		{"share above 100", `{"a":{"gpu":0,"pod":1,"container":1,"dev":1,"isolation":"mps","computePercent":101}}`, nil, `"a".computePercent`},
		{"share as a string", `{"a":{"gpu":0,"pod":1,"container":1,"dev":1,"isolation":"mps","computePercent":"5"}}`, nil, `"a".computePercent`},
		{"share as a float", `{"a":{"gpu":0,"pod":1,"container":1,"dev":1,"isolation":"mps","computePercent":5.0}}`, nil, `"a".computePercent`},
		{"share without a tier", `{"a":{"gpu":0,"pod":1,"container":1,"dev":1,"computePercent":5}}`, nil, `"a".computePercent`},
		{"share on tier none", `{"a":{"gpu":0,"pod":1,"container":1,"dev":1,"isolation":"none","computePercent":5}}`, nil, `"a".computePercent`},
	}
	for _, tt := range tests {
		got, err := gpushare.DecodeContainerEnvs(tt.in)
		if tt.wantPath == "-" {
			if err != nil || !reflect.DeepEqual(got, tt.want) {
				t.Errorf("%s: Decode = %v, %v; want %v", tt.name, got, err, tt.want)
			}
			continue
		}
		var ce *gpushare.ContainerEnvsError
		if !errors.Is(err, gpushare.ErrInvalidContainerEnvs) || !errors.As(err, &ce) {
			t.Errorf("%s: Decode error = %v; want *ContainerEnvsError", tt.name, err)
			continue
		}
		if tt.wantPath != "" && ce.Path != tt.wantPath {
			t.Errorf("%s: error path %q (%v); want %q", tt.name, ce.Path, err, tt.wantPath)
		}
		if got != nil {
			t.Errorf("%s: Decode returned %v with its error", tt.name, got)
		}
	}
}

// A record written before tiers keeps its bytes through a decode and an
// encode: the new fields are written only when set.
func TestContainerEnvsWithoutTierKeepTheirBytes(t *testing.T) {
	for _, old := range []string{
		`{"main":{"gpu":3,"pod":4,"container":2,"dev":80}}`,
		`{"app":{"gpu":1,"pod":6,"container":5,"dev":15},"sidecar":{"gpu":0,"pod":6,"container":1,"dev":15,"cgpuDisable":true}}`,
	} {
		rec, err := gpushare.DecodeContainerEnvs(old)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := gpushare.EncodeContainerEnvs(rec); err != nil || got != old {
			t.Errorf("re-encoded %s as %s, %v", old, got, err)
		}
	}
}

// A record and the environment it describes read back as the same
// ContainerEnv, tier and share included: the soak compares the two.
func TestRecordAndEnvironmentAgree(t *testing.T) {
	for _, e := range []gpushare.ContainerEnv{
		{GPUIndex: 3, PodUnits: 8, ContainerUnits: 6, DevUnits: 79},
		{GPUIndex: 3, PodUnits: 8, ContainerUnits: 6, DevUnits: 79, Isolation: gpushare.IsolationNone},
		{GPUIndex: 0, PodUnits: 1, ContainerUnits: 1, DevUnits: 1, Isolation: gpushare.IsolationMPS, ComputePercent: 1},
		{GPUIndex: 63, PodUnits: 2, ContainerUnits: 1, DevUnits: 40, Isolation: gpushare.IsolationHAMiCore, ComputePercent: 100, DisableIsolation: true},
	} {
		enc, err := gpushare.EncodeContainerEnvs(gpushare.ContainerEnvs{"c": e})
		if err != nil {
			t.Fatal(err)
		}
		rec, err := gpushare.DecodeContainerEnvs(enc)
		if err != nil {
			t.Fatal(err)
		}
		fromEnv, err := gpushare.ParseContainerEnv(e.Map())
		if err != nil || fromEnv != e || rec["c"] != e {
			t.Errorf("%+v: record %s reads %+v, environment %v reads %+v, %v", e, enc, rec["c"], e.Map(), fromEnv, err)
		}
	}
}

// A huge value is clipped in the error, so it cannot flood logs or events.
func TestDecodeContainerEnvsClipsHugeNames(t *testing.T) {
	name := strings.Repeat("x", 10000)
	_, err := gpushare.DecodeContainerEnvs(`{"` + name + `":{"gpu":0,"pod":1,"container":1,"dev":1}}`)
	if err == nil || len(err.Error()) > 1000 {
		t.Fatalf("error for a 10000-character name is %d characters long: %v", len(err.Error()), err)
	}
}

// FuzzDecodeContainerEnvs checks that decoding never panics, fails only with
// ErrInvalidContainerEnvs, and that whatever it accepts encodes and decodes back
// to the same record.
func FuzzDecodeContainerEnvs(f *testing.F) {
	f.Add(`{"main":{"gpu":1,"pod":4,"container":4,"dev":15}}`)
	f.Add(`{}`)
	f.Add(`{"a":{"gpu":0,"pod":1.5,"container":1,"dev":1}}`)
	f.Add(`{"a":{"gpu":0,"pod":1,"container":1,"dev":1,"isolation":"mps","computePercent":50}}`)
	f.Add(`{"a":{"gpu":0,"pod":1,"container":1,"dev":1,"isolation":"none","computePercent":50}}`)
	f.Fuzz(func(t *testing.T, s string) {
		got, err := gpushare.DecodeContainerEnvs(s)
		if err != nil {
			if !errors.Is(err, gpushare.ErrInvalidContainerEnvs) {
				t.Fatalf("Decode(%q) error %v is not ErrInvalidContainerEnvs", s, err)
			}
			return
		}
		enc, err := gpushare.EncodeContainerEnvs(got)
		if err != nil {
			t.Fatalf("Encode(Decode(%q)) = %v", s, err)
		}
		back, err := gpushare.DecodeContainerEnvs(enc)
		if err != nil || !reflect.DeepEqual(back, got) {
			t.Fatalf("round trip %q → %q → %v, %v; want %v", s, enc, back, err, got)
		}
	})
}
