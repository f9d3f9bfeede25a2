package translate

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

// Translation is what becomes of one pod.
type Translation struct {
	Shape Shape
	// Holders is each GPU container and the request it names.
	Holders []Holder
}

// Holder is a container holding one of the claim's requests.
type Holder struct {
	Init    bool // in spec.initContainers (sidecars included)
	Index   int  // its index there or in spec.containers
	Request string
}

// Translate reads what pod asks of gpushare and returns its translation;
// ok is false when it asks for no gpu-mem. Each regular container and
// sidecar gets a request of its own, so its limit is its share. An init
// container that runs alone before them shares the smallest request at
// least its size, as its memory is free again before they start; only when
// none is that large does it get a request of its own, which the claim
// then holds for the pod's life (the one case where DRA mode reserves more
// than device-plugin mode). Invalid requests, labels and annotations are
// refused with the errors the extender gives.
func Translate(pod *corev1.Pod, unit gpushare.Unit) (t Translation, ok bool, err error) {
	reqs, err := gpushare.ContainerRequests(pod)
	if err != nil || len(reqs) == 0 {
		return Translation{}, false, err
	}
	id := pod.Namespace + "/" + pod.Name
	multi, err := gpushare.PodMultiGPU(id, pod.Labels, pod.Annotations, reqs)
	if err != nil {
		return Translation{}, false, err
	}
	tier, percent, err := gpushare.PodIsolationRequest(pod.Annotations)
	if err != nil {
		return Translation{}, false, err
	}
	count := max(multi.Count, 1)
	t.Shape = Shape{Count: count, NVLink: multi.LinksRequired && count > 1, Isolation: tier, ComputePercent: percent}
	var alone []gpushare.ContainerRequest
	for _, r := range holdersFirst(reqs) {
		if r.Init && !r.Sidecar {
			alone = append(alone, r)
			continue
		}
		t.add(r, unit.ToMiB(r.Units/uint64(count)))
	}
	t.seat(alone, unit, count)
	// The allocator's alternatives are per request, so the preference is
	// asked only where one request holds every GPU (docs/dra.md).
	t.Shape.PreferNVLink = count > 1 && !t.Shape.NVLink && len(t.Shape.MiB) == 1
	if err := t.Shape.Valid(); err != nil {
		return Translation{}, false, fmt.Errorf("%w in pod %s: %w", gpushare.ErrInvalidRequest, id, err)
	}
	return t, true, nil
}

// holdersFirst orders requests as the template lists them: sidecars and
// regular containers in spec order (init containers first), then the init
// containers that run alone.
func holdersFirst(reqs []gpushare.ContainerRequest) []gpushare.ContainerRequest {
	out := slices.Clone(reqs)
	slices.SortStableFunc(out, func(a, b gpushare.ContainerRequest) int {
		return cmp.Compare(btoi(a.Init && !a.Sidecar), btoi(b.Init && !b.Sidecar))
	})
	return out
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// add gives container r a request of its own of mib per GPU.
func (t *Translation) add(r gpushare.ContainerRequest, mib uint64) {
	name := Request(len(t.Shape.MiB))
	t.Shape.MiB = append(t.Shape.MiB, mib)
	t.Holders = append(t.Holders, Holder{Init: r.Init, Index: r.Index, Request: name})
}

// seat gives each init container that runs alone the smallest request at
// least its size; those larger than every request share one more request
// of the largest of them.
func (t *Translation) seat(alone []gpushare.ContainerRequest, unit gpushare.Unit, count int) {
	var extra []gpushare.ContainerRequest
	var extraMiB uint64
	for _, r := range alone {
		mib := unit.ToMiB(r.Units / uint64(count))
		best := -1
		for i, m := range t.Shape.MiB {
			if m >= mib && (best < 0 || m < t.Shape.MiB[best]) {
				best = i
			}
		}
		if best < 0 {
			extra, extraMiB = append(extra, r), max(extraMiB, mib)
			continue
		}
		t.Holders = append(t.Holders, Holder{Init: true, Index: r.Index, Request: Request(best)})
	}
	if len(extra) == 0 {
		return
	}
	name := Request(len(t.Shape.MiB))
	t.Shape.MiB = append(t.Shape.MiB, extraMiB)
	for _, r := range extra {
		t.Holders = append(t.Holders, Holder{Init: true, Index: r.Index, Request: name})
	}
}

// PatchOp is one JSON Patch (RFC 6902) operation.
type PatchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

// Patch is the JSON Patch that turns pod into its translation: the claim
// from the shape's template in spec.resourceClaims, and each holder's
// gpu-mem limit and request replaced by the claim's request. A pod that
// already names a claim DRAPodClaimName is refused: it was translated, or
// its author chose the name, and either way a second claim would clash.
func (t Translation) Patch(pod *corev1.Pod) ([]byte, error) {
	for _, c := range pod.Spec.ResourceClaims {
		if c.Name == gpushare.DRAPodClaimName {
			return nil, fmt.Errorf("%w in pod %s/%s: it already has a resource claim named %q", gpushare.ErrInvalidRequest,
				pod.Namespace, pod.Name, gpushare.DRAPodClaimName)
		}
	}
	claim := corev1.PodResourceClaim{Name: gpushare.DRAPodClaimName, ResourceClaimTemplateName: ptrString(t.Shape.Name())}
	var ops []PatchOp
	if len(pod.Spec.ResourceClaims) == 0 {
		ops = append(ops, PatchOp{Op: "add", Path: "/spec/resourceClaims", Value: []corev1.PodResourceClaim{claim}})
	} else {
		ops = append(ops, PatchOp{Op: "add", Path: "/spec/resourceClaims/-", Value: claim})
	}
	for _, h := range t.Holders {
		list, path := pod.Spec.Containers, "/spec/containers/"
		if h.Init {
			list, path = pod.Spec.InitContainers, "/spec/initContainers/"
		}
		if h.Index >= len(list) {
			return nil, fmt.Errorf("container %d of pod %s/%s is gone", h.Index, pod.Namespace, pod.Name)
		}
		res := *list[h.Index].Resources.DeepCopy()
		delete(res.Limits, gpushare.ResourceName)
		delete(res.Requests, gpushare.ResourceName)
		res.Claims = append(res.Claims, corev1.ResourceClaim{Name: gpushare.DRAPodClaimName, Request: h.Request})
		ops = append(ops, PatchOp{Op: "add", Path: path + strconv.Itoa(h.Index) + "/resources", Value: res})
	}
	return json.Marshal(ops)
}

func ptrString(s string) *string { return &s }
