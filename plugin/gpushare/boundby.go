package gpushare

// Who bound a pod. Two binders with two caches on the same nodes (the
// extender and gpushare-scheduler, or either beside Alibaba's extender) each
// place pods without seeing the other's in-flight charges, which can
// over-commit a GPU and break the race-free rule; each binder signs its
// Bindings so the other can tell, and say so.
const (
	// AnnotationBoundBy is written by the Binding with the binder's name
	// (one of the Binder values); pods bound by Alibaba's extender, by hand
	// or by an older version carry none.
	AnnotationBoundBy = "gpushare.io/bound-by"
	// BinderExtender is the scheduler extender's name in AnnotationBoundBy.
	BinderExtender = "gpushare-scheduler-extender"
	// BinderSchedulerPlugin is gpushare-scheduler's (the scheduler plugin's).
	BinderSchedulerPlugin = "gpushare-scheduler"
	// EventReasonForeignBinder (Warning, on a pod): a pod was bound with
	// gpushare annotations by another binder than the one recording it, on
	// a node this binder places pods on.
	EventReasonForeignBinder = "GPUShareForeignBinder"
)
