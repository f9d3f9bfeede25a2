package cache

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpushare/gpushare/extender/allocator"
)

func (f *fixture) listed(uid string) bool {
	f.cache.mu.RLock()
	defer f.cache.mu.RUnlock()
	p, ok := f.cache.pods[Pod(uid, "", -1, false).UID]
	return ok && p.listed
}

func TestCatchUp(t *testing.T) {
	// "known" reached the informer; the others exist only in the quorum LIST.
	known := Pod("known", "n1", 0, true, 4)
	f := start(t, Node("n1", 64, 4, nil), known)
	f.waitUsed("n1", 4, 0, 0, 0)
	list := []corev1.Pod{
		*known,
		*Pod("late", "n1", 1, false, 8),
		*Pod("gone", "n1", 2, true, 2),
		*Pod("unbound", "", -1, false, 16),
		*Pod("foreign", "n1", -1, false, 16), // bound without our annotations: holds nothing
	}
	if n := f.cache.CatchUp(list); n != 2 {
		t.Fatalf("CatchUp added %d pods, want 2 (late, gone)", n)
	}
	f.waitUsed("n1", 4, 8, 2, 0)
	// Idempotent: a second LIST of the same pods changes nothing.
	if n := f.cache.CatchUp(list); n != 0 {
		t.Fatalf("second CatchUp added %d pods", n)
	}
	f.waitUsed("n1", 4, 8, 2, 0)
	if n, _ := f.cache.Node("n1"); len(n.InFlight) != 1 || n.InFlight[0].Pod != "default/late" {
		t.Fatalf("in flight = %+v, want the unassigned listed pod", n.InFlight)
	}

	// A listed pod is bound: a bind for it is refused and Forget leaves it.
	late := Pod("late", "", -1, false, 8)
	if _, err := f.cache.Assume(RecordOf(late), "n1", allocator.BestFit); !errors.Is(err, ErrAlreadyBound) {
		t.Fatalf("Assume of a listed pod err = %v, want ErrAlreadyBound", err)
	}
	f.cache.Forget(late.UID)
	// The lagging informer still delivers an older, unbound version of it.
	f.cache.upsertPod(late, false)
	f.waitUsed("n1", 4, 8, 2, 0)

	// The informer catches up with "late": confirmed, never verified.
	if _, err := f.client.CoreV1().Pods("default").Create(context.Background(), Pod("late", "n1", 1, false, 8), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.eventually("late confirmed by the informer", func() bool { return !f.listed("late") })

	// "gone" never shows up in the informer (deleted before it saw it): after
	// the TTL, not before, the cache asks the API server, which has no such
	// pod any more, and releases it.
	f.clock.Step(testTTL - time.Second)
	f.cache.verifyDue(context.Background())
	f.waitUsed("n1", 4, 8, 2, 0)
	f.clock.Step(2 * time.Second)
	f.cache.verifyDue(context.Background())
	f.waitUsed("n1", 4, 8, 0, 0)

	// A listed pod the informer reports deleted is released at once.
	if n := f.cache.CatchUp([]corev1.Pod{*Pod("short", "n1", 3, true, 5)}); n != 1 {
		t.Fatalf("CatchUp added %d pods, want 1", n)
	}
	f.waitUsed("n1", 4, 8, 0, 5)
	f.cache.deletePod(Pod("short", "n1", 3, true, 5))
	f.waitUsed("n1", 4, 8, 0, 0)
}
