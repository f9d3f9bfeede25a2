package manager

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/inventory"
)

// EventRecorder is the part of client-go's events.EventRecorder the plugin
// uses; events.NewFakeRecorder satisfies it too.
type EventRecorder interface {
	Eventf(regarding, related runtime.Object, eventtype, reason, action, note string, args ...any)
}

// nodeEvents records the plugin's events on its Node, where `kubectl
// describe node` shows them: an Allocate refusal names no pod (the kubelet
// does not say whose container it is), and a GPU's health is the node's.
// A nil *nodeEvents records nothing.
type nodeEvents struct {
	rec EventRecorder
	// node is the Node's reference. Its UID is the node's name, as the
	// kubelet's own node events have it: kubectl describe node looks for
	// both, and the name needs no API read.
	node *corev1.ObjectReference
}

func newNodeEvents(rec EventRecorder, node string) *nodeEvents {
	return &nodeEvents{rec: rec, node: &corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: node, UID: types.UID(node)}}
}

// startEvents returns Config.Events, or else a recorder sending to the API
// server's events.k8s.io API through client until stop; the recorder folds
// repeats into series, so a refusal repeated by a crash-looping pod is one
// event with a count.
func startEvents(ctx context.Context, rec EventRecorder, client kubernetes.Interface) (EventRecorder, func()) {
	if rec != nil {
		return rec, func() {}
	}
	return StartEventRecorder(ctx, client)
}

// StartEventRecorder returns a recorder of the device plugin's events,
// sent through client's events.k8s.io API until the returned stop; repeats
// fold into series. When recording cannot start it returns a nil recorder
// (the events are lost, the plugin works on).
func StartEventRecorder(ctx context.Context, client kubernetes.Interface) (EventRecorder, func()) {
	b := events.NewBroadcaster(&events.EventSinkImpl{Interface: client.EventsV1()})
	if err := b.StartRecordingToSinkWithContext(ctx); err != nil {
		b.Shutdown()
		return nil, func() {} // the events are lost, the plugin works on
	}
	return b.NewRecorder(scheme.Scheme, gpushare.EventControllerDevicePlugin), b.Shutdown
}

func (e *nodeEvents) record(eventtype, reason, action, note string) {
	if e == nil || e.rec == nil {
		return
	}
	e.rec.Eventf(e.node, nil, eventtype, reason, action, "%s", gpushare.EventNote(note))
}

// allocateRefused records a refused Allocate call with the answer the
// kubelet got (which it shows on the pod only as UnexpectedAdmissionError).
func (e *nodeEvents) allocateRefused(units []uint64, err error) {
	e.record(corev1.EventTypeWarning, gpushare.EventReasonAllocateRefused, gpushare.EventActionAllocate,
		fmt.Sprintf("Allocate of %v units refused: %v", units, err))
}

// healthChanged records each GPU whose health differs between before and
// after (nil before: nothing was known, nothing changed).
func (e *nodeEvents) healthChanged(before, after *inventory.Inventory) {
	if e == nil || before == nil || after == nil {
		return
	}
	for _, g := range after.GPUs() {
		old, ok := before.GPU(g.Index)
		if !ok || old.Healthy == g.Healthy {
			continue
		}
		if g.Healthy {
			e.record(corev1.EventTypeNormal, gpushare.EventReasonGPUHealthy, gpushare.EventActionHealthCheck,
				fmt.Sprintf("GPU %d (%s) is healthy again", g.Index, g.UUID))
			continue
		}
		e.record(corev1.EventTypeWarning, gpushare.EventReasonGPUUnhealthy, gpushare.EventActionHealthCheck,
			fmt.Sprintf("GPU %d (%s) is unhealthy: %s", g.Index, g.UUID, g.Reason))
	}
}
