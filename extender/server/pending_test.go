package server

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/extender/cache"
)

// pendingSeries is the gauge's exposition with the given counts, zero elsewhere.
func pendingSeries(counts map[string]int) string {
	var b strings.Builder
	b.WriteString("# HELP gpushare_extender_pending_pods Pods the filter last placed on no node and still unbound, by the nearest reason (allocator.UnfitKinds).\n")
	b.WriteString("# TYPE gpushare_extender_pending_pods gauge\n")
	for _, k := range allocator.UnfitKinds() {
		fmt.Fprintf(&b, "gpushare_extender_pending_pods{reason=%q} %d\n", k, counts[k])
	}
	return b.String()
}

// TestPendingPodsByReason: through the filter verb, a pod that fits no node is
// counted under its nearest reason (fragmented beats too-big), a pod that fits
// is not, and a pod is no longer counted once a filter finds it a node or it
// is bound.
func TestPendingPodsByReason(t *testing.T) {
	// The pods are there before the cache syncs, as the scheduler's own
	// informer holds them before it filters.
	frag, big, fits := gpuPod("f", 8), gpuPod("big", 20), gpuPod("ok", 4)
	e := newEnv(t, gpuNode("frag", 32, 2), gpuNode("small", 8, 2), gpuNode("n1", 64, 2), frag, big, fits)
	ctx := context.Background()
	// 10 and 9 units on frag's 16-unit GPUs (sizes differ, so the hold-back
	// rule keeps neither off): 13 free on the node, at most 7 on one GPU.
	for name, units := range map[string]int64{"a": 10, "b": 9} {
		p := gpuPod(name, units)
		if _, err := e.client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if code, msg := e.bind(p, "frag"); code != http.StatusOK {
			t.Fatalf("bind %s: %d %s", name, code, msg)
		}
	}
	e.filter(frag, "frag", "small")
	e.filter(big, "frag", "small")
	e.filter(fits, "frag", "small")
	want := map[string]int{allocator.KindFragmented: 1, allocator.KindTooBig: 1}
	if err := testutil.GatherAndCompare(e.reg, strings.NewReader(pendingSeries(want)), "gpushare_extender_pending_pods"); err != nil {
		t.Fatal(err)
	}
	// The fragmented pod fits once n1 is a candidate; the big one is bound
	// there (the scheduler's bind after a filter that found room).
	if res := e.filter(frag, "frag", "n1"); res.NodeNames == nil || len(*res.NodeNames) != 1 {
		t.Fatalf("f on n1: %+v", res)
	}
	if code, msg := e.bind(big, "n1"); code != http.StatusOK {
		t.Fatalf("bind big: %d %s", code, msg)
	}
	if err := testutil.GatherAndCompare(e.reg, strings.NewReader(pendingSeries(nil)), "gpushare_extender_pending_pods"); err != nil {
		t.Fatal(err)
	}
}

// TestPendingPodsForgotten: the gauge drops a pod the cache holds bound,
// terminating or under another UID at once, and one it does not hold after
// unseenGrace (deleted, or never seen); the map is pruned as it grows
// without scrapes.
func TestPendingPodsForgotten(t *testing.T) {
	now := time.Unix(1000, 0)
	records := map[string]*cache.PodRecord{
		"bound":       {UID: "bound", NodeName: "n1"},
		"terminating": {UID: "terminating", Terminating: true},
		"recreated":   {UID: "other"},
		"pending":     {UID: "pending"},
	}
	p := newPendingPods(func(_, name string) (*cache.PodRecord, bool) {
		r, ok := records[name]
		return r, ok
	}, func() time.Time { return now })
	for _, name := range []string{"bound", "terminating", "recreated", "pending", "unseen"} {
		p.set(podNamed(name), allocator.KindInsufficient)
	}
	p.mu.Lock()
	if got := p.countLocked()[allocator.KindInsufficient]; got != 2 {
		t.Errorf("counted %d, want 2 (pending, and unseen within the grace)", got)
	}
	now = now.Add(unseenGrace + time.Second)
	if got := p.countLocked()[allocator.KindInsufficient]; got != 1 || len(p.byUID) != 1 {
		t.Errorf("after the grace: counted %d of %d remembered, want 1 of 1", got, len(p.byUID))
	}
	p.mu.Unlock()

	for i := range 3 * minPruneAt {
		p.set(podNamed(fmt.Sprintf("gone-%d", i)), allocator.KindWaiting)
		now = now.Add(time.Second)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.byUID) > 2*minPruneAt {
		t.Errorf("%d pods remembered without a scrape, want at most %d", len(p.byUID), 2*minPruneAt)
	}
}

func podNamed(name string) *corev1.Pod {
	p := gpuPod(name, 1)
	p.UID = types.UID(name)
	return p
}
