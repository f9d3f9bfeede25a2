package gpushare_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

func TestPodMultiGPU(t *testing.T) {
	label := func(v string) map[string]string { return map[string]string{gpushare.LabelPodGPUCount: v} }
	topo := func(v string) map[string]string { return map[string]string{gpushare.AnnotationTopology: v} }
	four := []gpushare.ContainerRequest{regularReq("main", 0, 4)}
	for _, tt := range []struct {
		name        string
		labels      map[string]string
		annotations map[string]string
		reqs        []gpushare.ContainerRequest
		want        gpushare.MultiGPU
		field       string   // MultiGPUError.Field; "" for success
		msg         []string // substrings of the message
	}{
		{name: "absent", reqs: four, want: gpushare.MultiGPU{}},
		{name: "nil maps, no containers", want: gpushare.MultiGPU{}},
		{name: "other labels only", labels: map[string]string{"app": "x"}, reqs: four},
		{name: "one", labels: label("1"), reqs: []gpushare.ContainerRequest{regularReq("main", 0, 3)}, want: gpushare.MultiGPU{}},
		{name: "two", labels: label("2"), reqs: four, want: gpushare.MultiGPU{Count: 2}},
		{name: "four", labels: label("4"), reqs: []gpushare.ContainerRequest{regularReq("a", 0, 4), regularReq("b", 1, 8)}, want: gpushare.MultiGPU{Count: 4}},
		{name: "sixty-four", labels: label("64"), reqs: []gpushare.ContainerRequest{regularReq("a", 0, 128)}, want: gpushare.MultiGPU{Count: 64}},
		{name: "two without containers", labels: label("2"), want: gpushare.MultiGPU{Count: 2}},
		{name: "zero", labels: label("0"), reqs: four, field: "label " + gpushare.LabelPodGPUCount, msg: []string{`"0"`, "whole number from 1 to 64"}},
		{name: "leading zero", labels: label("01"), reqs: four, field: "label " + gpushare.LabelPodGPUCount, msg: []string{`"01"`}},
		{name: "leading zero two", labels: label("02"), reqs: four, field: "label " + gpushare.LabelPodGPUCount, msg: []string{`"02"`}},
		{name: "above the limit", labels: label("65"), reqs: four, field: "label " + gpushare.LabelPodGPUCount, msg: []string{`"65"`, "64"}},
		{name: "huge", labels: label("99999999999999999999999"), reqs: four, field: "label " + gpushare.LabelPodGPUCount},
		{name: "not a number", labels: label("x"), reqs: four, field: "label " + gpushare.LabelPodGPUCount, msg: []string{`"x"`}},
		{name: "empty", labels: label(""), reqs: four, field: "label " + gpushare.LabelPodGPUCount, msg: []string{"empty"}},
		{name: "sign", labels: label("+2"), reqs: four, field: "label " + gpushare.LabelPodGPUCount},
		{name: "spaces", labels: label(" 2"), reqs: four, field: "label " + gpushare.LabelPodGPUCount},
		{name: "negative", labels: label("-2"), reqs: four, field: "label " + gpushare.LabelPodGPUCount},
		{name: "topology required", labels: label("2"), annotations: topo("required"), reqs: four, want: gpushare.MultiGPU{Count: 2, LinksRequired: true}},
		{name: "topology preferred", labels: label("2"), annotations: topo("preferred"), reqs: four, want: gpushare.MultiGPU{Count: 2}},
		{name: "topology required on one GPU", annotations: topo("required"), reqs: four, want: gpushare.MultiGPU{LinksRequired: true}},
		{name: "topology bogus", labels: label("2"), annotations: topo("strict"), reqs: four, field: "annotation " + gpushare.AnnotationTopology, msg: []string{`"strict"`, "required", "preferred"}},
		{name: "topology case", labels: label("2"), annotations: topo("Required"), reqs: four, field: "annotation " + gpushare.AnnotationTopology},
		{name: "topology empty", annotations: topo(""), reqs: four, field: "annotation " + gpushare.AnnotationTopology},
		{
			name: "3 units over 2 GPUs", labels: label("2"),
			reqs:  []gpushare.ContainerRequest{regularReq("ok", 0, 4), regularReq("odd", 1, 3)},
			field: `container "odd"`, msg: []string{`"3 units"`, "multiple of 2", gpushare.LabelPodGPUCount},
		},
		{
			name: "init units not divisible", labels: label("2"),
			reqs:  []gpushare.ContainerRequest{initReq("setup", 0, 5), regularReq("main", 0, 4)},
			field: `container "setup"`, msg: []string{`"5 units"`},
		},
		{
			name: "units below the count", labels: label("4"),
			reqs:  []gpushare.ContainerRequest{regularReq("tiny", 0, 2)},
			field: `container "tiny"`,
		},
		{
			name: "init only", labels: label("2"),
			reqs:  []gpushare.ContainerRequest{initReq("setup", 0, 4)},
			field: "label " + gpushare.LabelPodGPUCount, msg: []string{"init containers", string(gpushare.ResourceName)},
		},
		{
			name: "init and regular", labels: label("2"),
			reqs: []gpushare.ContainerRequest{initReq("setup", 0, 8), regularReq("main", 0, 4)},
			want: gpushare.MultiGPU{Count: 2},
		},
		{
			name: "init only, one GPU", labels: label("1"),
			reqs: []gpushare.ContainerRequest{initReq("setup", 0, 3)},
			want: gpushare.MultiGPU{},
		},
	} {
		got, err := gpushare.PodMultiGPU("ns/p", tt.labels, tt.annotations, tt.reqs)
		if tt.field == "" {
			if err != nil || got != tt.want {
				t.Errorf("%s: PodMultiGPU = %+v, %v; want %+v", tt.name, got, err, tt.want)
			}
			continue
		}
		var me *gpushare.MultiGPUError
		if !errors.Is(err, gpushare.ErrInvalidGPUCount) || !errors.As(err, &me) || got != (gpushare.MultiGPU{}) {
			t.Errorf("%s: PodMultiGPU = %+v, %v; want ErrInvalidGPUCount", tt.name, got, err)
			continue
		}
		if me.Pod != "ns/p" || me.Field != tt.field {
			t.Errorf("%s: error pod %q, field %q; want ns/p, %q", tt.name, me.Pod, me.Field, tt.field)
		}
		msg := err.Error()
		for _, want := range append([]string{"ns/p", tt.field, string(gpushare.ErrInvalidGPUCount)}, tt.msg...) {
			if !strings.Contains(msg, want) {
				t.Errorf("%s: message %q does not contain %q", tt.name, msg, want)
			}
		}
	}
}

// FuzzPodMultiGPU checks that PodMultiGPU never panics, fails only with a
// *MultiGPUError (ErrInvalidGPUCount), and that what it accepts is placeable:
// with Count > 0, every container's units divide by Count and a regular
// container asks for gpu-mem. Bit 0 of present sets the label, bit 1 the
// annotation; bits 2-4 make the containers init containers.
func FuzzPodMultiGPU(f *testing.F) {
	f.Add(uint8(0x01), "2", "", uint64(4), uint64(8), uint64(0))
	f.Add(uint8(0x03), "2", "required", uint64(4), uint64(0), uint64(0))
	f.Add(uint8(0x03), "4", "bogus", uint64(4), uint64(0), uint64(0))
	f.Add(uint8(0x01), "2", "", uint64(3), uint64(0), uint64(0))
	f.Add(uint8(0x05), "2", "", uint64(4), uint64(0), uint64(0))
	f.Add(uint8(0x05), "2", "", uint64(8), uint64(4), uint64(0))
	f.Add(uint8(0x01), "01", "", uint64(4), uint64(0), uint64(0))
	f.Add(uint8(0x01), "65", "", uint64(4), uint64(0), uint64(0))
	f.Add(uint8(0x01), "64", "", uint64(128), uint64(64), uint64(192))
	f.Add(uint8(0x00), "", "", uint64(3), uint64(5), uint64(0))
	f.Add(uint8(0x02), "", "preferred", uint64(3), uint64(0), uint64(0))
	f.Fuzz(func(t *testing.T, present uint8, label, topology string, u0, u1, u2 uint64) {
		labels, annotations := map[string]string{}, map[string]string{}
		if present&1 != 0 {
			labels[gpushare.LabelPodGPUCount] = label
		}
		if present&2 != 0 {
			annotations[gpushare.AnnotationTopology] = topology
		}
		var reqs []gpushare.ContainerRequest
		for i, u := range []uint64{u0, u1, u2} {
			if u == 0 { // ContainerRequests leaves out containers asking for nothing
				continue
			}
			reqs = append(reqs, gpushare.ContainerRequest{Name: "c" + strconv.Itoa(i), Index: i, Init: present&(4<<i) != 0, Units: u})
		}
		m, err := gpushare.PodMultiGPU("ns/p", labels, annotations, reqs)
		if err != nil {
			var me *gpushare.MultiGPUError
			if !errors.Is(err, gpushare.ErrInvalidGPUCount) || !errors.As(err, &me) || m != (gpushare.MultiGPU{}) {
				t.Fatalf("PodMultiGPU(%v, %v, %v) = %+v, %v; want a *MultiGPUError", labels, annotations, reqs, m, err)
			}
			return
		}
		if m.Count < 0 || m.Count == 1 || m.Count > gpushare.MaxGPUsPerNode {
			t.Fatalf("PodMultiGPU(%v) Count = %d", labels, m.Count)
		}
		if v, ok := labels[gpushare.LabelPodGPUCount]; m.Count == 0 && ok && v != "1" || m.Count > 0 && v != strconv.Itoa(m.Count) {
			t.Fatalf("PodMultiGPU accepted label %q as Count %d", v, m.Count)
		}
		if v, ok := annotations[gpushare.AnnotationTopology]; m.LinksRequired != (ok && v == gpushare.TopologyRequired) ||
			ok && v != gpushare.TopologyRequired && v != gpushare.TopologyPreferred {
			t.Fatalf("PodMultiGPU accepted topology %q as LinksRequired %v", v, m.LinksRequired)
		}
		if m.Count == 0 {
			return
		}
		regular := len(reqs) == 0
		for _, c := range reqs {
			regular = regular || !c.Init
			if c.Units%uint64(m.Count) != 0 {
				t.Fatalf("PodMultiGPU accepted %d units of %s over %d GPUs", c.Units, c.Name, m.Count)
			}
		}
		if !regular {
			t.Fatalf("PodMultiGPU accepted %d GPUs for init containers only: %v", m.Count, reqs)
		}
	})
}
