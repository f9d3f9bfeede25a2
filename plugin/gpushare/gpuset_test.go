package gpushare_test

import (
	"reflect"
	"testing"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

func TestGPUSet(t *testing.T) {
	for _, tt := range []struct {
		name    string
		in      []int
		want    []int
		first   int
		str     string
		has     []int
		hasNot  []int
		wantLen int
	}{
		{name: "empty", in: nil, want: []int{}, first: -1, str: "", hasNot: []int{0, 1, 63, -1, 64}},
		{name: "zero", in: []int{0}, want: []int{0}, first: 0, str: "0", has: []int{0}, hasNot: []int{1, 63}, wantLen: 1},
		{name: "sixty-three", in: []int{63}, want: []int{63}, first: 63, str: "63", has: []int{63}, hasNot: []int{0, 62, 64}, wantLen: 1},
		{name: "both edges", in: []int{63, 0}, want: []int{0, 63}, first: 0, str: "0,63", has: []int{0, 63}, hasNot: []int{1, 62}, wantLen: 2},
		{name: "unordered with repeats", in: []int{3, 1, 3, 2, 1}, want: []int{1, 2, 3}, first: 1, str: "1,2,3", has: []int{1, 2, 3}, hasNot: []int{0, 4}, wantLen: 3},
		{name: "out of range ignored", in: []int{-1, 64, 1000, 5, -64}, want: []int{5}, first: 5, str: "5", has: []int{5}, hasNot: []int{-1, 64, 0, 63}, wantLen: 1},
		{name: "only out of range", in: []int{-1, 64}, want: []int{}, first: -1, str: "", hasNot: []int{-1, 64, 0, 63}},
		{name: "ten and two order numerically", in: []int{10, 2}, want: []int{2, 10}, first: 2, str: "2,10", has: []int{2, 10}, hasNot: []int{1, 0}, wantLen: 2},
	} {
		s := gpushare.NewGPUSet(tt.in...)
		if got := s.Indices(); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s: Indices() = %v; want %v", tt.name, got, tt.want)
		}
		if got := s.Len(); got != tt.wantLen {
			t.Errorf("%s: Len() = %d; want %d", tt.name, got, tt.wantLen)
		}
		if got := s.First(); got != tt.first {
			t.Errorf("%s: First() = %d; want %d", tt.name, got, tt.first)
		}
		if got := s.String(); got != tt.str {
			t.Errorf("%s: String() = %q; want %q", tt.name, got, tt.str)
		}
		for _, g := range tt.has {
			if !s.Has(g) {
				t.Errorf("%s: Has(%d) = false; want true", tt.name, g)
			}
		}
		for _, g := range tt.hasNot {
			if s.Has(g) {
				t.Errorf("%s: Has(%d) = true; want false", tt.name, g)
			}
		}
	}
}

// Sets are comparable values: the same GPUs make equal sets whatever the
// order they were given in, and every index gets its own bit.
func TestGPUSetEqualityAndBits(t *testing.T) {
	if gpushare.NewGPUSet(0, 1) != gpushare.NewGPUSet(1, 0) {
		t.Error("NewGPUSet(0, 1) != NewGPUSet(1, 0)")
	}
	if gpushare.NewGPUSet(0, 1) == gpushare.NewGPUSet(0, 2) {
		t.Error("NewGPUSet(0, 1) == NewGPUSet(0, 2)")
	}
	all := make([]int, gpushare.MaxGPUsPerNode)
	for i := range all {
		all[i] = i
		s := gpushare.NewGPUSet(i)
		if s.Len() != 1 || s.First() != i || !s.Has(i) {
			t.Errorf("NewGPUSet(%d) = %v: Len %d, First %d", i, s, s.Len(), s.First())
		}
	}
	full := gpushare.NewGPUSet(all...)
	if full.Len() != gpushare.MaxGPUsPerNode || !reflect.DeepEqual(full.Indices(), all) {
		t.Errorf("full set = %v (Len %d)", full.Indices(), full.Len())
	}
}

// String is the form ParseContainerEnv reads back from ALIYUN_COM_GPU_MEM_IDX
// and NVIDIA_VISIBLE_DEVICES.
func TestGPUSetStringParsesBack(t *testing.T) {
	for _, s := range []gpushare.GPUSet{
		gpushare.NewGPUSet(0, 1),
		gpushare.NewGPUSet(0, 63),
		gpushare.NewGPUSet(2, 10, 11),
		gpushare.NewGPUSet(62, 63),
	} {
		env := map[string]string{
			gpushare.EnvGPUIndex:       s.String(),
			gpushare.EnvVisibleDevices: s.String(),
			gpushare.EnvPodUnits:       "12",
			gpushare.EnvContainerUnits: "12",
			gpushare.EnvDevUnits:       "80",
		}
		got, err := gpushare.ParseContainerEnv(env)
		if err != nil {
			t.Errorf("%v: ParseContainerEnv = %v", s, err)
			continue
		}
		if got.GPUs != s || got.Set() != s || got.GPUIndex != s.First() {
			t.Errorf("%v: parsed GPUs %v, Set %v, GPUIndex %d", s, got.GPUs, got.Set(), got.GPUIndex)
		}
	}
}
