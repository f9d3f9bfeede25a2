package allocator

import (
	"testing"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

func TestNearest(t *testing.T) {
	for _, c := range []struct {
		kinds []string
		want  string
	}{
		{nil, ""},
		{[]string{"", "fits"}, ""},
		{[]string{KindNotGPUShare, KindTooBig, KindFragmented}, KindFragmented},
		{[]string{KindInsufficient, KindWaiting}, KindWaiting},
		{[]string{KindUnhealthy, KindIsolation, KindTopology}, KindIsolation},
	} {
		if got := Nearest(c.kinds...); got != c.want {
			t.Errorf("Nearest(%q) = %q, want %q", c.kinds, got, c.want)
		}
	}
}

// TestDiagnose: each kind from the rule it names, on one 2-GPU node.
func TestDiagnose(t *testing.T) {
	node := func(used0, used1 uint64) *Node {
		return &Node{Name: "n", GPUShare: true, GPUs: []GPU{
			{Index: 0, Units: 16, Used: used0, Healthy: true}, {Index: 1, Units: 16, Used: used1, Healthy: true},
		}}
	}
	sick := node(0, 0)
	sick.GPUs[0].Healthy, sick.GPUs[1].Healthy = false, false
	for _, c := range []struct {
		name  string
		n     *Node
		units uint64
		want  string
	}{
		{"fragmented", node(10, 10), 8, KindFragmented},
		{"insufficient", node(14, 14), 8, KindInsufficient},
		{"too big", node(0, 0), 20, KindTooBig},
		{"unhealthy", sick, 4, KindUnhealthy},
		{"not gpushare", &Node{Name: "n"}, 4, KindNotGPUShare},
	} {
		r := Request{Pod: "default/p", Units: c.units}
		r.Containers = []gpushare.ContainerRequest{{Name: "c", Units: c.units}}
		_, unfit := Place(c.n, r, BestFit)
		if unfit == nil {
			t.Fatalf("%s: the pod fits", c.name)
		}
		if got := Diagnose(c.n, r, BestFit, unfit); got != c.want {
			t.Errorf("%s: Diagnose = %q, want %q (%s)", c.name, got, c.want, unfit.Reason)
		}
	}
}
