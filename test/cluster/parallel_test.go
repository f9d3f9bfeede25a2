package cluster

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
)

func TestParallel(t *testing.T) {
	var sum atomic.Int64
	if err := Parallel(t.Context(), 4, 100, func(_ context.Context, i int) error { sum.Add(int64(i)); return nil }); err != nil || sum.Load() != 4950 {
		t.Fatalf("Parallel = %v, sum %d; want nil, 4950", err, sum.Load())
	}
	boom := errors.New("boom")
	var calls atomic.Int64
	err := Parallel(t.Context(), 2, 10000, func(ctx context.Context, i int) error {
		calls.Add(1)
		if i == 3 {
			return boom
		}
		return ctx.Err()
	})
	if !errors.Is(err, boom) || calls.Load() == 10000 {
		t.Fatalf("Parallel = %v after %d calls; want boom, and the rest not started", err, calls.Load())
	}
}
