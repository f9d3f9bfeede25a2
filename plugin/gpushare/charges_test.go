package gpushare

import (
	"errors"
	"maps"
	"testing"
)

func TestCharges(t *testing.T) {
	regular := func(i int, units uint64) ContainerRequest {
		return ContainerRequest{Name: "c" + uintString(uint64(i)), Index: i, Units: units}
	}
	initC := func(i int, units uint64, sidecar bool) ContainerRequest {
		return ContainerRequest{Name: "i" + uintString(uint64(i)), Index: i, Init: true, Sidecar: sidecar, Units: units}
	}
	tests := []struct {
		name    string
		asg     PodAssignment
		reqs    []ContainerRequest
		want    map[int]uint64
		wantErr error
	}{{
		name: "one GPU by index: the whole request",
		asg:  PodAssignment{GPUIndex: 2},
		reqs: []ContainerRequest{regular(0, 3), regular(1, 4)},
		want: map[int]uint64{2: 7},
	}, {
		name: "init bigger than regular on one GPU: the init peak",
		asg:  PodAssignment{GPUIndex: 0},
		reqs: []ContainerRequest{initC(0, 10, false), regular(0, 3)},
		want: map[int]uint64{0: 10},
	}, {
		name: "split: init peak stays on the index GPU, the other GPU holds only its container",
		asg:  PodAssignment{GPUIndex: 0, Allocation: Allocation{0: {0: 3}, 1: {1: 8}}},
		reqs: []ContainerRequest{initC(0, 5, false), regular(0, 3), regular(1, 8)},
		want: map[int]uint64{0: 5, 1: 8},
	}, {
		name: "split with a sidecar on the index GPU: sidecar plus the regular container there",
		asg:  PodAssignment{GPUIndex: 1, Allocation: Allocation{0: {1: 2}, 1: {3: 6}}},
		reqs: []ContainerRequest{initC(0, 1, true), regular(0, 2), regular(1, 6)},
		want: map[int]uint64{1: 3, 3: 6},
	}, {
		name:    "allocation disagreeing with the request",
		asg:     PodAssignment{GPUIndex: 0, Allocation: Allocation{0: {0: 9}}},
		reqs:    []ContainerRequest{regular(0, 3)},
		wantErr: ErrAssignmentMismatch,
	}, {
		name:    "split init containers without an index GPU",
		asg:     PodAssignment{GPUIndex: -1, Allocation: Allocation{0: {0: 3}, 1: {1: 8}}},
		reqs:    []ContainerRequest{initC(0, 5, false), regular(0, 3), regular(1, 8)},
		wantErr: ErrAssignmentMismatch,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.asg.Charges(tt.reqs)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(got, tt.want) {
				t.Errorf("charges = %v, want %v", got, tt.want)
			}
		})
	}
}
