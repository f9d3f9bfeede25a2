// Package gpushareplugin is the GPUShare plugin of kube-scheduler's
// framework: the scheduler extender's allocator, cache and binder
// (extender/...) run inside the scheduler. PreFilter reads the pod's
// request, Filter places it per GPU with the hold-back rule, Score is the
// extender's prioritize, Reserve charges the chosen GPUs in the cache so no
// later pod of the cycle takes them, Bind sends the one annotated Binding,
// and PreFilterExtensions let the scheduler's own preemption weigh victims
// per GPU.
package gpushareplugin

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/extender/binder"
	"github.com/gpushare/gpushare/extender/cache"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

// Name is the plugin's name in a KubeSchedulerConfiguration profile.
const Name = "GPUShare"

// Args are the plugin's arguments (pluginConfig[].args), the extender's
// flags of the same meaning.
type Args struct {
	// Policy is bestfit (the default), spread or firstfit.
	Policy string `json:"policy,omitempty"`
	// AssumeTTL is how long a charge the informer has not confirmed waits
	// before the cache asks the API server (default 90s, above the write
	// horizon); it never releases memory by itself.
	AssumeTTL metaDuration `json:"assumeTTL,omitempty"`
	// APIServerRequestTimeout is the API server's --request-timeout (default
	// 60s): a Binding without a clear answer may be committed until then
	// (plus 15s), so a read showing its pod unbound releases nothing before.
	APIServerRequestTimeout metaDuration `json:"apiServerRequestTimeout,omitempty"`
	// BindTimeout bounds the Binding (default 10s).
	BindTimeout metaDuration `json:"bindTimeout,omitempty"`
	// SyncTimeout bounds the wait for the plugin's informers at start
	// (default 2m); the scheduler does not start scheduling before.
	SyncTimeout metaDuration `json:"syncTimeout,omitempty"`
}

// metaDuration reads "30s" as kube-scheduler's own durations are written.
type metaDuration struct{ time.Duration }

func (d *metaDuration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("a duration is a string such as \"30s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	if v < 0 {
		return fmt.Errorf("duration %q is negative", s)
	}
	d.Duration = v
	return nil
}

// Plugin is the GPUShare plugin.
type Plugin struct {
	cache  *cache.Cache
	binder *binder.Binder
	policy allocator.Policy
	log    *zap.Logger
	// nodeInfo reads a node from the scheduler's snapshot of this cycle.
	nodeInfo func(name string) (fwk.NodeInfo, error)
	held     *heldPods
	// dra reads the scheduler's DRA objects for the DRA score; nil where
	// the scheduler runs without DRA.
	dra    fwk.SharedDRAManager
	slices sliceCache
}

var (
	_ fwk.PreFilterPlugin     = (*Plugin)(nil)
	_ fwk.FilterPlugin        = (*Plugin)(nil)
	_ fwk.PreScorePlugin      = (*Plugin)(nil)
	_ fwk.ScorePlugin         = (*Plugin)(nil)
	_ fwk.ReservePlugin       = (*Plugin)(nil)
	_ fwk.BindPlugin          = (*Plugin)(nil)
	_ fwk.PreFilterExtensions = (*Plugin)(nil)
)

// New builds the plugin from its arguments and starts its cache, returning
// once the cache has listed every pod, node and unhealthy-GPU ConfigMap (a
// placement against a half-built view could over-commit a GPU).
func New(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
	args, err := decodeArgs(obj)
	if err != nil {
		return nil, fmt.Errorf("%s args: %w", Name, err)
	}
	policy, err := allocator.ParsePolicy(args.Policy)
	if err != nil {
		return nil, fmt.Errorf("%s args: %w", Name, err)
	}
	log, err := zap.NewProduction()
	if err != nil {
		return nil, err
	}
	log = log.Named("gpushare")
	// The scheduler's own pod and node informers: one watch of each in the
	// process, each event decoded once. The cache starts them before the
	// scheduler does (a factory starts each informer once), to sync here.
	held := &heldPods{activate: func(pods map[string]*corev1.Pod) { h.Activate(klog.FromContext(ctx), pods) }}
	c, err := cache.New(cache.Config{Client: h.ClientSet(), Logger: log.Named("cache"), AssumeTTL: args.AssumeTTL.Duration,
		WriteHorizon: writeHorizon(args.APIServerRequestTimeout.Duration), Shared: h.SharedInformerFactory(), OnFreed: held.release,
		Binder: gpushare.BinderSchedulerPlugin, OnForeignBind: foreignBind(log.Named("cache"), h.EventRecorder())})
	if err != nil {
		return nil, err
	}
	go c.Run(ctx)
	syncTimeout := args.SyncTimeout.Duration
	if syncTimeout == 0 {
		syncTimeout = 2 * time.Minute
	}
	syncCtx, cancel := context.WithTimeout(ctx, syncTimeout)
	defer cancel()
	if !c.WaitForSync(syncCtx) {
		return nil, fmt.Errorf("%s: the GPU cache did not sync within %v", Name, syncTimeout)
	}
	b := binder.New(binder.Config{Client: h.ClientSet(), Cache: c, Policy: policy, Logger: log.Named("binder"), BindTimeout: args.BindTimeout.Duration,
		Name: gpushare.BinderSchedulerPlugin})
	log.Info("GPUShare plugin ready", zap.Stringer("policy", policy))
	nodeInfo := func(name string) (fwk.NodeInfo, error) { return h.SnapshotSharedLister().NodeInfos().Get(name) }
	return &Plugin{cache: c, binder: b, policy: policy, log: log, nodeInfo: nodeInfo, held: held, dra: h.SharedDRAManager()}, nil
}

// decodeArgs reads the plugin's arguments: none, or the JSON (or YAML
// turned JSON) kube-scheduler hands an out-of-tree plugin.
func decodeArgs(obj runtime.Object) (Args, error) {
	args := Args{Policy: allocator.BestFit.String()}
	u, ok := obj.(*runtime.Unknown)
	if obj == nil || !ok || len(u.Raw) == 0 {
		return args, nil
	}
	dec := json.NewDecoder(bytes.NewReader(u.Raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&args); err != nil {
		return Args{}, err
	}
	if args.Policy == "" {
		args.Policy = allocator.BestFit.String()
	}
	return args, nil
}

// Name returns the plugin's name.
func (p *Plugin) Name() string { return Name }

// writeHorizon is the cache's WriteHorizon for the API server's request
// timeout; zero means the cache's default.
func writeHorizon(requestTimeout time.Duration) time.Duration {
	if requestTimeout <= 0 {
		return 0
	}
	return requestTimeout + cache.WriteMargin
}

// foreignBind reports a pod bound by another binder (cache.Config.OnForeignBind)
// in the log and a Warning event on the pod. Standby replicas report too
// (their caches run): the recorder folds the repeats into one series.
func foreignBind(log *zap.Logger, rec events.EventRecorder) func(*cache.PodRecord) {
	return func(p *cache.PodRecord) {
		by := p.Annotations[gpushare.AnnotationBoundBy]
		if by == "" {
			by = "an unsigned binder (Alibaba's extender, a hand-made Binding or an older gpushare)"
		}
		log.Warn("pod bound with gpushare annotations by another binder: two binders with two caches can over-commit a GPU",
			zap.String("pod", p.Namespace+"/"+p.Name), zap.String("node", p.NodeName), zap.String("boundBy", by))
		ref := &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: p.Namespace, Name: p.Name, UID: p.UID}
		rec.Eventf(ref, nil, corev1.EventTypeWarning, gpushare.EventReasonForeignBinder, gpushare.EventActionBind, "%s",
			gpushare.EventNote("bound to node "+p.NodeName+" by "+by+", not by "+gpushare.BinderSchedulerPlugin+
				": two binders on the same nodes each place pods without the other's in-flight charges and can over-commit a GPU; run one (docs/operations.md)"))
	}
}
