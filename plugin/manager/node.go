package manager

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/inventory"
	"github.com/gpushare/gpushare/plugin/isolation"
	"github.com/gpushare/gpushare/plugin/nvml"
	"github.com/gpushare/gpushare/plugin/server"
)

// nodeState is what the plugin publishes on its Node: the GPU count in status
// capacity and allocatable (no device-plugin resource, so only a PATCH sets
// it), the GPU description and, when known, the skipped GPUs.
type nodeState struct {
	count string // aliyun.com/gpu-count
	gpus  string // the gpushare.io/gpus annotation
	// skipped is the gpushare.io/skipped-gpus annotation: nil leaves it
	// alone, "" removes it (nothing skipped).
	skipped *string
}

// newNodeState describes inv with each GPU's effective tier (none before the
// first probe: tiers nil), without the skipped GPUs.
func newNodeState(inv *inventory.Inventory, simulated bool, tiers map[int]isolation.Status) (nodeState, error) {
	gpus := inv.NodeGPUs(simulated)
	for i, g := range gpus.GPUs {
		if s, ok := tiers[g.Index]; ok {
			gpus.GPUs[i].Isolation = s.Effective()
			if s.Down {
				gpus.GPUs[i].IsolationReason = s.Reason
			}
		}
	}
	desc, err := gpushare.EncodeNodeGPUs(gpus)
	if err != nil {
		return nodeState{}, fmt.Errorf("encode the node GPU description: %w", err)
	}
	return nodeState{count: strconv.Itoa(len(inv.GPUs())), gpus: desc}, nil
}

// withSkipped adds the skipped GPUs to s; none means the annotation goes.
func (s nodeState) withSkipped(skipped []nvml.SkippedGPU) (nodeState, error) {
	value := ""
	if len(skipped) > 0 {
		list := make([]gpushare.SkippedGPU, len(skipped))
		for i, g := range skipped {
			list[i] = gpushare.SkippedGPU{Index: g.Index, UUID: g.UUID, Model: g.Model, Reason: g.Reason}
		}
		enc, err := gpushare.EncodeSkippedGPUs(list)
		if err != nil {
			return nodeState{}, fmt.Errorf("encode the skipped GPUs: %w", err)
		}
		value = enc
	}
	s.skipped = &value
	return s, nil
}

// matches reports whether node already shows s, so nothing needs writing.
func (s nodeState) matches(node *corev1.Node) bool {
	same := func(l corev1.ResourceList) bool {
		q, ok := l[gpushare.ResourceCount]
		return ok && q.String() == s.count
	}
	if !same(node.Status.Capacity) || !same(node.Status.Allocatable) || node.Annotations[gpushare.AnnotationNodeGPUs] != s.gpus {
		return false
	}
	if s.skipped == nil {
		return true
	}
	got, ok := node.Annotations[gpushare.AnnotationSkippedGPUs]
	return got == *s.skipped && ok == (*s.skipped != "")
}

// patches returns the status and the metadata patch that write s.
func (s nodeState) patches() (status, meta []byte, err error) {
	status, err = json.Marshal(map[string]any{"status": map[string]any{
		"capacity":    map[string]string{string(gpushare.ResourceCount): s.count},
		"allocatable": map[string]string{string(gpushare.ResourceCount): s.count},
	}})
	if err != nil {
		return nil, nil, err
	}
	annotations := map[string]any{gpushare.AnnotationNodeGPUs: s.gpus}
	if s.skipped != nil {
		annotations[gpushare.AnnotationSkippedGPUs] = *s.skipped
		if *s.skipped == "" {
			annotations[gpushare.AnnotationSkippedGPUs] = nil // a merge patch's null deletes
		}
	}
	meta, err = json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
	return status, meta, err
}

// writeNode PATCHes s onto node, retrying each PATCH on any error by
// retryBackoff (Steps 1 means once). Both are idempotent.
func writeNode(ctx context.Context, client kubernetes.Interface, node string, s nodeState, retryBackoff wait.Backoff) error {
	status, meta, err := s.patches()
	if err != nil {
		return err
	}
	always := func(error) bool { return ctx.Err() == nil }
	if err := retry.OnError(retryBackoff, always, func() error {
		_, err := client.CoreV1().Nodes().PatchStatus(ctx, node, status)
		return err
	}); err != nil {
		return fmt.Errorf("patch node %s status %s: %w", node, gpushare.ResourceCount, err)
	}
	if err := retry.OnError(retryBackoff, always, func() error {
		_, err := client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, meta, metav1.PatchOptions{})
		return err
	}); err != nil {
		return fmt.Errorf("patch node %s annotations: %w", node, err)
	}
	return nil
}

// publishNode writes the GPU count and the GPU description of inv, with
// each GPU's tier, on node, retrying transient errors a few times; the
// skipped-GPU annotation is left to the republisher, which knows the
// skipped GPUs.
func publishNode(ctx context.Context, client kubernetes.Interface, node string, inv *inventory.Inventory, simulated bool, tiers map[int]isolation.Status) error {
	s, err := newNodeState(inv, simulated, tiers)
	if err != nil {
		return err
	}
	return writeNode(ctx, client, node, s, retry.DefaultBackoff)
}

// nodeView is the read side of the informer on this plugin's Node
// (plugin/podsource's Source).
type nodeView interface {
	Node() (*corev1.Node, bool)
	// Changed returns a channel closed at the next change (of a pod or the node).
	Changed() <-chan struct{}
}

// nodeViewOf returns the node informer behind alloc, when it has one.
func nodeViewOf(alloc server.Allocator) nodeView {
	if a, ok := alloc.(*allocator); ok && a.src != nil {
		return a.src
	}
	return nil
}

// nodeRecheckEvery bounds how often a Node seen without our publications is
// written again, so a writer that keeps undoing them, or an informer that
// lags behind our own PATCH, cannot make a tight loop of PATCHes.
const nodeRecheckEvery = time.Second

// republisher writes the node's publications again in the background: after
// each registration with the kubelet (a restarted kubelet may have reset
// the extended resources in status), and whenever the Node, as the informer
// shows it, lacks them or shows other values (a Node deleted and created
// again). Failed writes are retried with backoff until they succeed; the
// server never waits for them.
type republisher struct {
	log    *zap.Logger
	client kubernetes.Interface
	node   string
	// inv returns the current inventory; describe turns one into what is published.
	inv      func() *inventory.Inventory
	describe func(*inventory.Inventory) (nodeState, error)
	view     nodeView // nil: only kicks trigger
	kick     chan struct{}
	backoff  wait.Backoff // between failed tries of one publication; Steps large enough never to run out
	cancel   context.CancelFunc
	done     chan struct{}
}

// startRepublisher starts republishing m's node until stop or ctx ends.
func (m *Manager) startRepublisher(ctx context.Context, view nodeView) *republisher {
	lib := m.cfg.Library
	skipped, simulated := lib.Skipped(), lib.Simulated()
	ctx, cancel := context.WithCancel(ctx)
	r := &republisher{
		log: m.log, client: m.cfg.Client, node: m.cfg.Node, view: view, inv: m.inventory,
		describe: func(inv *inventory.Inventory) (nodeState, error) {
			s, err := newNodeState(inv, simulated, m.tierStatuses(inv))
			if err != nil {
				return s, err
			}
			return s.withSkipped(skipped)
		},
		kick:    make(chan struct{}, 1),
		backoff: wait.Backoff{Duration: m.cfg.MinBackoff, Factor: 2, Steps: math.MaxInt32, Cap: m.cfg.MaxBackoff},
		cancel:  cancel,
		done:    make(chan struct{}),
	}
	go r.run(ctx)
	return r
}

// trigger asks for a publication; triggers during one coalesce.
func (r *republisher) trigger() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// stop ends the republisher and waits for it.
func (r *republisher) stop() {
	r.cancel()
	<-r.done
}

// run publishes whenever next says so, until ctx ends.
func (r *republisher) run(ctx context.Context) {
	defer close(r.done)
	var last time.Time // the latest publication for a Node seen to differ
	for {
		why, ok := r.next(ctx, last)
		if !ok {
			return
		}
		if why == whyDiffers {
			last = time.Now()
		}
		r.publish(ctx, why)
	}
}

// Reasons for a publication, for the log.
const (
	whyRegistered = "registered with the kubelet"
	whyDiffers    = "the Node lacks or differs from the plugin's publications"
)

// next blocks until a publication is due, and says why; false when ctx ended.
func (r *republisher) next(ctx context.Context, last time.Time) (string, bool) {
	for {
		var changed <-chan struct{}
		var recheck *time.Timer
		if r.view != nil {
			// Taken before the check, so a change during it is not missed.
			changed = r.view.Changed()
			if !r.inSync() {
				due := time.Until(last.Add(nodeRecheckEvery))
				if due <= 0 {
					return whyDiffers, true
				}
				recheck = time.NewTimer(due)
			}
		}
		why, ok := r.wait(ctx, changed, recheck)
		if why != "" || !ok {
			return why, ok
		}
	}
}

// wait blocks for a kick (whyRegistered), a change, the recheck timer (both
// ""), or the end of ctx (false); it stops the timer.
func (r *republisher) wait(ctx context.Context, changed <-chan struct{}, recheck *time.Timer) (string, bool) {
	var due <-chan time.Time
	if recheck != nil {
		defer recheck.Stop()
		due = recheck.C
	}
	select {
	case <-ctx.Done():
		return "", false
	case <-r.kick:
		return whyRegistered, true
	case <-changed:
	case <-due:
	}
	return "", true
}

// inSync reports whether the informer's Node shows what the plugin publishes.
func (r *republisher) inSync() bool {
	node, ok := r.view.Node()
	if !ok {
		return false // deleted: write as soon as it is back
	}
	s, err := r.describe(r.inv())
	if err != nil {
		r.log.Error("describe the node's GPUs", zap.Error(err))
		return true // nothing could be written anyway
	}
	return s.matches(node)
}

// publish writes the publications, retrying with backoff until it succeeds
// or ctx ends; each try writes the latest state. The health watch writes
// the node too, when health changes: should the inventory have changed
// while a write was in flight, that write may have landed after the health
// watch's newer one, so it is made again with the newer inventory.
func (r *republisher) publish(ctx context.Context, why string) {
	backoff := r.backoff
	for {
		inv := r.inv()
		s, err := r.describe(inv)
		if err == nil {
			err = writeNode(ctx, r.client, r.node, s, wait.Backoff{Steps: 1})
		}
		if err == nil && r.inv() != inv {
			continue
		}
		if err == nil {
			r.log.Info("published the node's GPUs", zap.String("why", why))
			return
		}
		if ctx.Err() != nil {
			return
		}
		wait := backoff.Step()
		r.log.Warn("publish the node's GPUs; retrying", zap.String("why", why), zap.Duration("backoff", wait), zap.Error(err))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}
