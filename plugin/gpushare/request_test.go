package gpushare_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/gpushare/gpushare/plugin/gpushare"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ctr builds a container; limit and request are gpu-mem quantities, "" for none.
func ctr(name, limit, request string) corev1.Container {
	c := corev1.Container{Name: name}
	if limit != "" {
		c.Resources.Limits = corev1.ResourceList{gpushare.ResourceName: resource.MustParse(limit)}
	}
	if request != "" {
		c.Resources.Requests = corev1.ResourceList{gpushare.ResourceName: resource.MustParse(request)}
	}
	return c
}

// sidecar marks an init container restartable.
func sidecar(c corev1.Container) corev1.Container {
	always := corev1.ContainerRestartPolicyAlways
	c.RestartPolicy = &always
	return c
}

func pod(inits []corev1.Container, containers ...corev1.Container) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"},
		Spec:       corev1.PodSpec{InitContainers: inits, Containers: containers},
	}
}

func TestPodRequest(t *testing.T) {
	tests := []struct {
		name  string
		pod   *corev1.Pod
		want  uint64
		reqs  []gpushare.ContainerRequest
		wantE string // container named in the error; "" for success
	}{
		{
			name: "plain",
			pod:  pod(nil, ctr("a", "2", "")),
			want: 2,
			reqs: []gpushare.ContainerRequest{{Name: "a", Index: 0, Units: 2}},
		},
		{
			name: "requests only",
			pod:  pod(nil, ctr("a", "", "3")),
			want: 3,
			reqs: []gpushare.ContainerRequest{{Name: "a", Index: 0, Units: 3}},
		},
		{
			name: "limits win over requests",
			pod:  pod(nil, ctr("a", "4", "3")),
			want: 4,
			reqs: []gpushare.ContainerRequest{{Name: "a", Index: 0, Units: 4}},
		},
		{
			name: "multi-container",
			pod:  pod(nil, ctr("a", "2", ""), ctr("plain", "", ""), ctr("b", "3", "")),
			want: 5,
			reqs: []gpushare.ContainerRequest{{Name: "a", Index: 0, Units: 2}, {Name: "b", Index: 2, Units: 3}},
		},
		{
			name: "no request",
			pod:  pod(nil, ctr("a", "", "")),
			want: 0,
		},
		{
			name: "zero request",
			pod:  pod(nil, ctr("a", "0", "")),
			want: 0,
		},
		{
			name: "nil pod",
			pod:  nil,
			want: 0,
		},
		{
			name: "init bigger than regular",
			pod:  pod([]corev1.Container{ctr("init", "8", "")}, ctr("a", "2", ""), ctr("b", "3", "")),
			want: 8,
			reqs: []gpushare.ContainerRequest{
				{Name: "init", Index: 0, Init: true, Units: 8},
				{Name: "a", Index: 0, Units: 2},
				{Name: "b", Index: 1, Units: 3},
			},
		},
		{
			name: "init smaller than regular",
			pod:  pod([]corev1.Container{ctr("init", "1", "")}, ctr("a", "4", "")),
			want: 4,
			reqs: []gpushare.ContainerRequest{{Name: "init", Index: 0, Init: true, Units: 1}, {Name: "a", Index: 0, Units: 4}},
		},
		{
			name: "sidecar adds to regular",
			pod:  pod([]corev1.Container{sidecar(ctr("side", "1", ""))}, ctr("a", "2", "")),
			want: 3,
			reqs: []gpushare.ContainerRequest{{Name: "side", Index: 0, Init: true, Sidecar: true, Units: 1}, {Name: "a", Index: 0, Units: 2}},
		},
		{
			name: "only a sidecar",
			pod:  pod([]corev1.Container{sidecar(ctr("side", "2", ""))}, ctr("a", "", "")),
			want: 2,
			reqs: []gpushare.ContainerRequest{{Name: "side", Index: 0, Init: true, Sidecar: true, Units: 2}},
		},
		{
			// candidates: i1 5, side 2, i2 4+2=6; regular 3+2=5 → 6.
			name: "mixed: init runs beside earlier sidecars",
			pod: pod([]corev1.Container{ctr("i1", "5", ""), sidecar(ctr("side", "2", "")), ctr("i2", "4", "")},
				ctr("a", "3", "")),
			want: 6,
			reqs: []gpushare.ContainerRequest{
				{Name: "i1", Index: 0, Init: true, Units: 5},
				{Name: "side", Index: 1, Init: true, Sidecar: true, Units: 2},
				{Name: "i2", Index: 2, Init: true, Units: 4},
				{Name: "a", Index: 0, Units: 3},
			},
		},
		{
			// A sidecar started after an init container does not run beside it: max(4, 1+1) = 4.
			name: "mixed: sidecar after init",
			pod:  pod([]corev1.Container{ctr("i1", "4", ""), sidecar(ctr("side", "1", ""))}, ctr("a", "1", "")),
			want: 4,
			reqs: []gpushare.ContainerRequest{
				{Name: "i1", Index: 0, Init: true, Units: 4},
				{Name: "side", Index: 1, Init: true, Sidecar: true, Units: 1},
				{Name: "a", Index: 0, Units: 1},
			},
		},
		{
			// candidates: i 4, s1 2, s2 5; regular 1+1 plus sidecars 5 = 7.
			name: "mixed: regular plus sidecars win",
			pod: pod([]corev1.Container{ctr("i", "4", ""), sidecar(ctr("s1", "2", "")), sidecar(ctr("s2", "3", ""))},
				ctr("a", "1", ""), ctr("b", "1", "")),
			want: 7,
			reqs: []gpushare.ContainerRequest{
				{Name: "i", Index: 0, Init: true, Units: 4},
				{Name: "s1", Index: 1, Init: true, Sidecar: true, Units: 2},
				{Name: "s2", Index: 2, Init: true, Sidecar: true, Units: 3},
				{Name: "a", Index: 0, Units: 1},
				{Name: "b", Index: 1, Units: 1},
			},
		},
		{name: "exactly the limit", pod: pod(nil, ctr("a", "1048576", "")), want: 1 << 20,
			reqs: []gpushare.ContainerRequest{{Name: "a", Units: 1 << 20}}},
		{name: "suffixed whole number", pod: pod(nil, ctr("a", "1k", "")), want: 1000,
			reqs: []gpushare.ContainerRequest{{Name: "a", Units: 1000}}},
		{name: "negative", pod: pod(nil, ctr("a", "-1", "")), wantE: "a"},
		{name: "fractional", pod: pod(nil, ctr("a", "1500m", "")), wantE: "a"},
		{name: "below one", pod: pod(nil, ctr("a", "500m", "")), wantE: "a"},
		{name: "tiny fraction", pod: pod(nil, ctr("a", "1n", "")), wantE: "a"},
		{name: "absurd", pod: pod(nil, ctr("a", "2Mi", "")), wantE: "a"},
		{name: "huge", pod: pod(nil, ctr("a", "1e18", "")), wantE: "a"},
		{name: "invalid request fallback", pod: pod(nil, ctr("ok", "1", ""), ctr("bad", "", "0.5")), wantE: "bad"},
		{name: "invalid init", pod: pod([]corev1.Container{ctr("init", "-2", "")}, ctr("a", "1", "")), wantE: "init"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reqs, err := gpushare.ContainerRequests(tt.pod)
			total, perr := gpushare.PodRequest(tt.pod)
			if tt.wantE != "" {
				var re *gpushare.RequestError
				if !errors.Is(err, gpushare.ErrInvalidRequest) || !errors.As(err, &re) {
					t.Fatalf("error = %v; want a *RequestError", err)
				}
				if re.Pod != "ns/p" || re.Container != tt.wantE || re.Value == "" {
					t.Errorf("error names pod %q container %q value %q; want ns/p, %q, the value", re.Pod, re.Container, re.Value, tt.wantE)
				}
				if !strings.Contains(err.Error(), tt.wantE) || !errors.Is(perr, gpushare.ErrInvalidRequest) {
					t.Errorf("errors %v / %v", err, perr)
				}
				return
			}
			if err != nil || perr != nil {
				t.Fatalf("unexpected errors %v, %v", err, perr)
			}
			if !reflect.DeepEqual(reqs, tt.reqs) {
				t.Errorf("ContainerRequests = %+v; want %+v", reqs, tt.reqs)
			}
			if total != tt.want {
				t.Errorf("PodRequest = %d; want %d", total, tt.want)
			}
		})
	}
}

func TestPodUnitsSortsInitContainers(t *testing.T) {
	// Callers may hand requests in any order; init order decides the peak.
	reqs := []gpushare.ContainerRequest{
		{Name: "a", Index: 0, Units: 1},
		{Name: "i", Index: 1, Init: true, Units: 4},
		{Name: "s", Index: 0, Init: true, Sidecar: true, Units: 2},
	}
	if got := gpushare.PodUnits(reqs); got != 6 {
		t.Errorf("PodUnits = %d; want 6 (init runs beside the earlier sidecar)", got)
	}
	if reqs[1].Name != "i" {
		t.Error("PodUnits reordered its argument")
	}
}

func TestUnitsFromQuantity(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want uint64
		ok   bool
	}{
		{"0", 0, true}, {"1", 1, true}, {"15", 15, true}, {"1000m", 1, true}, {"1e3", 1000, true},
		{"1Ki", 1024, true}, {"1048576", 1 << 20, true},
		{"1048577", 0, false}, {"-1", 0, false}, {"1500m", 0, false}, {"1.5", 0, false},
		{"1u", 0, false}, {"9223372036854775807", 0, false}, {"1E", 0, false},
		// Refused at once: the exact comparison alone would build 10^999999999 and never end.
		{"1e999999999", 0, false},
	} {
		got, err := gpushare.UnitsFromQuantity(resource.MustParse(tt.in))
		if tt.ok != (err == nil) || got != tt.want {
			t.Errorf("UnitsFromQuantity(%s) = %d, %v; want %d, ok=%v", tt.in, got, err, tt.want, tt.ok)
		}
		if err != nil && !errors.Is(err, gpushare.ErrInvalidRequest) {
			t.Errorf("UnitsFromQuantity(%s) error %v is not ErrInvalidRequest", tt.in, err)
		}
	}
}

func FuzzUnitsFromQuantity(f *testing.F) {
	for _, s := range []string{"0", "1", "2", "1500m", "-1", "1048576", "1048577", "1Ki", "1e3", "0.9999999999", "1.0000000001", "9Ei", "1n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		q, err := resource.ParseQuantity(s)
		if err != nil {
			return
		}
		units, err := gpushare.UnitsFromQuantity(q)
		if err != nil {
			if !errors.Is(err, gpushare.ErrInvalidRequest) {
				t.Fatalf("UnitsFromQuantity(%q) error %v is not ErrInvalidRequest", s, err)
			}
			return
		}
		if units > gpushare.MaxUnits {
			t.Fatalf("UnitsFromQuantity(%q) = %d above MaxUnits", s, units)
		}
		// The kubelet counts Value(); we must agree with it.
		if v := q.Value(); uint64(v) != units {
			t.Fatalf("UnitsFromQuantity(%q) = %d; kubelet counts %d", s, units, v)
		}
		again, err := gpushare.UnitsFromQuantity(*resource.NewQuantity(int64(units), resource.DecimalSI))
		if err != nil || again != units {
			t.Fatalf("round trip %q: %d → %d, %v", s, units, again, err)
		}
	})
}
