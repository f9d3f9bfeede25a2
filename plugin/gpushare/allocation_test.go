package gpushare_test

import (
	"errors"
	"reflect"
	"testing"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

func TestEncodeAllocation(t *testing.T) {
	tests := []struct {
		name string
		in   gpushare.Allocation
		want string
	}{
		{"one container", gpushare.Allocation{0: {0: 2}}, `{"0":{"0":2}}`},
		{"numeric key order", gpushare.Allocation{10: {3: 1}, 2: {11: 4, 1: 5}}, `{"2":{"1":5,"11":4},"10":{"3":1}}`},
		{"empty", gpushare.Allocation{}, `{}`},
		{"nil", nil, `{}`},
	}
	for _, tt := range tests {
		got, err := gpushare.EncodeAllocation(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("%s: EncodeAllocation = %q, %v; want %q", tt.name, got, err, tt.want)
		}
	}
}

func TestEncodeAllocationRejectsInvalid(t *testing.T) {
	for name, a := range map[string]gpushare.Allocation{
		"negative container": {-1: {0: 1}},
		"no GPU":             {0: {}},
		"nil GPUs":           {0: nil},
		"negative GPU":       {0: {-1: 1}},
		"GPU too high":       {0: {gpushare.MaxGPUsPerNode: 1}},
		"zero units":         {0: {0: 0}},
		"too many units":     {0: {0: gpushare.MaxUnits + 1}},
	} {
		_, err := gpushare.EncodeAllocation(a)
		var ae *gpushare.AllocationError
		if !errors.Is(err, gpushare.ErrInvalidAllocation) || !errors.As(err, &ae) {
			t.Errorf("%s: EncodeAllocation error = %v; want *AllocationError", name, err)
		}
	}
}

func TestDecodeAllocation(t *testing.T) {
	tests := []struct {
		in   string
		want gpushare.Allocation
	}{
		{`{"0":{"0":2}}`, gpushare.Allocation{0: {0: 2}}},
		{` { "0" : { "1" : 2 } , "3" : { "0" : 1 } } `, gpushare.Allocation{0: {1: 2}, 3: {0: 1}}},
		{`{"1":{"0":1,"1":1}}`, gpushare.Allocation{1: {0: 1, 1: 1}}}, // several GPUs decode; ContainerShare refuses them
		{`{"0":{"63":1048576}}`, gpushare.Allocation{0: {63: 1 << 20}}},
		{`{}`, gpushare.Allocation{}},
	}
	for _, tt := range tests {
		got, err := gpushare.DecodeAllocation(tt.in)
		if err != nil || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("DecodeAllocation(%s) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
}

func TestDecodeAllocationRejects(t *testing.T) {
	for _, in := range []string{
		``, `null`, `[]`, `"x"`, `1`, `{`, `{"0":{"0":2}`, `{"0":{"0":2}} x`,
		`{"a":{"0":1}}`, `{"-1":{"0":1}}`, `{"00":{"0":1}}`, `{"+1":{"0":1}}`, `{" 1":{"0":1}}`, `{"1.0":{"0":1}}`,
		`{"99999999999":{"0":1}}`,
		`{"0":{}}`, `{"0":null}`, `{"0":[]}`, `{"0":1}`, `{"0":"x"}`,
		`{"0":{"x":1}}`, `{"0":{"-1":1}}`, `{"0":{"64":1}}`, `{"0":{"01":1}}`,
		`{"0":{"0":0}}`, `{"0":{"0":-1}}`, `{"0":{"0":1.5}}`, `{"0":{"0":2.0}}`, `{"0":{"0":1e2}}`,
		`{"0":{"0":"2"}}`, `{"0":{"0":null}}`, `{"0":{"0":true}}`, `{"0":{"0":1048577}}`,
		`{"0":{"0":18446744073709551616}}`,
	} {
		_, err := gpushare.DecodeAllocation(in)
		var ae *gpushare.AllocationError
		if !errors.Is(err, gpushare.ErrInvalidAllocation) || !errors.As(err, &ae) {
			t.Errorf("DecodeAllocation(%s) error = %v; want *AllocationError", in, err)
		}
	}
}

func TestAllocationHelpers(t *testing.T) {
	a := gpushare.Allocation{0: {1: 2}, 1: {0: 3}, 2: {1: 4}, 3: {0: 1, 2: 1}}
	if got, want := a.UnitsByGPU(), map[int]uint64{0: 4, 1: 6, 2: 1}; !reflect.DeepEqual(got, want) {
		t.Errorf("UnitsByGPU = %v; want %v", got, want)
	}
	if got, want := a.GPUs(), []int{0, 1, 2}; !reflect.DeepEqual(got, want) {
		t.Errorf("GPUs = %v; want %v", got, want)
	}
	if s, ok, err := a.ContainerShare(2); err != nil || !ok || s != (gpushare.Share{GPU: 1, Units: 4}) {
		t.Errorf("ContainerShare(2) = %v, %v, %v", s, ok, err)
	}
	if _, ok, err := a.ContainerShare(9); ok || err != nil {
		t.Errorf("ContainerShare(9) = %v, %v; want absent", ok, err)
	}
	_, _, err := a.ContainerShare(3)
	var ae *gpushare.AssignmentError
	if !errors.Is(err, gpushare.ErrMultiGPUContainer) || !errors.As(err, &ae) || ae.Index != 3 {
		t.Errorf("ContainerShare(3) error = %v; want ErrMultiGPUContainer for index 3", err)
	}
}

func TestAllocationForGPU(t *testing.T) {
	reqs := []gpushare.ContainerRequest{
		{Name: "init", Index: 0, Init: true, Units: 9},
		{Name: "a", Index: 0, Units: 2},
		{Name: "b", Index: 2, Units: 3},
	}
	if got, want := gpushare.AllocationForGPU(reqs, 1), (gpushare.Allocation{0: {1: 2}, 2: {1: 3}}); !reflect.DeepEqual(got, want) {
		t.Errorf("AllocationForGPU = %v; want %v", got, want)
	}
	if got := gpushare.AllocationForGPU(reqs[:1], 1); got != nil {
		t.Errorf("AllocationForGPU(init only) = %v; want nil", got)
	}
}

func FuzzDecodeAllocation(f *testing.F) {
	for _, s := range []string{`{"0":{"0":2}}`, `{}`, `null`, `{"0":{}}`, `{"00":{"0":1}}`, `{"0":{"0":1.5}}`,
		`{"1":{"0":1,"1":1},"10":{"2":3}}`, `{"0":{"0":1},"0":{"1":1}}`, `[{"0":1}]`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, err := gpushare.DecodeAllocation(s)
		if err != nil {
			if !errors.Is(err, gpushare.ErrInvalidAllocation) {
				t.Fatalf("DecodeAllocation(%q) error %v is not ErrInvalidAllocation", s, err)
			}
			return
		}
		enc, err := gpushare.EncodeAllocation(a)
		if err != nil {
			t.Fatalf("EncodeAllocation(%v) of a decoded value: %v", a, err)
		}
		again, err := gpushare.DecodeAllocation(enc)
		if err != nil || !reflect.DeepEqual(again, a) {
			t.Fatalf("round trip %q → %q → %v, %v; want %v", s, enc, again, err, a)
		}
		if enc2, _ := gpushare.EncodeAllocation(again); enc2 != enc {
			t.Fatalf("encoding not deterministic: %q vs %q", enc, enc2)
		}
		for c := range a {
			if _, ok, err := a.ContainerShare(c); !ok && err == nil {
				t.Fatalf("ContainerShare(%d) absent for a listed container", c)
			}
		}
	})
}
