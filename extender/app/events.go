package app

import (
	"context"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"

	"github.com/gpushare/gpushare/extender/binder"
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
