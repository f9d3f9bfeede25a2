package cache

import (
	"errors"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/extender/preempt"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

// PodRecord is what the pod informer's store keeps of a pod instead of the
// pod: the store holds every unfinished pod of the cluster, and even a pod
// trimmed to the fields the extender reads costs about 3.8 KB (the Pod and
// Container structs and a gpu-mem ResourceList per container), a record
// about 700 bytes (BenchmarkPodStoreMemory). Its readers, which must find here all they use (add a field
// before reading it anywhere):
//
//   - podStateOf and upsertPod: UID, namespace, name, node, phase, the
//     assignment annotations, the request and the isolation annotations (the
//     latter part of an in-flight pod's signature);
//   - the binder (Cache.Pod, or RecordOf a pod it GETs): UID, namespace,
//     name, node, the assignment and container-env annotations, the request,
//     the isolation annotations and the multi-GPU form (where the pod may go);
//   - the informer's machinery: namespace and name (the store's key) and the
//     resource version (metav1.Object, record_meta.go).
//
// Records are shared by the store and its readers: never modify one.
type PodRecord struct {
	Namespace       string
	Name            string
	UID             types.UID
	ResourceVersion string
	NodeName        string
	Phase           corev1.PodPhase
	// Terminating is whether the pod has a deletion timestamp (the time
	// itself nobody reads).
	Terminating bool
	// Isolation is what the pod's isolation annotations ask, read once (two
	// bytes, in the padding after Terminating: the record does not grow).
	// When they cannot be read it is unreadable and RequestErr is their
	// error; it is left at the zero value when the request itself is invalid,
	// so an unreadable Isolation always means the request is fine.
	Isolation allocator.PodIsolation
	// GPUCount and LinksRequired are the pod's multi-GPU form
	// (gpushare.MultiGPU; its gpu-count label and topology annotation), in
	// the padding too. When they cannot be read RequestErr is their error
	// (ErrInvalidGPUCount). Only placing the pod needs them: a bound pod's
	// GPUs are read from its annotations, so a label edited after binding
	// changes nothing.
	GPUCount      uint8
	LinksRequired bool
	// Annotations are those of the pod the extender reads (keptAnnotations),
	// nil when it has none.
	Annotations map[string]string
	// Requests is the pod's gpu-mem request as gpushare.ContainerRequests
	// reads it (the containers asking for gpu-mem, validated, in units), and
	// RequestErr its error (or that of the isolation annotations, see
	// Isolation): an invalid request is reported by every reader exactly as
	// it was when they read it from the pod.
	Requests   []gpushare.ContainerRequest
	RequestErr error
	// NamesGPUMem is whether any container names aliyun.com/gpu-mem at all,
	// zero included: a gpu-mem: 0 pod is the scheduler's to send us, a pod
	// without the key is not (Requests keeps only non-zero requests).
	NamesGPUMem bool
	// GPUMemOnly is preempt.GPUMemOnly of the pod: the scheduler can have
	// chosen it as a victim for its GPU memory alone.
	GPUMemOnly bool
	// Priority is spec.priority (0 when unset), which preemption weighs; in
	// the padding after NamesGPUMem.
	Priority int32
}

// RecordOf returns the record of pod; pod is not kept or modified.
func RecordOf(pod *corev1.Pod) *PodRecord {
	reqs, err := gpushare.ContainerRequests(pod)
	var iso allocator.PodIsolation
	if err == nil {
		iso, err = allocator.ReadPodIsolation(pod.Annotations)
	}
	var multi gpushare.MultiGPU
	if err == nil {
		multi, err = gpushare.PodMultiGPU(pod.Namespace+"/"+pod.Name, pod.Labels, pod.Annotations, reqs)
	}
	return &PodRecord{
		Namespace:       pod.Namespace,
		Name:            pod.Name,
		UID:             pod.UID,
		ResourceVersion: pod.ResourceVersion,
		NodeName:        pod.Spec.NodeName,
		Phase:           pod.Status.Phase,
		Terminating:     pod.DeletionTimestamp != nil,
		Isolation:       iso,
		Annotations:     keptAnnotations(pod.Annotations),
		Requests:        slices.Clip(reqs),
		RequestErr:      err,
		GPUCount:        uint8(multi.Count), // at most MaxGPUsPerNode
		LinksRequired:   multi.LinksRequired,
		NamesGPUMem:     NamesGPUMem(pod),
		GPUMemOnly:      preempt.GPUMemOnly(pod),
		Priority:        priorityOf(pod),
	}
}

// NamesGPUMem reports whether a container or init container of pod names
// aliyun.com/gpu-mem in its limits or requests, whatever the value.
func NamesGPUMem(pod *corev1.Pod) bool {
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range cs {
			if _, ok := cs[i].Resources.Limits[gpushare.ResourceName]; ok {
				return true
			}
			if _, ok := cs[i].Resources.Requests[gpushare.ResourceName]; ok {
				return true
			}
		}
	}
	return false
}

// Request returns the pod's request with its isolation annotations and
// multi-GPU form, or the error reading any of them from the pod gave: what
// placing the pod needs.
func (r *PodRecord) Request() (allocator.Request, error) {
	if r.RequestErr != nil {
		return allocator.Request{}, r.RequestErr
	}
	return r.request(), nil
}

// ChargedRequest is Request for a pod that is bound already: unreadable
// isolation annotations do not hide the memory it holds (they may have been
// edited after it started), so they are no error here; the request carries
// them as unreadable, which makes the hold-back rule keep every pod of a
// size it has off the node while it is in flight.
func (r *PodRecord) ChargedRequest() (allocator.Request, error) {
	if r.RequestErr != nil && r.Isolation.Readable() && !errors.Is(r.RequestErr, gpushare.ErrInvalidGPUCount) {
		return allocator.Request{}, r.RequestErr
	}
	return r.request(), nil
}

func (r *PodRecord) request() allocator.Request {
	req := allocator.RequestOf(r.Namespace+"/"+r.Name, r.Requests)
	req.Isolation = r.Isolation
	req.GPUs = gpushare.MultiGPU{Count: int(r.GPUCount), LinksRequired: r.LinksRequired}
	return req
}

// compactPod is the pod informer's transform: it stores a PodRecord instead
// of the decoded pod, which becomes garbage at once. Anything else (a
// tombstone, or a record coming again) passes through unchanged, so it is
// idempotent, as client-go requires of a transform.
func compactPod(obj any) (any, error) {
	if pod, ok := obj.(*corev1.Pod); ok {
		return RecordOf(pod), nil
	}
	return obj, nil
}

// recordOf reads a pod event's object: the informer delivers records, but a
// whole pod (a tombstone's, or a test's) is read the same way.
func recordOf(obj any) (*PodRecord, bool) {
	switch o := obj.(type) {
	case *PodRecord:
		return o, true
	case *corev1.Pod:
		return RecordOf(o), true
	}
	return nil, false
}

// keptAnnotations returns the annotations the extender reads, nil when none:
// a kubectl last-applied-configuration alone can be as large as the pod. The
// keys are our constants, not the decoded copies, so they cost nothing per pod.
func keptAnnotations(in map[string]string) map[string]string {
	var out map[string]string
	for _, k := range [...]string{
		gpushare.AnnotationGPUIndex, gpushare.AnnotationPodUnits, gpushare.AnnotationDevUnits,
		gpushare.AnnotationAssigned, gpushare.AnnotationAssumeTime, gpushare.AnnotationAllocation,
		gpushare.AnnotationContainerEnv, gpushare.AnnotationBoundBy,
	} {
		if v, ok := in[k]; ok {
			if out == nil {
				out = make(map[string]string, 7)
			}
			out[k] = v
		}
	}
	return out
}

// GetObjectKind implements runtime.Object: a record has no kind of its own.
func (r *PodRecord) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject implements runtime.Object (client-go's mutation detector
// copies stored objects). The request error is an immutable value, shared.
func (r *PodRecord) DeepCopyObject() runtime.Object {
	out := *r
	out.Annotations = maps.Clone(r.Annotations)
	out.Requests = slices.Clone(r.Requests)
	return &out
}

// priorityOf is the pod's spec.priority, 0 when the admission plugin has not
// set one (the scheduler treats such pods the same).
func priorityOf(pod *corev1.Pod) int32 {
	if pod.Spec.Priority == nil {
		return 0
	}
	return *pod.Spec.Priority
}
