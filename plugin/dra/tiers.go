package dra

import (
	"context"
	"fmt"
	"os"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/isolation"
)

// Tier probing limits, as in device-plugin mode.
const (
	probeTimeout    = 5 * time.Second
	maxStartBackoff = time.Minute
	stopTimeout     = 30 * time.Second
)

// tierWatch decides the node's tier: the flag or the node's label, its
// prerequisite probed, the MPS daemon started (again) while the tier is mps
// and the daemon does not answer, backed off while starts fail. It is the
// device-plugin mode's rule (plugin/manager/tiers.go) for a driver that
// refuses at Prepare instead of Allocate.
type tierWatch struct {
	cfg    IsolationConfig
	log    *zap.Logger
	labels func() map[string]string
	prober isolation.Prober

	started  bool
	failures int
	startErr string
	nextTry  time.Time
}

func newTierWatch(cfg IsolationConfig, log *zap.Logger, labels func() map[string]string) *tierWatch {
	return &tierWatch{cfg: cfg, log: log.Named("isolation"), labels: labels, prober: isolation.Prober{Config: cfg.Paths, MPS: cfg.MPS}}
}

// status is the tier's state now.
func (w *tierWatch) status(ctx context.Context) isolation.Status {
	tier, err := isolation.NodeTier(w.cfg.Tier, w.labels())
	if err != nil {
		return isolation.Status{Down: true, Reason: err.Error() + "; refusing every claim until it is fixed"}
	}
	if tier == gpushare.IsolationHAMiCore {
		w.ensureDirs()
	}
	st := w.probe(ctx, tier)
	if tier != gpushare.IsolationMPS || !st.Down || w.cfg.MPS == nil {
		return st
	}
	if !time.Now().Before(w.nextTry) && w.start(ctx) {
		return w.probe(ctx, tier)
	}
	if w.startErr != "" {
		st.Reason += "; starting it again failed: " + w.startErr
	}
	return st
}

func (w *tierWatch) probe(ctx context.Context, tier gpushare.Isolation) isolation.Status {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	return w.prober.Probe(ctx, tier)
}

// start starts the MPS daemon, backing off after failures.
func (w *tierWatch) start(ctx context.Context) bool {
	err := w.cfg.MPS.Start(ctx)
	if err == nil {
		w.started, w.failures, w.startErr = true, 0, ""
		w.log.Info("MPS control daemon started", zap.String("pipeDir", w.cfg.MPS.PipeDir()))
		return true
	}
	w.failures++
	w.startErr = err.Error()
	wait := min(w.cfg.ProbeEvery<<min(w.failures, 10), maxStartBackoff)
	w.nextTry = time.Now().Add(wait)
	w.log.Error("start the MPS control daemon; every claim is refused until it answers", zap.Int("failures", w.failures),
		zap.Duration("retryIn", wait), zap.Error(err))
	return false
}

// ensureDirs creates hami-core's lock directory and cache root, writable
// by every container user as HAMi's own plugin makes them.
func (w *tierWatch) ensureDirs() {
	p := w.cfg.Paths
	for dir, mode := range map[string]os.FileMode{p.HAMiLockDir: 0o777, p.HAMiCacheRoot: 0o755} {
		if dir == "" {
			continue
		}
		if err := os.MkdirAll(dir, mode); err != nil {
			w.log.Warn("create a hami-core directory", zap.String("dir", dir), zap.Error(err))
		} else if err := os.Chmod(dir, mode); err != nil {
			w.log.Warn("chmod a hami-core directory", zap.String("dir", dir), zap.Error(err))
		}
	}
}

// stop stops the MPS daemon at exit when this driver started it.
func (w *tierWatch) stop() {
	if w.cfg.MPS == nil || !w.started {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	if err := w.cfg.MPS.Stop(ctx); err != nil {
		w.log.Error("stop the MPS control daemon", zap.Error(err))
	}
}

// watchNodeLabels watches this node's Node (one object: a field selector
// on its name) and returns its labels now, nil before the first list.
func watchNodeLabels(ctx context.Context, client kubernetes.Interface, node string) (func() map[string]string, func(), error) {
	f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector(metav1.ObjectNameField, node).String()
	}))
	inf := f.Core().V1().Nodes()
	store := inf.Informer().GetStore()
	stop := make(chan struct{})
	f.Start(stop)
	stopAll := func() {
		close(stop)
		f.Shutdown()
	}
	if !cache.WaitForCacheSync(ctx.Done(), inf.Informer().HasSynced) {
		stopAll()
		return nil, nil, fmt.Errorf("watch node %s: %w", node, ctx.Err())
	}
	labels := func() map[string]string {
		obj, ok, err := store.GetByKey(node)
		if err != nil || !ok {
			return nil
		}
		if n, ok := obj.(*corev1.Node); ok {
			return n.Labels
		}
		return nil
	}
	return labels, stopAll, nil
}
