package allocate_test

import (
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpushare/gpushare/plugin/allocate"
	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/isolation"
)

var (
	upNone = isolation.Status{Tier: gpushare.IsolationNone}
	upMPS  = isolation.Status{Tier: gpushare.IsolationMPS}
	upHAMi = isolation.Status{Tier: gpushare.IsolationHAMiCore}
	downMP = isolation.Status{Tier: gpushare.IsolationMPS, Down: true, Reason: "the MPS control daemon does not answer: exit status 1"}
)

func tier(t gpushare.Isolation) podOpt { return annotate(gpushare.AnnotationIsolation, string(t)) }
func percent(p string) podOpt          { return annotate(gpushare.AnnotationComputePercent, p) }

// The answer carries its GPU's tier and its pod's compute share; the pod's
// requirement decides only whether it is a candidate.
func TestMatchTiers(t *testing.T) {
	tiers := map[int]isolation.Status{0: upNone, 1: upMPS, 2: upHAMi}
	for _, tt := range []struct {
		name string
		pod  *corev1.Pod
		want gpushare.ContainerEnv
	}{
		{"any on none", pod("a", []int64{4}, onGPU(0, 80, 1)), withTier(env(0, 4, 4, 80), "none", 0)},
		{"any on mps", pod("a", []int64{4}, onGPU(1, 80, 1)), withTier(env(1, 4, 4, 80), "mps", 0)},
		{"explicit any on hami-core with a share", pod("a", []int64{4}, onGPU(2, 80, 1), tier("any"), percent("25")), withTier(env(2, 4, 4, 80), "hami-core", 25)},
		{"mps required on mps, with a share", pod("a", []int64{4}, onGPU(1, 80, 1), tier("mps"), percent("100")), withTier(env(1, 4, 4, 80), "mps", 100)},
		{"none required on none", pod("a", []int64{4}, onGPU(0, 80, 1), tier("none")), withTier(env(0, 4, 4, 80), "none", 0)},
	} {
		ds, err := allocate.Match(allocate.Input{Node: node, Inventory: inv(t, 80, 80, 80), Pods: []*corev1.Pod{tt.pod}, Isolation: tiers}, []uint64{4})
		if err != nil || len(ds) != 1 || ds[0].Env != tt.want {
			t.Errorf("%s: Match = %+v, %v; want %+v", tt.name, ds, err, tt.want)
		}
	}
}

func withTier(e gpushare.ContainerEnv, t gpushare.Isolation, p int) gpushare.ContainerEnv {
	e.Isolation, e.ComputePercent = t, p
	return e
}

// Pods a GPU cannot serve as they ask are skipped, and the refusal says why.
func TestMatchSkipsWhatTheTierCannotGive(t *testing.T) {
	tiers := map[int]isolation.Status{0: upNone, 1: upMPS}
	for _, tt := range []struct {
		name string
		pod  *corev1.Pod
		text string
	}{
		{"mps required on none", pod("p", []int64{4}, onGPU(0, 80, 1), tier("mps")),
			`it requires isolation tier "mps" (gpushare.io/isolation) and GPU 0 of this node is configured for "none"`},
		{"hami-core required on mps", pod("p", []int64{4}, onGPU(1, 80, 1), tier("hami-core")), `requires isolation tier "hami-core"`},
		{"none required on mps", pod("p", []int64{4}, onGPU(1, 80, 1), tier("none")), `GPU 1 of this node is configured for "mps"`},
		{"compute share on none", pod("p", []int64{4}, onGPU(0, 80, 1), percent("50")),
			`it asks for 50% of a GPU's compute (gpushare.io/compute-percent) and GPU 0's isolation tier "none" cannot limit compute`},
		{"malformed tier", pod("p", []int64{4}, onGPU(1, 80, 1), tier("strict")), `gpushare.io/isolation "strict"`},
		{"malformed share", pod("p", []int64{4}, onGPU(1, 80, 1), percent("150")), `gpushare.io/compute-percent "150"`},
	} {
		_, err := allocate.Match(allocate.Input{Node: node, Inventory: inv(t, 80, 80), Pods: []*corev1.Pod{tt.pod}, Isolation: tiers}, []uint64{4})
		var nm *allocate.NoMatchError
		if !errors.As(err, &nm) || !strings.Contains(err.Error(), "pod default/p cannot be served: ") || !strings.Contains(err.Error(), tt.text) {
			t.Errorf("%s: Match error = %v; want a no-match naming %q", tt.name, err, tt.text)
		}
	}
	// Without tiers (a caller that knows none), a GPU offers only none.
	_, err := allocate.Match(allocate.Input{Node: node, Inventory: inv(t, 80), Pods: []*corev1.Pod{pod("p", []int64{4}, onGPU(0, 80, 1), tier("mps"))}}, []uint64{4})
	if !errors.Is(err, allocate.ErrNoMatch) {
		t.Errorf("mps required with no tiers known: %v", err)
	}
}

// A pod whose isolation annotations are malformed is not served, but still
// charges the GPU its annotations name: the node's own check counts it.
func TestMalformedTierStillCharges(t *testing.T) {
	pods := []*corev1.Pod{
		pod("bad", []int64{60}, onGPU(0, 80, 1), percent("lots")),
		pod("next", []int64{30}, onGPU(0, 80, 2)),
	}
	_, err := allocate.Match(allocate.Input{Node: node, Inventory: inv(t, 80), Pods: pods, Isolation: map[int]isolation.Status{0: upMPS}}, []uint64{30})
	if !errors.Is(err, allocate.ErrOvercommit) || !strings.Contains(err.Error(), "default/bad=60") {
		t.Errorf("Match = %v; want an over-commit naming default/bad", err)
	}
}

// A GPU whose tier is down refuses every container of its calls, whatever
// its pod asks for, and says why.
func TestMatchRefusesWhenTheTierIsDown(t *testing.T) {
	invalidLabel := isolation.Status{Down: true, Reason: `node label gpushare.io/isolation="mpss" is not one of none, mps, hami-core`}
	for _, tt := range []struct {
		name   string
		status isolation.Status
		pod    *corev1.Pod
		text   string
	}{
		{"any", downMP, pod("p", []int64{4}, onGPU(1, 80, 1)), `GPU 1 of node "n1" is configured for isolation tier "mps", which is down: the MPS control daemon does not answer: exit status 1; refusing default/p/c0`},
		{"mps required", downMP, pod("p", []int64{4}, onGPU(1, 80, 1), tier("mps"), percent("10")), "refusing default/p/c0 rather than start it without its memory limit"},
		{"none required", downMP, pod("p", []int64{4}, onGPU(1, 80, 1), tier("none")), "which is down"},
		{"invalid node label", invalidLabel, pod("p", []int64{4}, onGPU(1, 80, 1)), `configured for its isolation tier, which is down: node label gpushare.io/isolation="mpss"`},
	} {
		in := allocate.Input{Node: node, Inventory: inv(t, 80, 80), Pods: []*corev1.Pod{tt.pod}, Isolation: map[int]isolation.Status{0: upNone, 1: tt.status}}
		ds, err := allocate.Match(in, []uint64{4})
		var down *allocate.IsolationDownError
		if ds != nil || !errors.As(err, &down) || !errors.Is(err, allocate.ErrIsolationDown) || down.GPU != 1 || !strings.Contains(err.Error(), tt.text) {
			t.Errorf("%s: Match = %+v, %v; want a refusal containing %q", tt.name, ds, err, tt.text)
		}
	}
	// A call with one container on an up GPU and one on a down GPU is refused whole.
	p := pod("two", []int64{4, 2}, onGPU(0, 80, 1))
	p.Annotations[gpushare.AnnotationAllocation] = `{"0":{"0":4},"1":{"1":2}}`
	in := allocate.Input{Node: node, Inventory: inv(t, 80, 80), Pods: []*corev1.Pod{p}, Isolation: map[int]isolation.Status{0: upNone, 1: downMP}}
	if ds, err := allocate.Match(in, []uint64{4, 2}); ds != nil || !errors.Is(err, allocate.ErrIsolationDown) {
		t.Errorf("a call across an up and a down GPU = %+v, %v; want it refused whole", ds, err)
	}
}

// Two in-flight pods of one size on one GPU with different compute shares
// break the extender's rule: the signature includes the share, so Match
// reports the conflict.
func TestComputeShareIsPartOfTheSignature(t *testing.T) {
	pods := []*corev1.Pod{
		pod("first", []int64{4}, onGPU(1, 80, 1), percent("20")),
		pod("second", []int64{4}, onGPU(1, 80, 2), percent("40")),
		pod("third", []int64{4}, onGPU(1, 80, 3), percent("20")),
	}
	ds, err := allocate.Match(allocate.Input{Node: node, Inventory: inv(t, 80, 80), Pods: pods, Isolation: map[int]isolation.Status{1: upMPS}}, []uint64{4})
	if err != nil || len(ds) != 1 || ds[0].Pod.Name != "first" || ds[0].Env.ComputePercent != 20 ||
		len(ds[0].Conflicts) != 1 || ds[0].Conflicts[0] != "default/second/c0" {
		t.Errorf("Match = %+v, %v; want first with a conflict naming second only", ds, err)
	}
}

// The reconciler records a started pod with its GPU's tier and its share.
func TestRepairsCarryTheTier(t *testing.T) {
	started := func(p *corev1.Pod) {
		p.Status.Phase = corev1.PodRunning
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "c0", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
	}
	pods := []*corev1.Pod{pod("p", []int64{4}, onGPU(1, 80, 1), percent("30"), started)}
	// Down or not, the container was served with the configured tier: a
	// down tier refuses, it never answers.
	for _, s := range []isolation.Status{upMPS, downMP} {
		reps := allocate.Repairs(allocate.Input{Node: node, Inventory: inv(t, 80, 80), Pods: pods, Isolation: map[int]isolation.Status{1: s}})
		if len(reps) != 1 || reps[0].Envs["c0"] != withTier(env(1, 4, 4, 80), "mps", 30) {
			t.Errorf("%+v: Repairs = %+v", s, reps)
		}
		if _, err := gpushare.EncodeContainerEnvs(reps[0].Envs); err != nil {
			t.Errorf("the repair is no valid record: %v", err)
		}
	}
}
