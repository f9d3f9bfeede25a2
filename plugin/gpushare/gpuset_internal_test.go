package gpushare

import (
	"strings"
	"testing"
)

func TestParseGPUList(t *testing.T) {
	for _, tt := range []struct {
		in     string
		want   GPUSet
		reason string // substring of the reason; "" for success
	}{
		{"0", NewGPUSet(0), ""},
		{"63", NewGPUSet(63), ""},
		{"0,1", NewGPUSet(0, 1), ""},
		{"0,63", NewGPUSet(0, 63), ""},
		{"2,10", NewGPUSet(2, 10), ""},
		{"1,0", 0, "ascending"},
		{"0,0", 0, "ascending"},
		{"10,2", 0, "ascending"},
		{"64", 0, "above the limit"},
		{"0,64", 0, "above the limit"},
		{"", 0, "empty"},
		{"0,", 0, "empty"},
		{",0", 0, "empty"},
		{"0,,1", 0, "empty"},
		{"0, 1", 0, "not a non-negative decimal integer"},
		{"-1", 0, "not a non-negative decimal integer"},
		{"GPU-abc", 0, "not a non-negative decimal integer"},
		{"0;1", 0, "not a non-negative decimal integer"},
		{"99999999999999999999999", 0, "above the limit"},
	} {
		got, reason := parseGPUList(tt.in)
		if tt.reason == "" {
			if reason != "" || got != tt.want {
				t.Errorf("parseGPUList(%q) = %v, %q; want %v", tt.in, got, reason, tt.want)
			}
			continue
		}
		if reason == "" || !strings.Contains(reason, tt.reason) || got != 0 {
			t.Errorf("parseGPUList(%q) = %v, %q; want 0 and a reason containing %q", tt.in, got, reason, tt.reason)
		}
	}
}

// Whatever String writes, parseGPUList reads back as the same set.
func TestParseGPUListRoundTrip(t *testing.T) {
	for _, s := range []GPUSet{
		NewGPUSet(0), NewGPUSet(63), NewGPUSet(0, 1), NewGPUSet(0, 63),
		NewGPUSet(1, 2, 3, 9, 10, 11, 40), GPUSet(^uint64(0)),
	} {
		got, reason := parseGPUList(s.String())
		if reason != "" || got != s {
			t.Errorf("parseGPUList(%q) = %v, %q; want %v", s.String(), got, reason, s)
		}
	}
}
