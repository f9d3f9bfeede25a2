package gpushare_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

func TestParseIsolation(t *testing.T) {
	for in, want := range map[string]gpushare.Isolation{"none": "none", "mps": "mps", "hami-core": "hami-core", " mps ": "mps"} {
		if got, err := gpushare.ParseIsolation(in); err != nil || got != want {
			t.Errorf("ParseIsolation(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	// "any" is a pod's wish, never what a GPU or a node is.
	for _, in := range []string{"any", "", "MPS", "hami", "cgpu"} {
		if got, err := gpushare.ParseIsolation(in); !errors.Is(err, gpushare.ErrInvalidIsolation) {
			t.Errorf("ParseIsolation(%q) = %q, %v; want ErrInvalidIsolation", in, got, err)
		}
	}
}

func TestPodIsolationAndComputePercent(t *testing.T) {
	tests := []struct {
		ann         map[string]string
		tier        gpushare.Isolation
		percent     int
		tierErr, pc bool
	}{
		{nil, gpushare.IsolationAny, 0, false, false},
		{map[string]string{"gpushare.io/isolation": "any"}, gpushare.IsolationAny, 0, false, false},
		{map[string]string{"gpushare.io/isolation": "mps", "gpushare.io/compute-percent": "25"}, gpushare.IsolationMPS, 25, false, false},
		{map[string]string{"gpushare.io/isolation": "none"}, gpushare.IsolationNone, 0, false, false},
		{map[string]string{"gpushare.io/isolation": "hami-core", "gpushare.io/compute-percent": "100"}, gpushare.IsolationHAMiCore, 100, false, false},
		{map[string]string{"gpushare.io/isolation": "strict"}, "", 0, true, false},
		{map[string]string{"gpushare.io/compute-percent": "0"}, gpushare.IsolationAny, 0, false, true},
		{map[string]string{"gpushare.io/compute-percent": "101"}, gpushare.IsolationAny, 0, false, true},
		{map[string]string{"gpushare.io/compute-percent": "+5"}, gpushare.IsolationAny, 0, false, true},
		{map[string]string{"gpushare.io/compute-percent": "05"}, gpushare.IsolationAny, 0, false, true},
		{map[string]string{"gpushare.io/compute-percent": ""}, gpushare.IsolationAny, 0, false, true},
	}
	for _, tt := range tests {
		tier, err := gpushare.PodIsolation(tt.ann)
		if (err != nil) != tt.tierErr || tier != tt.tier || (err != nil && !errors.Is(err, gpushare.ErrInvalidIsolation)) {
			t.Errorf("PodIsolation(%v) = %q, %v", tt.ann, tier, err)
		}
		n, err := gpushare.PodComputePercent(tt.ann)
		if (err != nil) != tt.pc || n != tt.percent || (err != nil && !errors.Is(err, gpushare.ErrInvalidIsolation)) {
			t.Errorf("PodComputePercent(%v) = %d, %v", tt.ann, n, err)
		}
	}
}

// The message quotes the value once, clipped, so a user reads what they wrote.
func TestIsolationErrorMessage(t *testing.T) {
	_, err := gpushare.PodComputePercent(map[string]string{"gpushare.io/compute-percent": "lots"})
	if err == nil || !strings.Contains(err.Error(), `gpushare.io/compute-percent "lots" is not a whole number`) {
		t.Errorf("error = %v", err)
	}
	_, err = gpushare.PodIsolation(map[string]string{"gpushare.io/isolation": strings.Repeat("x", 500)})
	if err == nil || len(err.Error()) > 200 {
		t.Errorf("a 500-character tier gives a %d-character error: %v", len(err.Error()), err)
	}
}

func TestOffersLimitsOrNone(t *testing.T) {
	tiers := []gpushare.Isolation{"", gpushare.IsolationNone, gpushare.IsolationMPS, gpushare.IsolationHAMiCore}
	for _, gpu := range tiers {
		for _, want := range append(tiers[1:], gpushare.IsolationAny) {
			expect := want == gpushare.IsolationAny || want == gpu.OrNone()
			if got := gpu.Offers(want); got != expect {
				t.Errorf("%q.Offers(%q) = %v; want %v", gpu, want, got, expect)
			}
		}
		if got, expect := gpu.Limits(), gpu == gpushare.IsolationMPS || gpu == gpushare.IsolationHAMiCore; got != expect {
			t.Errorf("%q.Limits() = %v", gpu, got)
		}
	}
	if gpushare.Isolation("").OrNone() != gpushare.IsolationNone || gpushare.IsolationMPS.OrNone() != gpushare.IsolationMPS {
		t.Error("OrNone")
	}
}

func TestPodIsolationRequest(t *testing.T) {
	for _, tc := range []struct {
		ann     map[string]string
		tier    gpushare.Isolation
		percent int
		err     string
	}{
		{ann: nil, tier: gpushare.IsolationAny},
		{ann: map[string]string{gpushare.AnnotationIsolation: "mps", gpushare.AnnotationComputePercent: "30"}, tier: gpushare.IsolationMPS, percent: 30},
		{ann: map[string]string{gpushare.AnnotationComputePercent: "100"}, tier: gpushare.IsolationAny, percent: 100},
		{ann: map[string]string{gpushare.AnnotationIsolation: "none", gpushare.AnnotationComputePercent: "30"}, err: `gpushare.io/compute-percent "30" cannot be enforced with gpushare.io/isolation "none"`},
		{ann: map[string]string{gpushare.AnnotationIsolation: "exclusive"}, err: `gpushare.io/isolation "exclusive" is not one of`},
		{ann: map[string]string{gpushare.AnnotationComputePercent: "030"}, err: `gpushare.io/compute-percent "030" is not a whole number`},
	} {
		tier, percent, err := gpushare.PodIsolationRequest(tc.ann)
		switch {
		case tc.err != "" && (err == nil || !errors.Is(err, gpushare.ErrInvalidIsolation) || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%v: error %v, want ErrInvalidIsolation saying %q", tc.ann, err, tc.err)
		case tc.err == "" && (err != nil || tier != tc.tier || percent != tc.percent):
			t.Errorf("%v: %q %d %v, want %q %d", tc.ann, tier, percent, err, tc.tier, tc.percent)
		}
	}
}
