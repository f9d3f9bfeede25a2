package gpushare_test

import (
	"errors"
	"reflect"
	"testing"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

func TestParseUnhealthyGPUs(t *testing.T) {
	tests := []struct {
		in   string
		want []int
		bad  string // offending item; "" for success
	}{
		{"", nil, ""},
		{"   ", nil, ""},
		{"0", []int{0}, ""},
		{"0,2", []int{0, 2}, ""},
		{" 0 , 2 ", []int{0, 2}, ""},
		{"2,0,2", []int{0, 2}, ""},
		{"0,,2,", []int{0, 2}, ""},
		{"\t1\n", []int{1}, ""},
		{"63", []int{63}, ""},
		{"1,x", []int{1}, "x"},
		{"3,1,-1,2", []int{1, 3}, "-1"},
		{"64", nil, "64"},
		{"1.0", nil, "1.0"},
		{"+1", nil, "+1"},
		{"0 2", nil, "0 2"},
		{"99999999999999999999", nil, "99999999999999999999"},
	}
	for _, tt := range tests {
		got, err := gpushare.ParseUnhealthyGPUs(tt.in)
		if tt.bad != "" {
			var ge *gpushare.GPUListError
			if !errors.Is(err, gpushare.ErrInvalidGPUList) || !errors.As(err, &ge) || ge.Item != tt.bad {
				t.Errorf("ParseUnhealthyGPUs(%q) error = %v; want *GPUListError on %q", tt.in, err, tt.bad)
			}
		} else if err != nil {
			t.Errorf("ParseUnhealthyGPUs(%q) error = %v", tt.in, err)
		}
		if len(got) != len(tt.want) || (len(got) > 0 && !reflect.DeepEqual(got, tt.want)) {
			t.Errorf("ParseUnhealthyGPUs(%q) = %v; want %v", tt.in, got, tt.want)
		}
	}
}

func TestFormatUnhealthyGPUs(t *testing.T) {
	in := []int{2, 0, 2}
	if got := gpushare.FormatUnhealthyGPUs(in); got != "0,2" {
		t.Errorf("FormatUnhealthyGPUs = %q; want 0,2", got)
	}
	if !reflect.DeepEqual(in, []int{2, 0, 2}) {
		t.Error("FormatUnhealthyGPUs modified its argument")
	}
	if got := gpushare.FormatUnhealthyGPUs(nil); got != "" {
		t.Errorf("FormatUnhealthyGPUs(nil) = %q; want empty", got)
	}
}

func FuzzParseUnhealthyGPUs(f *testing.F) {
	for _, s := range []string{"", "0,2", " 0 , 2 ", "0,,2,", "2,0,2", "x", "-1", "64", "1,2,3,x,4"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := gpushare.ParseUnhealthyGPUs(s)
		if err != nil && !errors.Is(err, gpushare.ErrInvalidGPUList) {
			t.Fatalf("ParseUnhealthyGPUs(%q) error %v is not ErrInvalidGPUList", s, err)
		}
		for i, g := range got {
			if g < 0 || g >= gpushare.MaxGPUsPerNode || (i > 0 && got[i-1] >= g) {
				t.Fatalf("ParseUnhealthyGPUs(%q) = %v; want sorted unique indices in range", s, got)
			}
		}
		if err != nil {
			return
		}
		again, err := gpushare.ParseUnhealthyGPUs(gpushare.FormatUnhealthyGPUs(got))
		if err != nil || len(again) != len(got) || (len(got) > 0 && !reflect.DeepEqual(again, got)) {
			t.Fatalf("round trip %q → %v → %v, %v", s, got, again, err)
		}
	})
}
