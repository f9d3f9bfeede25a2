package gpushare_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

func TestSentinelsAreDistinct(t *testing.T) {
	all := []error{
		gpushare.ErrInvalidUnit, gpushare.ErrInvalidRequest, gpushare.ErrInvalidAllocation,
		gpushare.ErrMalformedAnnotation, gpushare.ErrAssignmentMismatch, gpushare.ErrMultiGPUContainer,
		gpushare.ErrInvalidNodeGPUs, gpushare.ErrInvalidGPUList, gpushare.ErrInvalidEnv,
	}
	for i, a := range all {
		for j, b := range all {
			if i != j && errors.Is(a, b) {
				t.Errorf("%v matches %v", a, b)
			}
		}
	}
}

func TestErrorMessagesClipHugeValues(t *testing.T) {
	huge := strings.Repeat("x", 10000)
	_, _, err := gpushare.DecodePodAssignment(map[string]string{gpushare.AnnotationAllocation: huge})
	if err == nil || len(err.Error()) > 400 {
		t.Fatalf("error for a huge value is %d bytes long", len(err.Error()))
	}
	if !strings.Contains(err.Error(), gpushare.AnnotationAllocation) {
		t.Errorf("error %q does not name the key", err)
	}
}

// TestErrorMessages checks that each message carries what an operator needs
// to find the problem: the value and where it sits.
func TestErrorMessages(t *testing.T) {
	tests := []struct {
		err  error
		want []string
	}{
		{&gpushare.UnitError{Value: "3MiB"}, []string{`"3MiB"`, "divides 1024"}},
		{&gpushare.RequestError{Pod: "ns/p", Container: "c", Value: "1500m", Reason: "is not a whole number of units"}, []string{"ns/p", `"c"`, `"1500m"`, "whole number"}},
		{&gpushare.RequestError{Value: "-1", Reason: "is negative"}, []string{`"-1" is negative`}},
		{&gpushare.AllocationError{Reason: "not a JSON object"}, []string{"allocation: not a JSON object"}},
		{&gpushare.AllocationError{Path: `"0"."1"`, Reason: "units must be positive"}, []string{`at "0"."1"`}},
		{&gpushare.AnnotationError{Key: "K", Value: "v", Err: errors.New("bad")}, []string{`K="v": bad`}},
		{&gpushare.AssignmentError{Container: "c", Index: 2, Reason: "r", Err: gpushare.ErrAssignmentMismatch}, []string{`containers[2] "c": r`}},
		{&gpushare.AssignmentError{Index: 1, Init: true, Reason: "r", Err: gpushare.ErrAssignmentMismatch}, []string{"initContainers[1]: r"}},
		{&gpushare.NodeGPUsError{Field: "gpus[0].units", Reason: "0 is outside"}, []string{"gpus[0].units: 0 is outside"}},
		{&gpushare.NodeGPUsError{Reason: "not valid JSON"}, []string{"description: not valid JSON"}},
		{&gpushare.GPUListError{Item: "x", Reason: "is not a non-negative decimal integer"}, []string{`item "x" is not`}},
		{&gpushare.EnvError{Key: "CGPU_DISABLE", Value: "1", Reason: "r"}, []string{`CGPU_DISABLE="1": r`}},
	}
	for _, tt := range tests {
		for _, w := range tt.want {
			if !strings.Contains(tt.err.Error(), w) {
				t.Errorf("%T message %q lacks %q", tt.err, tt.err.Error(), w)
			}
		}
	}
}
