package cache

import (
	"cmp"
	"context"
	"slices"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
)

// Results of one verification, the values OnVerify receives.
const (
	// VerifyBound: the API server shows the pod bound to the charged node; the charge stays.
	VerifyBound = "bound"
	// VerifyReleased: the API server shows the pod deleted, replaced by
	// another pod of the same name, finished, unbound or bound elsewhere; the
	// charge is dropped.
	VerifyReleased = "released"
	// VerifyError: the GET failed; the charge stays and is verified again later.
	VerifyError = "error"
	// VerifyPending: the API server shows the pod unbound, but a Binding of it
	// without a definite answer may still be committed; the charge stays until
	// a GET started after the write horizon.
	VerifyPending = "pending"
)

// reasonUnbound is verdict's reason for a pod the API server shows unbound.
const reasonUnbound = "not bound"

// told reports a verification's result to OnVerify, if set.
func (c *Cache) told(result string) {
	if c.onVerify != nil {
		c.onVerify(result)
	}
}

// maxVerifyInterval caps the growing interval between two verifications of
// one charge, so a pod the informer never shows is looked at again every few
// minutes at most, and a long-stalled informer costs a few GETs per pod per
// hour.
const maxVerifyInterval = 5 * time.Minute

// check is one charge due for verification, as it was when picked.
type check struct {
	state                 *podState
	uid                   types.UID
	namespace, name, node string
	at                    time.Time // when it became due
}

// verifyDue asks the API server about the charges the informer has not
// confirmed in time: assumed pods whose bind has ended and pods a catch-up
// listed. At most batch of them per call, the longest overdue first, one GET
// at a time, so a cluster-wide informer stall costs a bounded rate of reads.
// The cache lock is never held across a GET.
func (c *Cache) verifyDue(ctx context.Context) {
	for _, ch := range c.due() {
		if ctx.Err() != nil {
			return
		}
		gctx, cancel := context.WithTimeout(ctx, c.verifyTimeout)
		readAt := c.now()
		pod, err := c.verify(gctx, ch.namespace, ch.name)
		cancel()
		if ctx.Err() != nil {
			return // stopping: a cancelled GET says nothing about the pod
		}
		c.settle(ch, pod, err, readAt)
	}
}

// due returns up to batch charges whose verification time has passed.
func (c *Cache) due() []check {
	now := c.now()
	c.mu.RLock()
	var out []check
	for _, p := range c.pods {
		// Confirmed pods have no verification time, and an assumed pod whose
		// bind is still running has none yet: neither is ever touched here.
		if (p.assumed || p.listed) && !p.verifyAt.IsZero() && !now.Before(p.verifyAt) {
			out = append(out, check{state: p, uid: p.uid, namespace: p.namespace, name: p.name, node: p.node, at: p.verifyAt})
		}
	}
	c.mu.RUnlock()
	slices.SortFunc(out, func(a, b check) int {
		return cmp.Or(a.at.Compare(b.at), cmp.Compare(a.uid, b.uid))
	})
	if len(out) > c.verifyBatch {
		out = out[:c.verifyBatch]
	}
	return out
}

// settle applies what the API server said, on a GET started at readAt, about
// ch, unless the charge changed meanwhile (the informer confirmed or removed
// it, or the binder forgot it).
func (c *Cache) settle(ch check, pod *corev1.Pod, err error, readAt time.Time) {
	result, reason := verdict(ch.uid, ch.node, pod, err)
	defer func() { c.told(result) }() // after the unlock below
	c.mu.Lock()
	defer c.unlock()
	if p, ok := c.pods[ch.uid]; !ok || p != ch.state {
		return
	}
	p := ch.state
	if result == VerifyReleased && reason == reasonUnbound && readAt.Before(p.landBy) {
		// Its Binding may still be committed: unbound says nothing yet.
		result = VerifyPending
	}
	fields := []zap.Field{zap.String("pod", p.namespace+"/"+p.name), zap.String("node", p.node), zap.String("charge", p.kind())}
	switch result {
	case VerifyPending:
		c.log.Info("pod not bound yet, but its Binding may still be committed; charge kept", append(fields, zap.Time("until", p.landBy))...)
		p.verifyAt = p.landBy
		return
	case VerifyReleased:
		c.log.Warn("charge released: the API server shows the pod "+reason, fields...)
		c.removeLocked(p)
		c.freed = true
		return
	case VerifyBound:
		// Our bind did land: what is unknown now is only why the informer
		// has not shown it. The charge stays; it is looked at again later.
		p.unverified = false
		c.log.Info("pod bound but not yet shown by the informer; charge kept", fields...)
	default:
		c.log.Warn("could not verify a charge with the API server; charge kept", append(fields, zap.Error(err))...)
	}
	p.checks++
	p.verifyAt = c.now().Add(verifyInterval(c.ttl, p.checks))
}

// kind names a charge the informer has not confirmed, for logs.
func (p *podState) kind() string {
	switch {
	case p.listed:
		return "listed at takeover"
	case p.unverified:
		return "bind outcome unknown"
	}
	return "assumed"
}

// verdict is what a GET of the pod says about a charge of uid on node:
// released only when the API server positively shows the pod does not hold
// it; any error but NotFound leaves the question open.
func verdict(uid types.UID, node string, pod *corev1.Pod, err error) (result, reason string) {
	switch {
	case apierrors.IsNotFound(err):
		return VerifyReleased, "deleted"
	case err != nil:
		return VerifyError, ""
	case pod == nil:
		return VerifyError, ""
	case pod.UID != uid:
		return VerifyReleased, "replaced by another pod of the same name"
	case finished(pod.Status.Phase):
		return VerifyReleased, "finished (" + string(pod.Status.Phase) + ")"
	case pod.Spec.NodeName == "":
		return VerifyReleased, reasonUnbound
	case pod.Spec.NodeName != node:
		return VerifyReleased, "bound to node " + pod.Spec.NodeName
	}
	return VerifyBound, ""
}

// verifyInterval is how long to wait before verifying a charge again after
// checks verifications that did not release it: the TTL, doubling, capped.
func verifyInterval(ttl time.Duration, checks int) time.Duration {
	limit := max(ttl, maxVerifyInterval)
	d := ttl
	for i := 1; i < checks && d < limit; i++ {
		d *= 2
	}
	return min(d, limit)
}
