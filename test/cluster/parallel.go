package cluster

import (
	"context"
	"sync"
)

// Parallel calls fn(ctx, i) for every i in [0, n) from up to workers goroutines and returns the
// first error; the first error cancels the calls not yet started (and ctx of those running).
func Parallel(ctx context.Context, workers, n int, fn func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	work := make(chan int)
	errs := make(chan error, 1)
	var wg sync.WaitGroup
	for range min(workers, n) {
		wg.Go(func() {
			for i := range work {
				if err := fn(ctx, i); err != nil {
					select {
					case errs <- err:
					default:
					}
					cancel()
				}
			}
		})
	}
feed:
	for i := range n {
		select {
		case work <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(work)
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return ctx.Err()
	}
}
