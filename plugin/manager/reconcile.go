package manager

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpushare/gpushare/plugin/allocate"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

// Reconciler pacing: a pass every reconcileEvery; after a failed write the
// passes back off up to reconcileMaxBackoff, so an API outage costs a few
// requests, and a record is repaired within reconcileEvery plus that backoff
// (well under 30 s) of the API server answering again.
const (
	reconcileEvery      = time.Second
	reconcileMaxBackoff = 16 * time.Second
	// reconcileBatch bounds the writes of one pass.
	reconcileBatch = 20
)

// reconciler repairs lost records: every pod whose containers the kubelet
// has started is recorded as served (allocate.Repairs says why that is
// safe), so no pod stays in flight, holding back its node, because an answer
// was given but its record never reached the pod.
type reconciler struct {
	alloc *allocator
	log   *zap.Logger
	// skip counts the ticks to sit out after a failure; backoff is the next skip.
	skip, backoff int
}

// tick runs a pass, unless it sits out the backoff of an earlier failure.
func (r *reconciler) tick(ctx context.Context) {
	if r.skip > 0 {
		r.skip--
		return
	}
	if err := r.pass(ctx); err != nil {
		r.backoff = min(max(2*r.backoff, 1), int(reconcileMaxBackoff/reconcileEvery))
		r.skip = r.backoff
		r.log.Warn("repairing pod records failed; trying again later", zap.Int("afterSeconds", r.skip), zap.Error(err))
		return
	}
	r.backoff = 0
}

// pass writes the missing records of one round; it returns the first write
// error that a later pass may overcome.
func (r *reconciler) pass(ctx context.Context) error {
	repairs := r.alloc.repairs()
	for i, rep := range repairs {
		if i == reconcileBatch {
			break
		}
		pod := rep.Pod
		err := r.alloc.src.PatchPod(ctx, pod.Namespace, pod.Name, pod.UID, func(p *corev1.Pod) (map[string]string, error) {
			ann, _, err := allocate.RecordAll(p, rep.Envs)
			if err != nil {
				return nil, fmt.Errorf("%w: %w", errBadRecord, err)
			}
			return ann, nil
		})
		switch {
		case err == nil:
			r.alloc.metrics.repair()
			r.log.Info("recorded a pod the kubelet started whose record was missing",
				zap.String("pod", pod.Namespace+"/"+pod.Name), zap.Int("containers", len(rep.Envs)))
		case permanent(err):
			r.log.Debug("pod record not repaired", zap.String("pod", pod.Namespace+"/"+pod.Name), zap.Error(err))
		default:
			return err
		}
	}
	return nil
}

// repairs computes what pass writes, under the allocator's lock so it reads
// the same pods and decoded state as Allocate, and marks every repaired
// container served in memory at once, as Allocate marks what it answers.
// The status proved them served, and the mark must not wait for the write:
// once the record is in the API the extender takes the pod out of flight
// and may place a pod of the same size on another GPU, while this plugin's
// watch may still show the pod unrecorded (a stalled watch, a lost answer
// to the write); unmarked, the pod would stay a candidate here and take
// that pod's call with its own environment.
func (a *allocator) repairs() []allocate.Repair {
	a.mu.Lock()
	defer a.mu.Unlock()
	inv := a.inventory()
	in := allocate.Input{Node: a.node, Inventory: inv, Pods: a.src.Pods(), Memo: a.memo, Isolation: a.tiers(inv)}
	if n, ok := a.src.Node(); ok {
		in.DisableIsolation = gpushare.IsolationDisabled(n.Labels)
	}
	reps := allocate.Repairs(in)
	for _, rep := range reps {
		for name, env := range rep.Envs {
			a.served.Add(rep.Pod.UID, name, env)
			a.prove(rep.Pod.UID, name)
		}
	}
	return reps
}
