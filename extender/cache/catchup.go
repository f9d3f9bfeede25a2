package cache

import (
	corev1 "k8s.io/api/core/v1"
)

// CatchUp charges the bound, annotated pods of pods (a quorum LIST) that the
// cache does not know yet, and returns how many it added. A new leader calls
// it before serving: its informer may lag the API server, and the pods the
// previous leader bound last are exactly the ones a lagging informer misses.
//
// It is idempotent by UID and never replaces what the informer or a bind
// already charged (a pod's charge comes from annotations that do not change
// after its bind, so the entry the cache has is as good). Each added pod is treated as bound (a bind for it fails with
// ErrAlreadyBound, Forget leaves it) until the informer reports it, which
// replaces the entry. If the informer has not within the assume TTL (it lags,
// or the pod was deleted before the informer saw it and its watch relisted),
// the cache asks the API server and drops the charge only when the pod is
// shown gone, finished or no longer bound there, so a catch-up can neither
// leak capacity nor free memory a running pod holds.
func (c *Cache) CatchUp(pods []corev1.Pod) int {
	states := make([]*podState, 0, len(pods))
	for i := range pods {
		if ps, _ := c.podStateOf(RecordOf(&pods[i])); ps != nil {
			states = append(states, ps)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	verifyAt := c.now().Add(c.ttl)
	added := 0
	for _, ps := range states {
		if _, known := c.pods[ps.uid]; known {
			continue
		}
		ps.listed, ps.verifyAt = true, verifyAt
		c.addLocked(ps)
		added++
	}
	return added
}
