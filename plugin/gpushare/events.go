package gpushare

import "unicode/utf8"

// Kubernetes Events (events.k8s.io/v1) the extender and the device plugin
// record, so that `kubectl describe pod` and `kubectl describe node` tell
// what happened. Reasons are what users and alerts match on: they are part
// of the contract and never change; notes are free text for people.
// Events are informational only: nothing in gpushare reads them to decide.
const (
	// EventReasonScheduled (Normal, on a pod): the extender bound the pod;
	// the note names the node, the GPUs and the units used on each after it.
	EventReasonScheduled = "GPUShareScheduled"
	// EventReasonBindRefused (Warning, on a pod): the extender's bind verb
	// refused the pod; the note is the error it answered the scheduler with.
	EventReasonBindRefused = "GPUShareBindRefused"
	// EventReasonAllocateRefused (Warning, on a node): the device plugin
	// refused an Allocate call (no pod matched, the GPU would be
	// over-committed, the isolation tier is down).
	EventReasonAllocateRefused = "GPUShareAllocateRefused"
	// EventReasonGPUUnhealthy (Warning, on a node): a GPU became unhealthy;
	// the note names the GPU and why.
	EventReasonGPUUnhealthy = "GPUUnhealthy"
	// EventReasonGPUHealthy (Normal, on a node): a GPU is healthy again.
	EventReasonGPUHealthy = "GPUHealthy"
	// EventReasonOverUse (Warning, on a pod): one of the pod's containers
	// has used more GPU memory than its slice for longer than the usage
	// loop's grace period; the note names the container, the GPU, its use
	// and its slice. Repeats while it lasts fold into one series.
	EventReasonOverUse = "GPUShareOverUse"
)

// Actions of those events (events.k8s.io requires one): what the reporting
// program was doing when it recorded the event.
const (
	EventActionBind        = "Bind"
	EventActionAllocate    = "Allocate"
	EventActionHealthCheck = "HealthCheck"
	EventActionUsageCheck  = "UsageCheck"
)

// Reporting controllers (events.k8s.io's reportingController) of the two
// programs that record events.
const (
	EventControllerExtender     = "gpushare-scheduler-extender"
	EventControllerDevicePlugin = "gpushare-device-plugin"
)

// EventNoteLimit is the longest note the API server accepts (events.k8s.io
// validation): a longer one is refused, and the event lost.
const EventNoteLimit = 1024

// EventNote clips note to EventNoteLimit bytes on a rune boundary, marking
// the cut, so a long error still yields an event.
func EventNote(note string) string {
	if len(note) <= EventNoteLimit {
		return note
	}
	const mark = "..."
	cut := EventNoteLimit - len(mark)
	for cut > 0 && !utf8.RuneStart(note[cut]) {
		cut--
	}
	return note[:cut] + mark
}
