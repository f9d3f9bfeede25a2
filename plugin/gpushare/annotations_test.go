package gpushare_test

import (
	"errors"
	"reflect"
	"testing"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

// legacy returns the five annotations the old extender wrote at bind.
func legacy(idx string) map[string]string {
	return map[string]string{
		gpushare.AnnotationGPUIndex:   idx,
		gpushare.AnnotationPodUnits:   "4",
		gpushare.AnnotationDevUnits:   "15",
		gpushare.AnnotationAssigned:   "false",
		gpushare.AnnotationAssumeTime: "1700000000000000000",
	}
}

// with copies m and sets (or, for value "<absent>", deletes) one key.
func with(m map[string]string, key, value string) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		out[k] = v
	}
	if value == "<absent>" {
		delete(out, key)
	} else {
		out[key] = value
	}
	return out
}

func TestDecodePodAssignment(t *testing.T) {
	base := gpushare.PodAssignment{GPUIndex: 1, PodUnits: 4, DevUnits: 15, AssumeTime: 1700000000000000000}
	tests := []struct {
		name string
		in   map[string]string
		want gpushare.PodAssignment
		ok   bool
	}{
		{"nil annotations", nil, gpushare.PodAssignment{}, false},
		{"unrelated annotations", map[string]string{"a": "b"}, gpushare.PodAssignment{}, false},
		{"pending: no index", with(legacy("1"), gpushare.AnnotationGPUIndex, "<absent>"), gpushare.PodAssignment{}, false},
		{"legacy bind", legacy("1"), base, true},
		{"assigned by plugin", with(legacy("1"), gpushare.AnnotationAssigned, "true"),
			func() gpushare.PodAssignment { p := base; p.Assigned = true; return p }(), true},
		{"index only (lenient)", map[string]string{gpushare.AnnotationGPUIndex: "3"}, gpushare.PodAssignment{GPUIndex: 3}, true},
		{"no assume time", with(legacy("1"), gpushare.AnnotationAssumeTime, "<absent>"),
			func() gpushare.PodAssignment { p := base; p.AssumeTime = 0; return p }(), true},
		{"allocation wins", with(legacy("1"), gpushare.AnnotationAllocation, `{"0":{"1":2},"1":{"0":2}}`),
			func() gpushare.PodAssignment {
				p := base
				p.Allocation = gpushare.Allocation{0: {1: 2}, 1: {0: 2}}
				return p
			}(), true},
		{"allocation only", map[string]string{gpushare.AnnotationAllocation: `{"0":{"2":2}}`},
			gpushare.PodAssignment{GPUIndex: -1, Allocation: gpushare.Allocation{0: {2: 2}}}, true},
		{"empty allocation only", map[string]string{gpushare.AnnotationAllocation: `{}`}, gpushare.PodAssignment{}, false},
		{"empty allocation falls back to index", with(legacy("1"), gpushare.AnnotationAllocation, `{}`), base, true},
	}
	for _, tt := range tests {
		got, ok, err := gpushare.DecodePodAssignment(tt.in)
		if err != nil || ok != tt.ok || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s: DecodePodAssignment = %+v, %v, %v; want %+v, %v", tt.name, got, ok, err, tt.want, tt.ok)
		}
	}
}

func TestDecodePodAssignmentMalformed(t *testing.T) {
	tests := []struct {
		key, value string
	}{
		{gpushare.AnnotationGPUIndex, "abc"},
		{gpushare.AnnotationGPUIndex, "-1"},
		{gpushare.AnnotationGPUIndex, "64"},
		{gpushare.AnnotationGPUIndex, " 1"},
		{gpushare.AnnotationGPUIndex, "+1"},
		{gpushare.AnnotationGPUIndex, ""},
		{gpushare.AnnotationGPUIndex, "0,1"},
		{gpushare.AnnotationPodUnits, "1.5"},
		{gpushare.AnnotationPodUnits, "-4"},
		{gpushare.AnnotationPodUnits, "1048577"},
		{gpushare.AnnotationDevUnits, "x"},
		{gpushare.AnnotationAssigned, "yes"},
		{gpushare.AnnotationAssigned, "True"},
		{gpushare.AnnotationAssigned, ""},
		{gpushare.AnnotationAssumeTime, "x"},
		{gpushare.AnnotationAssumeTime, "-5"},
		{gpushare.AnnotationAssumeTime, "9223372036854775808"},
		{gpushare.AnnotationAllocation, `{"0":{"0":0}}`},
		{gpushare.AnnotationAllocation, `not json`},
	}
	for _, tt := range tests {
		_, ok, err := gpushare.DecodePodAssignment(with(legacy("1"), tt.key, tt.value))
		var ae *gpushare.AnnotationError
		if ok || !errors.Is(err, gpushare.ErrMalformedAnnotation) || !errors.As(err, &ae) || ae.Key != tt.key || ae.Value != tt.value {
			t.Errorf("%s=%q: got ok=%v err=%v; want *AnnotationError for that key", tt.key, tt.value, ok, err)
		}
		if tt.key == gpushare.AnnotationAllocation && !errors.Is(err, gpushare.ErrInvalidAllocation) {
			t.Errorf("%s=%q: error %v does not unwrap to ErrInvalidAllocation", tt.key, tt.value, err)
		}
	}
}

func TestPodAssignmentEncode(t *testing.T) {
	p := gpushare.PodAssignment{GPUIndex: 1, PodUnits: 4, DevUnits: 15, AssumeTime: 1700000000000000000}
	got, err := p.Encode()
	if err != nil || !reflect.DeepEqual(got, legacy("1")) {
		t.Fatalf("Encode = %v, %v; want %v", got, err, legacy("1"))
	}
	p.Assigned = true
	p.Allocation = gpushare.Allocation{0: {1: 4}}
	got, err = p.Encode()
	want := with(with(legacy("1"), gpushare.AnnotationAssigned, "true"), gpushare.AnnotationAllocation, `{"0":{"1":4}}`)
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("Encode = %v, %v; want %v", got, err, want)
	}
	back, ok, err := gpushare.DecodePodAssignment(got)
	if err != nil || !ok || !reflect.DeepEqual(back, p) {
		t.Fatalf("round trip = %+v, %v, %v; want %+v", back, ok, err, p)
	}
	onlyAlloc := gpushare.PodAssignment{GPUIndex: -1, Allocation: gpushare.Allocation{0: {2: 1}}}
	got, err = onlyAlloc.Encode()
	if _, has := got[gpushare.AnnotationGPUIndex]; err != nil || has {
		t.Fatalf("Encode(allocation only) = %v, %v; want no index key", got, err)
	}
}

func TestPodAssignmentEncodeRejects(t *testing.T) {
	for name, p := range map[string]gpushare.PodAssignment{
		"negative index":     {GPUIndex: -2},
		"index too high":     {GPUIndex: gpushare.MaxGPUsPerNode},
		"nothing assigned":   {GPUIndex: -1},
		"pod units too high": {PodUnits: gpushare.MaxUnits + 1},
		"dev units too high": {DevUnits: gpushare.MaxUnits + 1},
		"negative time":      {AssumeTime: -1},
		"bad allocation":     {Allocation: gpushare.Allocation{0: {0: 0}}},
	} {
		_, err := p.Encode()
		var ae *gpushare.AnnotationError
		if !errors.Is(err, gpushare.ErrMalformedAnnotation) || !errors.As(err, &ae) {
			t.Errorf("%s: Encode error = %v; want *AnnotationError", name, err)
		}
	}
}

func TestContainerGPUs(t *testing.T) {
	two := []gpushare.ContainerRequest{{Name: "a", Index: 0, Units: 2}, {Name: "b", Index: 2, Units: 3}}
	tests := []struct {
		name    string
		p       gpushare.PodAssignment
		reqs    []gpushare.ContainerRequest
		want    map[int]int
		wantErr error
	}{
		{"index only: all on it", gpushare.PodAssignment{GPUIndex: 1}, two, map[int]int{0: 1, 2: 1}, nil},
		{"allocation spreads", gpushare.PodAssignment{GPUIndex: 0, Allocation: gpushare.Allocation{0: {0: 2}, 2: {3: 3}}}, two,
			map[int]int{0: 0, 2: 3}, nil},
		{"allocation only", gpushare.PodAssignment{GPUIndex: -1, Allocation: gpushare.Allocation{0: {1: 2}, 2: {1: 3}}}, two,
			map[int]int{0: 1, 2: 1}, nil},
		{"init containers skipped", gpushare.PodAssignment{GPUIndex: 1},
			append([]gpushare.ContainerRequest{{Name: "i", Index: 0, Init: true, Units: 9}}, two...), map[int]int{0: 1, 2: 1}, nil},
		{"no requests", gpushare.PodAssignment{GPUIndex: 1}, nil, map[int]int{}, nil},
		{"allocation lacks a container", gpushare.PodAssignment{GPUIndex: 0, Allocation: gpushare.Allocation{0: {0: 2}}}, two,
			nil, gpushare.ErrAssignmentMismatch},
		{"units differ", gpushare.PodAssignment{GPUIndex: 0, Allocation: gpushare.Allocation{0: {0: 2}, 2: {0: 4}}}, two,
			nil, gpushare.ErrAssignmentMismatch},
		{"extra container charged", gpushare.PodAssignment{GPUIndex: 0, Allocation: gpushare.Allocation{0: {0: 2}, 1: {0: 1}, 2: {0: 3}}}, two,
			nil, gpushare.ErrAssignmentMismatch},
		{"container on two GPUs", gpushare.PodAssignment{GPUIndex: 0, Allocation: gpushare.Allocation{0: {0: 1, 1: 1}, 2: {0: 3}}}, two,
			nil, gpushare.ErrMultiGPUContainer},
	}
	for _, tt := range tests {
		got, err := tt.p.ContainerGPUs(tt.reqs)
		if tt.wantErr != nil {
			var ae *gpushare.AssignmentError
			if !errors.Is(err, tt.wantErr) || !errors.As(err, &ae) {
				t.Errorf("%s: error = %v; want %v as *AssignmentError", tt.name, err, tt.wantErr)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s: ContainerGPUs = %v, %v; want %v", tt.name, got, err, tt.want)
		}
	}
}

func TestGPUFor(t *testing.T) {
	initReq := gpushare.ContainerRequest{Name: "i", Index: 0, Init: true, Units: 1}
	tests := []struct {
		name    string
		p       gpushare.PodAssignment
		c       gpushare.ContainerRequest
		want    int
		wantErr error
	}{
		{"init uses the index", gpushare.PodAssignment{GPUIndex: 2, Allocation: gpushare.Allocation{0: {1: 1}}}, initReq, 2, nil},
		{"init on the allocation's only GPU", gpushare.PodAssignment{GPUIndex: -1, Allocation: gpushare.Allocation{0: {1: 1}, 1: {1: 1}}}, initReq, 1, nil},
		{"init with GPUs spread and no index", gpushare.PodAssignment{GPUIndex: -1, Allocation: gpushare.Allocation{0: {1: 1}, 1: {2: 1}}}, initReq, -1, gpushare.ErrAssignmentMismatch},
		{"multi-GPU error names the container", gpushare.PodAssignment{GPUIndex: -1, Allocation: gpushare.Allocation{0: {1: 1, 2: 1}}},
			gpushare.ContainerRequest{Name: "a", Index: 0, Units: 2}, -1, gpushare.ErrMultiGPUContainer},
	}
	for _, tt := range tests {
		got, err := tt.p.GPUFor(tt.c)
		if !errors.Is(err, tt.wantErr) || got != tt.want {
			t.Errorf("%s: GPUFor = %d, %v; want %d, %v", tt.name, got, err, tt.want, tt.wantErr)
		}
		var ae *gpushare.AssignmentError
		if err != nil && (!errors.As(err, &ae) || ae.Container != tt.c.Name) {
			t.Errorf("%s: error %v does not name container %q", tt.name, err, tt.c.Name)
		}
	}
}

// FuzzDecodePodAssignment fuzzes the six annotation values; bit i of present
// says whether the i-th key is set at all, as absence has its own meaning.
func FuzzDecodePodAssignment(f *testing.F) {
	keys := []string{
		gpushare.AnnotationGPUIndex, gpushare.AnnotationPodUnits, gpushare.AnnotationDevUnits,
		gpushare.AnnotationAssigned, gpushare.AnnotationAssumeTime, gpushare.AnnotationAllocation,
	}
	f.Add(uint8(0x1f), "1", "4", "15", "false", "1700000000000000000", "")
	f.Add(uint8(0x3f), "0", "4", "15", "true", "1", `{"0":{"0":2},"1":{"1":2}}`)
	f.Add(uint8(0x20), "", "", "", "", "", `{"0":{"3":1}}`)
	f.Add(uint8(0x21), "0", "", "", "", "", `{}`)
	f.Add(uint8(0x1f), "-1", "1.5", "x", "yes", "-5", "")
	f.Fuzz(func(t *testing.T, present uint8, idx, pod, dev, assigned, assume, alloc string) {
		in := map[string]string{}
		for i, v := range []string{idx, pod, dev, assigned, assume, alloc} {
			if present&(1<<i) != 0 {
				in[keys[i]] = v
			}
		}
		p, ok, err := gpushare.DecodePodAssignment(in)
		if err != nil {
			if ok || !errors.Is(err, gpushare.ErrMalformedAnnotation) {
				t.Fatalf("DecodePodAssignment(%v) = ok %v, error %v; want ErrMalformedAnnotation", in, ok, err)
			}
			return
		}
		if !ok {
			if !reflect.DeepEqual(p, gpushare.PodAssignment{}) {
				t.Fatalf("unassigned pod decoded to %+v", p)
			}
			return
		}
		enc, err := p.Encode()
		if err != nil {
			t.Fatalf("Encode(%+v) of a decoded value: %v", p, err)
		}
		again, ok, err := gpushare.DecodePodAssignment(enc)
		if err != nil || !ok || !reflect.DeepEqual(again, p) {
			t.Fatalf("round trip %v → %v → %+v, %v, %v; want %+v", in, enc, again, ok, err, p)
		}
	})
}
