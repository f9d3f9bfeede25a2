package render_test

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/inspector/explain"
	"github.com/gpushare/gpushare/inspector/internal/fixture"
	"github.com/gpushare/gpushare/inspector/render"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

// whyCluster: node a (two 8 GiB GPUs holding 5 and 6 GiB), node b (one
// 8 GiB GPU with a 4-unit container of a 6-unit pod in flight), a CPU node,
// and a pending 4 GiB pod that the scheduler judged unschedulable.
func whyCluster() (explain.State, *corev1.Pod) {
	x := fixture.Pod("ml", "x", "b", fixture.Container("main", 4), fixture.Container("side", 2))
	x = fixture.Assign(x, gpushare.PodAssignment{GPUIndex: 0, PodUnits: 6, DevUnits: 16, AssumeTime: 1})
	st := explain.State{
		Nodes: []corev1.Node{fixture.Node("a", "10.0.0.1", 16, 2), fixture.Node("b", "10.0.0.2", 16, 1), fixture.Node("cpu-0", "10.0.0.3", 0, 0)},
		Pods: []corev1.Pod{
			fixture.SimplePod("default", "c", "a", 5, 0, 8, true),
			fixture.SimplePod("default", "d", "a", 6, 1, 8, true),
			x,
		},
	}
	p := fixture.Pod("default", "pending", "", fixture.Container("main", 4))
	p.Status.Phase = corev1.PodPending
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable,
		Message: "0/3 nodes are available: 1 Insufficient GPU Memory in one device, 1 The node cpu-0 is not for GPU share, need skip,\n1 waiting for pod ml/x."}}
	return st, &p
}

func TestWhyFitGolden(t *testing.T) {
	st, pending := whyCluster()
	bound := st.Pods[1]
	why := func(p *corev1.Pod) func() (any, error) {
		return func() (any, error) { return explain.ExplainWhy(st, p, allocator.BestFit) }
	}
	fit := func(replicas int) func() (any, error) {
		return func() (any, error) {
			p := fixture.Pod("default", "infer", "", fixture.Container("main", 2))
			return explain.ExplainFit(st, &p, allocator.BestFit, replicas)
		}
	}
	text := func(w io.Writer, v any) error {
		switch x := v.(type) {
		case *explain.Why:
			return render.Why(w, x)
		case *explain.Fit:
			return render.Fit(w, x)
		}
		return nil
	}
	for _, tc := range []struct {
		golden string
		build  func() (any, error)
		render func(io.Writer, any) error
	}{
		{"why-pending.txt", why(pending), text},
		{"why-pending.json", why(pending), render.Value},
		{"why-bound.txt", why(&bound), text},
		{"fit.txt", fit(1), text},
		{"fit-replicas.txt", fit(20), text},
		{"fit-replicas.yaml", fit(20), render.ValueYAML},
	} {
		t.Run(tc.golden, func(t *testing.T) {
			v, err := tc.build()
			if err != nil {
				t.Fatal(err)
			}
			var got bytes.Buffer
			if err := tc.render(&got, v); err != nil {
				t.Fatal(err)
			}
			golden(t, filepath.Join("testdata", tc.golden), got.Bytes())
		})
	}
}

func golden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("output differs from %s (go test -update refreshes it)\n--- got ---\n%s\n--- want ---\n%s", path, got, want)
	}
}
