package app

import (
	"context"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"

	"github.com/gpushare/gpushare/extender/binder"
	"github.com/gpushare/gpushare/extender/cache"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

// startEvents starts sending the binder's events to the API server's
// events.k8s.io API; the recorder folds repeats into series and the
// broadcaster drops events rather than block a bind. It keeps sending past
// ctx's end, for the binds that finish in the shutdown grace, until stop,
// which Run calls on its way out.
func startEvents(ctx context.Context, client kubernetes.Interface) (rec binder.EventRecorder, stop func(), err error) {
	b := events.NewBroadcaster(&events.EventSinkImpl{Interface: client.EventsV1()})
	sendCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	if err := b.StartRecordingToSinkWithContext(sendCtx); err != nil {
		cancel()
		b.Shutdown()
		return nil, nil, err
	}
	stop = func() {
		b.Shutdown()
		cancel()
	}
	return b.NewRecorder(scheme.Scheme, gpushare.EventControllerExtender), stop, nil
}

// foreignBinds reports a pod bound by another binder (cache.Config.OnForeignBind)
// in the log, a Warning event on the pod and count, while this replica
// serves: a standby sees the leader's binds as it would another binder's.
func foreignBinds(log *zap.Logger, rec binder.EventRecorder, count func(), serving func() bool) func(*cache.PodRecord) {
	return func(p *cache.PodRecord) {
		if !serving() {
			return
		}
		count()
		by := p.Annotations[gpushare.AnnotationBoundBy]
		if by == "" {
			by = "an unsigned binder (Alibaba's extender, a hand-made Binding or an older gpushare)"
		}
		log.Warn("pod bound with gpushare annotations by another binder: two binders with two caches can over-commit a GPU",
			zap.String("pod", p.Namespace+"/"+p.Name), zap.String("node", p.NodeName), zap.String("boundBy", by))
		ref := &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: p.Namespace, Name: p.Name, UID: p.UID}
		rec.Eventf(ref, nil, corev1.EventTypeWarning, gpushare.EventReasonForeignBinder, gpushare.EventActionBind, "%s",
			gpushare.EventNote("bound to node "+p.NodeName+" by "+by+", not by "+gpushare.BinderExtender+
				": two binders on the same nodes each place pods without the other's in-flight charges and can over-commit a GPU; run one (docs/operations.md)"))
	}
}
