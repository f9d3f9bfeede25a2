package gpushare

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// ContainerRequest is one container's gpu-mem request.
type ContainerRequest struct {
	Name    string
	Index   int    // index in pod.spec.initContainers when Init, else in pod.spec.containers
	Init    bool   // an init container (sidecars included)
	Sidecar bool   // an init container with restartPolicy Always, running beside the regular ones
	Units   uint64 // > 0
}

// UnitsFromQuantity checks a gpu-mem quantity and returns it in units. It
// applies the API server's rule for extended resources (the value in milli
// units is a multiple of 1000) and counts Value(), as the kubelet's device
// manager does, so our count always equals the number of device IDs the
// kubelet asks for. Negative, fractional and above-MaxUnits values are a
// *RequestError (ErrInvalidRequest) without pod or container names.
func UnitsFromQuantity(q resource.Quantity) (uint64, error) {
	units, reason := quantityUnits(q)
	if reason != "" {
		return 0, &RequestError{Value: q.String(), Reason: reason}
	}
	return units, nil
}

// quantityUnits is UnitsFromQuantity returning a reason, so callers can add context.
func quantityUnits(q resource.Quantity) (uint64, string) {
	if q.Sign() < 0 {
		return 0, "is negative"
	}
	// Bound first: MilliValue overflows int64 on huge quantities, and both it
	// and CmpInt64 build 10^exponent, which for 1e999999999 never ends; the
	// float approximation is cheap and far from wrong near MaxUnits.
	if q.AsApproximateFloat64() > 2*float64(MaxUnits) || q.CmpInt64(int64(MaxUnits)) > 0 {
		return 0, "is above the limit of " + uintString(MaxUnits) + " units"
	}
	if q.MilliValue()%1000 != 0 {
		return 0, "is not a whole number of units"
	}
	return uint64(q.Value()), ""
}

// ContainerRequests returns the containers of pod that ask for gpu-mem: init
// containers first in spec order, then regular containers in spec order. A
// container's request is limits[ResourceName], or requests[ResourceName] when
// limits lack it (the API server defaults requests to limits for extended
// resources). Zero or absent means no request. The first invalid value is a
// *RequestError naming the pod and container.
func ContainerRequests(pod *corev1.Pod) ([]ContainerRequest, error) {
	if pod == nil {
		return nil, nil
	}
	var out []ContainerRequest
	add := func(c *corev1.Container, index int, init bool) error {
		q, ok := c.Resources.Limits[ResourceName]
		if !ok {
			q, ok = c.Resources.Requests[ResourceName]
		}
		if !ok {
			return nil
		}
		units, reason := quantityUnits(q)
		if reason != "" {
			return &RequestError{Pod: pod.Namespace + "/" + pod.Name, Container: c.Name, Value: q.String(), Reason: reason}
		}
		if units == 0 {
			return nil
		}
		out = append(out, ContainerRequest{
			Name:    c.Name,
			Index:   index,
			Init:    init,
			Sidecar: init && c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways,
			Units:   units,
		})
		return nil
	}
	for i := range pod.Spec.InitContainers {
		if err := add(&pod.Spec.InitContainers[i], i, true); err != nil {
			return nil, err
		}
	}
	for i := range pod.Spec.Containers {
		if err := add(&pod.Spec.Containers[i], i, false); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// PodUnits returns a pod's total request from its container requests, by the
// Kubernetes rule (k8s.io/component-helpers resource.PodRequests): the larger
// of (regular containers + sidecars) and the peak while init containers run,
// where each init container runs beside the sidecars started before it.
// Containers asking for zero may be left out: they never raise the peak.
func PodUnits(reqs []ContainerRequest) uint64 {
	var inits []ContainerRequest
	var regular uint64
	for _, r := range reqs {
		if r.Init {
			inits = append(inits, r)
		} else {
			regular += r.Units
		}
	}
	// Init containers start one by one in spec order; the peak depends on it.
	slices.SortStableFunc(inits, func(a, b ContainerRequest) int { return a.Index - b.Index })
	var sidecars, initPeak uint64
	for _, r := range inits {
		candidate := r.Units + sidecars
		if r.Sidecar {
			sidecars += r.Units
			candidate = sidecars
		}
		initPeak = max(initPeak, candidate)
	}
	return max(regular+sidecars, initPeak)
}

// PodRequest returns the pod's total gpu-mem request in units (see PodUnits).
func PodRequest(pod *corev1.Pod) (uint64, error) {
	reqs, err := ContainerRequests(pod)
	if err != nil {
		return 0, err
	}
	return PodUnits(reqs), nil
}
