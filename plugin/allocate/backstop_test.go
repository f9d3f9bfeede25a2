package allocate_test

import (
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpushare/gpushare/plugin/allocate"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

func deleting() podOpt {
	return func(p *corev1.Pod) { now := metav1.NewTime(t0); p.DeletionTimestamp = &now }
}

// The node refuses a container whose GPU its pods together over-commit,
// whoever bound them: the backstop behind the extender's accounting.
func TestMatchRefusesOvercommit(t *testing.T) {
	assigned := annotate(gpushare.AnnotationAssigned, "true")
	tests := []struct {
		name     string
		gpus     []uint64
		pods     []*corev1.Pod
		units    []uint64
		wantGPU  int      // -1: no refusal
		wantText []string // substrings of the error
	}{
		{
			name: "hand-bound pod that would over-commit its GPU is refused, naming the GPU, size and holders",
			gpus: []uint64{16, 16},
			pods: []*corev1.Pod{
				pod("running", []int64{12}, onGPU(1, 16, 1), assigned, phase(corev1.PodRunning)),
				pod("byhand", []int64{8}, onGPU(1, 16, 2)),
			},
			units: []uint64{8}, wantGPU: 1,
			wantText: []string{"GPU 1", `node "n1"`, "16 GiB units", "ask for 20", "default/running=12", "default/byhand=8", "default/byhand/c0"},
		},
		{
			name: "exactly full is fine",
			gpus: []uint64{16},
			pods: []*corev1.Pod{
				pod("running", []int64{8}, onGPU(0, 16, 1), assigned, phase(corev1.PodRunning)),
				pod("new", []int64{8}, onGPU(0, 16, 2)),
			},
			units: []uint64{8}, wantGPU: -1,
		},
		{
			name: "another GPU's load does not matter",
			gpus: []uint64{16, 16},
			pods: []*corev1.Pod{
				pod("big", []int64{16}, onGPU(0, 16, 1), assigned),
				pod("big2", []int64{4}, onGPU(0, 16, 1), assigned),
				pod("new", []int64{8}, onGPU(1, 16, 2)),
			},
			units: []uint64{8}, wantGPU: -1,
		},
		{
			name: "terminating pods still hold memory and count",
			gpus: []uint64{16},
			pods: []*corev1.Pod{
				pod("leaving", []int64{12}, onGPU(0, 16, 1), assigned, deleting()),
				pod("new", []int64{8}, onGPU(0, 16, 2)),
			},
			units: []uint64{8}, wantGPU: 0, wantText: []string{"default/leaving=12"},
		},
		{
			name: "finished pods do not count",
			gpus: []uint64{16},
			pods: []*corev1.Pod{
				pod("done", []int64{12}, onGPU(0, 16, 1), assigned, phase(corev1.PodSucceeded)),
				pod("failed", []int64{12}, onGPU(0, 16, 1), assigned, phase(corev1.PodFailed)),
				pod("new", []int64{8}, onGPU(0, 16, 2)),
			},
			units: []uint64{8}, wantGPU: -1,
		},
		{
			name: "a seed pod on a one-GPU node charges that GPU",
			gpus: []uint64{16},
			pods: []*corev1.Pod{
				pod("seed", []int64{10}, phase(corev1.PodRunning)),
				pod("new", []int64{8}, onGPU(0, 16, 2)),
			},
			units: []uint64{8}, wantGPU: 0, wantText: []string{"default/seed=10"},
		},
		{
			name: "init containers charge their peak, not their sum with the regular ones",
			gpus: []uint64{16},
			pods: []*corev1.Pod{
				pod("a", []int64{8}, initCtr("warm", 8), onGPU(0, 16, 1)),
				pod("b", []int64{8}, onGPU(0, 16, 2), assigned),
			},
			units: []uint64{8}, wantGPU: -1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := allocate.Input{Node: node, Inventory: inv(t, tt.gpus...), Pods: tt.pods, Served: allocate.Served{}}
			_, err := allocate.Match(in, tt.units)
			var oc *allocate.OvercommitError
			if tt.wantGPU < 0 {
				if err != nil {
					t.Fatalf("Match = %v; want an answer", err)
				}
				return
			}
			if !errors.As(err, &oc) || !errors.Is(err, allocate.ErrOvercommit) {
				t.Fatalf("Match = %v; want an *OvercommitError", err)
			}
			if oc.GPU != tt.wantGPU {
				t.Errorf("refused GPU %d; want %d", oc.GPU, tt.wantGPU)
			}
			for _, s := range tt.wantText {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q lacks %q", err, s)
				}
			}
		})
	}
}

// A Memo answers from its decoded copy while the resourceVersion stays, and
// decodes again when it changes; Retain forgets pods that left.
func TestMemoFollowsResourceVersion(t *testing.T) {
	memo := allocate.NewMemo()
	p := pod("a", []int64{4}, onGPU(1, 80, 1))
	p.ResourceVersion = "1"
	in := allocate.Input{Node: node, Inventory: inv(t, 80, 80), Pods: []*corev1.Pod{p}, Served: allocate.Served{}, Memo: memo}
	ds, err := allocate.Match(in, []uint64{4})
	if err != nil || ds[0].Env.GPUIndex != 1 {
		t.Fatalf("first call = %+v, %v", ds, err)
	}
	if memo.Len() != 1 {
		t.Fatalf("memo holds %d pods; want 1", memo.Len())
	}
	// The record arrives with a new resourceVersion: the pod is served now.
	served := p.DeepCopy()
	served.ResourceVersion = "2"
	served.Annotations[gpushare.AnnotationAssigned] = "true"
	in.Pods = []*corev1.Pod{served}
	if _, err := allocate.Match(in, []uint64{4}); !errors.Is(err, allocate.ErrNoMatch) {
		t.Fatalf("after the record, Match = %v; want ErrNoMatch (a stale decode would serve it again)", err)
	}
	memo.Retain(nil)
	if memo.Len() != 0 {
		t.Errorf("after Retain(nil) the memo holds %d pods", memo.Len())
	}
}
