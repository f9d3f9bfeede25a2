package binder

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

// eventsEnv is newEnv's cluster with a binder that records into a fake
// recorder.
func eventsEnv(t *testing.T) (*env, *Binder, *events.FakeRecorder) {
	e := newEnv(t)
	rec := events.NewFakeRecorder(16)
	return e, New(Config{Client: e.client, Cache: e.cache, Events: rec}), rec
}

func bindArgs(pod, node string) extenderv1.ExtenderBindingArgs {
	return extenderv1.ExtenderBindingArgs{PodName: pod, PodNamespace: "default", PodUID: types.UID("uid-" + pod), Node: node}
}

// recorded drains what rec holds.
func recorded(rec *events.FakeRecorder) []string {
	var out []string
	for {
		select {
		case ev := <-rec.Events:
			out = append(out, ev)
		default:
			return out
		}
	}
}

func TestBindEvents(t *testing.T) {
	e, b, rec := eventsEnv(t)
	split := gpuPod("split", 10)
	split.Spec.Containers = append(split.Spec.Containers, *split.Spec.Containers[0].DeepCopy())
	split.Spec.Containers[1].Name = "d"
	if err := e.client.Tracker().Add(split); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, tc := range []struct{ pod, want string }{
		// 10 + 10 fits no single 16-unit GPU: one container on each.
		{"split", "Normal GPUShareScheduled placed on node n1 GPU 0: 10 of 16 units used, GPU 1: 10 of 16 units used"},
		{"zero", "Normal GPUShareScheduled placed on node n1 with no GPU memory (gpu-mem: 0)"},
	} {
		if err := b.Bind(ctx, bindArgs(tc.pod, "n1")); err != nil {
			t.Fatalf("bind %s: %v", tc.pod, err)
		}
		if got := recorded(rec); len(got) != 1 || got[0] != tc.want {
			t.Errorf("bind %s recorded %q; want %q", tc.pod, got, tc.want)
		}
	}
	// A retry of a bind that succeeded is the same bind: no second event.
	if err := b.Bind(ctx, bindArgs("split", "n1")); err != nil {
		t.Fatal(err)
	}
	if got := recorded(rec); len(got) != 0 {
		t.Errorf("a retried bind recorded %q", got)
	}
}

func TestBindRefusedEvents(t *testing.T) {
	e, b, rec := eventsEnv(t)
	ctx := context.Background()
	plain := gpuPod("plain", 0)
	plain.Spec.Containers[0].Resources = corev1.ResourceRequirements{}
	if err := e.client.Tracker().Add(plain); err != nil {
		t.Fatal(err)
	}
	big := gpuPod("big", 20)
	if err := e.client.Tracker().Add(big); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ pod, node, want string }{
		{"p", "ghost", "Warning GPUShareBindRefused bind refused: pod default/p: node ghost is not in the extender's cache"},
		{"plain", "n1", "Warning GPUShareBindRefused bind refused: pod default/plain does not request aliyun.com/gpu-mem in any container: not a gpushare pod"},
		{"big", "n1", "Warning GPUShareBindRefused bind pod default/big to node n1: "},
	} {
		err := b.Bind(ctx, bindArgs(tc.pod, tc.node))
		if err == nil {
			t.Fatalf("bind %s to %s succeeded", tc.pod, tc.node)
		}
		got := recorded(rec)
		if len(got) != 1 || !strings.HasPrefix(got[0], tc.want) || !strings.HasSuffix(got[0], err.Error()) {
			t.Errorf("bind %s to %s (%v) recorded %q; want one event starting %q", tc.pod, tc.node, err, got, tc.want)
		}
	}
	// No such pod (a stale or forged request): nothing to tell anyone.
	if err := b.Bind(ctx, bindArgs("ghost-pod", "n1")); !apierrors.IsNotFound(err) {
		t.Fatalf("bind of a missing pod: %v", err)
	}
	if got := recorded(rec); len(got) != 0 {
		t.Errorf("bind of a missing pod recorded %q", got)
	}
}

func TestNilEventsRecordsNothing(t *testing.T) {
	e := newEnv(t) // its binder has no Events
	if err := e.bind(context.Background(), "p"); err != nil {
		t.Fatal(err)
	}
	if err := e.binder.Bind(context.Background(), bindArgs("p", "ghost")); err == nil {
		t.Fatal("bind to an unknown node succeeded")
	}
}

func TestBindEventOneGPU(t *testing.T) {
	e, b, rec := eventsEnv(t)
	if err := b.Bind(context.Background(), bindArgs("p", "n1")); err != nil {
		t.Fatal(err)
	}
	want := "Normal GPUShareScheduled placed on node n1 GPU 0: 10 of 16 units used"
	if got := recorded(rec); len(got) != 1 || got[0] != want {
		t.Errorf("recorded %q; want %q", got, want)
	}
	if e.charged() != 10 {
		t.Errorf("charged %d units", e.charged())
	}
}
