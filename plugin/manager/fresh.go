package manager

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/gpushare/gpushare/plugin/allocate"
)

// The plugin's watch can lag the API server (a stalled or replaying watch).
// Lagging behind a pod that arrives only delays it; lagging behind a pod that
// left (refused at admission, deleted, recorded) is dangerous: the extender has
// seen it leave and may place a pod of the same size on another GPU, whose call
// the stale pod would then take with its own environment. So every answer is
// confirmed with a read from the API server, and a call the cache cannot match
// for a while is matched against a fresh list of the node's pods.
const (
	// listAfter is how long a call waits on the cache before listing the node's pods.
	listAfter = time.Second
	// listRetry is how long a call waits after a list the API server did not answer.
	listRetry = 250 * time.Millisecond
	// readTimeout bounds one read of the API server for a call.
	readTimeout = 2 * time.Second
)

// listPlan says when a call the cache cannot match lists the node's pods, and
// when it may be refused. "No pod waits for this call" is only known from a
// list that succeeded: a refusal from a stalled watch and a lost list answer
// would fail a pod that is bound and waiting (the soak saw it). So a failed
// list is retried every listRetry, and a call whose lists all fail is refused
// only at twice the wait: the kubelet admits the node's pods one at a time and
// must not hang on an API server that is down. A list that answered can
// refuse a call before the deadline (nobodyWaits); one that could not,
// because earlier answers were still unsettled, is made again once they are.
type listPlan struct {
	first, deadline, giveUp time.Time
	last                    time.Time // the last list; zero before the first
	lastOK                  bool
	definite                bool // a list succeeded at or after the deadline
	recheck                 bool // list again once no answer is unsettled
}

func newListPlan(start time.Time, wait time.Duration) *listPlan {
	deadline := start.Add(wait)
	first := start.Add(listAfter)
	if deadline.Before(first) {
		first = deadline
	}
	return &listPlan{first: first, deadline: deadline, giveUp: start.Add(2 * wait)}
}

// next is when the next list is due.
func (p *listPlan) next() time.Time {
	switch {
	case p.last.IsZero():
		return p.first
	case !p.lastOK:
		return p.last.Add(listRetry)
	case p.last.Before(p.deadline):
		return p.deadline
	}
	return p.giveUp
}

// due tells whether a list is due at now; settled says that no earlier
// answer is left unsettled.
func (p *listPlan) due(now time.Time, settled bool) bool {
	return !now.Before(p.next()) || (p.recheck && settled)
}

// listed notes a list made at now, answered or not.
func (p *listPlan) listed(now time.Time, ok bool) {
	p.last, p.lastOK = now, ok
	p.definite = p.definite || (ok && !now.Before(p.deadline))
	p.recheck = false // a lost answer is retried by next
}

// undecided notes that the list just answered would have refused the call
// but for answers still unsettled: it is made again once they are.
func (p *listPlan) undecided() { p.recheck = true }

// over tells whether a call still unmatched at now is refused.
func (p *listPlan) over(now time.Time) bool { return p.definite || !now.Before(p.giveUp) }

// wake is how long to wait at now for the next list or the refusal, unless the cache changes first.
func (p *listPlan) wake(now time.Time) time.Duration {
	at := p.next()
	if p.giveUp.Before(at) {
		at = p.giveUp
	}
	return max(at.Sub(now), 0)
}

// matchConfirmed is allocate.Match on in, every answer confirmed by a fresh
// read of its pod: a pod that changed since in was taken is replaced by what
// the API server has (or dropped when gone) and the call matched again. When
// the API server cannot be read the cached copy stands: the extender cannot
// place pods without it either. Each pod is read at most once, so it ends.
func (a *allocator) matchConfirmed(ctx context.Context, in allocate.Input, units []uint64) ([]allocate.Decision, error) {
	read := map[*corev1.Pod]bool{}
	for {
		decisions, err := allocate.Match(in, units)
		if err != nil {
			return nil, err
		}
		stale := false
		for _, d := range decisions {
			if read[d.Pod] {
				continue
			}
			fresh, changed := a.reread(ctx, d.Pod)
			if fresh != nil {
				read[fresh] = true
			}
			if changed {
				in.Pods = replacePod(in.Pods, d.Pod, fresh)
				stale = true
			}
		}
		if !stale {
			return decisions, nil
		}
		a.log.Info("the plugin's watch lags the API server: matching again on fresh reads")
	}
}

// reread reads p from the API server and reports whether it differs from p:
// gone (fresh nil), replaced by another pod of its name, or changed. On a
// failed read it answers p, unchanged.
func (a *allocator) reread(ctx context.Context, p *corev1.Pod) (fresh *corev1.Pod, changed bool) {
	rctx, cancel := context.WithTimeout(ctx, readTimeout)
	defer cancel()
	got, err := a.src.Get(rctx, p.Namespace, p.Name)
	switch {
	case apierrors.IsNotFound(err), err == nil && got.UID != p.UID:
		return nil, true
	case err != nil:
		a.log.Debug("cannot confirm an Allocate answer with the API server; answering from the cache", zap.Error(err))
		return p, false
	case got.ResourceVersion != p.ResourceVersion:
		return got, true
	}
	return p, false
}

// replacePod returns pods with old replaced by fresh, or removed when fresh is nil.
func replacePod(pods []*corev1.Pod, old, fresh *corev1.Pod) []*corev1.Pod {
	out := make([]*corev1.Pod, 0, len(pods))
	for _, p := range pods {
		switch {
		case p != old:
			out = append(out, p)
		case fresh != nil:
			out = append(out, fresh)
		}
	}
	return out
}

// nobodyWaits tells whether err, from a match on a list of the node's pods
// that the API server answered after the call arrived, proves that no
// in-flight container waits for the call, so it can be refused at once. The
// kubelet admits only pods it got from the API server, bound by then, and the
// list is a quorum read (resourceVersion ""), so it shows the call's pod if
// that is in flight. It proves nothing while an answer is unsettled (its mark
// may hide the container: TestAllocateOutlastsAnAnswerNobodyHolds), when a pod
// was skipped (its reason may depend on the tier's state, which changes), or
// on a GPU that looks over-committed (a pod that left frees it only once it
// is deleted): those calls keep the full wait.
func nobodyWaits(err error) bool {
	var none *allocate.NoMatchError
	return errors.As(err, &none) && len(none.Skipped) == 0
}

// listPods reads the node's pods from the API server; nil when it cannot.
func (a *allocator) listPods(ctx context.Context) []*corev1.Pod {
	rctx, cancel := context.WithTimeout(ctx, readTimeout)
	defer cancel()
	pods, err := a.src.List(rctx)
	if err != nil {
		a.log.Warn("cannot list the node's pods from the API server", zap.Error(err))
		return nil
	}
	return pods
}
