// Package translate turns a gpushare pod (containers limiting
// aliyun.com/gpu-mem, the gpu-count label, the isolation and topology
// annotations) into what the DRA driver gpu-mem.gpushare.io serves: one
// ResourceClaim per pod, made from a template whose name is the request's
// shape. It is pure: no API calls, no clock.
package translate

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

// Shape is everything a pod's claim asks for; equal shapes share a template.
type Shape struct {
	// MiB is each request's memory on each of its GPUs, in the template's
	// request order (request i is gpushare.DRARequestPrefix + i).
	MiB []uint64
	// Count is how many GPUs each request spans; 1 for a single-GPU pod.
	Count int
	// NVLink asks for every GPU of the claim in one NVLink domain (Count > 1).
	NVLink bool
	// PreferNVLink asks the allocator for the GPUs in one NVLink domain
	// where a node has such a set free, and for any GPUs where it has not:
	// topology preferred, for one request of Count > 1 without NVLink.
	PreferNVLink bool
	// Isolation is the tier the GPUs must offer; any (or "") selects none.
	Isolation gpushare.Isolation
	// ComputePercent is the compute share of each request, 0 for none.
	ComputePercent int
}

// ErrInvalidName marks a template name that is not a shape's.
var ErrInvalidName = errors.New("not a gpushare claim template name")

// tierTokens spells the tiers in names; "hami-core" would split at its dash.
var tierTokens = map[gpushare.Isolation]string{
	gpushare.IsolationNone: "none", gpushare.IsolationMPS: "mps", gpushare.IsolationHAMiCore: "hami",
}

// Name is the template's name: the prefix, each request's memory per GPU
// ("4gi", "512mi"), then "x<count>", "nvlink" or "nvlinkpref", the tier
// and "c<percent>" where they apply: gpushare-4gi-2gi-x2-nvlink-mps-c30.
func (s Shape) Name() string {
	parts := []string{strings.TrimSuffix(gpushare.DRATemplatePrefix, "-")}
	for _, m := range s.MiB {
		if m%1024 == 0 {
			parts = append(parts, strconv.FormatUint(m/1024, 10)+"gi")
		} else {
			parts = append(parts, strconv.FormatUint(m, 10)+"mi")
		}
	}
	if s.Count > 1 {
		parts = append(parts, "x"+strconv.Itoa(s.Count))
	}
	if s.NVLink {
		parts = append(parts, "nvlink")
	}
	if s.PreferNVLink {
		parts = append(parts, "nvlinkpref")
	}
	if t, ok := tierTokens[s.Isolation]; ok {
		parts = append(parts, t)
	}
	if s.ComputePercent > 0 {
		parts = append(parts, "c"+strconv.Itoa(s.ComputePercent))
	}
	return strings.Join(parts, "-")
}

// ParseName reads a shape back from a template's name, so a template the
// webhook made can be made again from the name a pod carries. Only the
// canonical spelling parses: ParseName(s.Name()) is s.
func ParseName(name string) (Shape, error) {
	rest, ok := strings.CutPrefix(name, gpushare.DRATemplatePrefix)
	if !ok {
		return Shape{}, fmt.Errorf("%w: %q lacks the prefix %q", ErrInvalidName, name, gpushare.DRATemplatePrefix)
	}
	s := Shape{Count: 1, Isolation: gpushare.IsolationAny}
	for _, tok := range strings.Split(rest, "-") {
		if err := s.read(tok); err != nil {
			return Shape{}, fmt.Errorf("%w: %q: %w", ErrInvalidName, name, err)
		}
	}
	if err := s.Valid(); err != nil {
		return Shape{}, fmt.Errorf("%w: %q: %w", ErrInvalidName, name, err)
	}
	if s.Name() != name {
		return Shape{}, fmt.Errorf("%w: %q is not spelled as %q", ErrInvalidName, name, s.Name())
	}
	return s, nil
}

// read takes one token of a name.
func (s *Shape) read(tok string) error {
	for tier, t := range tierTokens {
		if tok == t {
			s.Isolation = tier
			return nil
		}
	}
	switch {
	case tok == "nvlink":
		s.NVLink = true
	case tok == "nvlinkpref":
		s.PreferNVLink = true
	case strings.HasSuffix(tok, "gi") || strings.HasSuffix(tok, "mi"):
		n, err := strconv.ParseUint(tok[:len(tok)-2], 10, 32)
		if err != nil || n == 0 {
			return fmt.Errorf("memory %q is not a positive whole number", tok)
		}
		if tok[len(tok)-2] == 'g' {
			n *= 1024
		}
		s.MiB = append(s.MiB, n)
	case strings.HasPrefix(tok, "x"):
		n, err := strconv.Atoi(tok[1:])
		if err != nil {
			return fmt.Errorf("count %q is not a number", tok)
		}
		s.Count = n
	case strings.HasPrefix(tok, "c"):
		n, err := strconv.Atoi(tok[1:])
		if err != nil {
			return fmt.Errorf("compute share %q is not a number", tok)
		}
		s.ComputePercent = n
	default:
		return fmt.Errorf("unknown part %q", tok)
	}
	return nil
}

// Valid checks a shape can be a template.
func (s Shape) Valid() error {
	switch {
	case len(s.MiB) == 0:
		return errors.New("no request")
	case s.Count < 1 || s.Count > gpushare.MaxGPUsPerNode:
		return fmt.Errorf("count %d is not within 1-%d", s.Count, gpushare.MaxGPUsPerNode)
	case s.NVLink && s.Count == 1:
		return errors.New("nvlink needs a count above 1")
	case s.PreferNVLink && (s.Count == 1 || s.NVLink || len(s.MiB) != 1):
		return errors.New("nvlinkpref needs one request, a count above 1 and no nvlink")
	case s.ComputePercent < 0 || s.ComputePercent > 100:
		return fmt.Errorf("compute share %d is not within 0-100", s.ComputePercent)
	case s.ComputePercent > 0 && s.Isolation == gpushare.IsolationNone:
		return errors.New("a compute share cannot be enforced on tier none")
	}
	for _, m := range s.MiB {
		if m == 0 {
			return errors.New("a request of no memory")
		}
	}
	if errs := validation.IsDNS1123Subdomain(s.Name()); len(errs) > 0 {
		return fmt.Errorf("name %q: %s", s.Name(), strings.Join(errs, "; "))
	}
	return nil
}

// Request is the name of the shape's request i.
func Request(i int) string { return gpushare.DRARequestPrefix + strconv.Itoa(i) }

// Template is the ResourceClaimTemplate of the shape in namespace: one
// request of the driver's DeviceClass per share, each asking for its
// memory on Count GPUs. A single-GPU claim keeps all its requests on one
// GPU (matchAttribute uuid), as the extender puts a pod on one GPU; a
// multi-GPU request spans distinct GPUs, and NVLink keeps every GPU of the
// claim in one domain. PreferNVLink makes the request a list of two
// alternatives, the allocator taking the first that fits on a node: its
// GPUs in one domain (DRASubrequestLinked), else any (DRASubrequestAny).
func (s Shape) Template(namespace string) *resourceapi.ResourceClaimTemplate {
	attr := func(name string) *resourceapi.FullyQualifiedName {
		return ptr.To(resourceapi.FullyQualifiedName(gpushare.DRAQualifiedAttribute(name)))
	}
	var claim resourceapi.DeviceClaim
	for i, mib := range s.MiB {
		claim.Requests = append(claim.Requests, s.request(Request(i), mib))
		if s.Count > 1 {
			claim.Constraints = append(claim.Constraints,
				resourceapi.DeviceConstraint{Requests: []string{Request(i)}, DistinctAttribute: attr(gpushare.DRAAttributeUUID)})
		}
	}
	switch {
	case s.Count == 1 && len(s.MiB) > 1:
		claim.Constraints = append(claim.Constraints, resourceapi.DeviceConstraint{MatchAttribute: attr(gpushare.DRAAttributeUUID)})
	case s.NVLink:
		claim.Constraints = append(claim.Constraints, resourceapi.DeviceConstraint{MatchAttribute: attr(gpushare.DRAAttributeNVLinkDomain)})
	case s.PreferNVLink:
		claim.Constraints = append(claim.Constraints, resourceapi.DeviceConstraint{
			Requests: []string{Request(0) + "/" + gpushare.DRASubrequestLinked}, MatchAttribute: attr(gpushare.DRAAttributeNVLinkDomain)})
	}
	if s.ComputePercent > 0 {
		raw := fmt.Sprintf(`{"apiVersion":%q,"kind":%q,"computePercent":%d}`, gpushare.DRAParamsAPIVersion, gpushare.DRAParamsKind, s.ComputePercent)
		claim.Config = []resourceapi.DeviceClaimConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{
			Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: gpushare.DRADriverName, Parameters: runtime.RawExtension{Raw: []byte(raw)}}}}}
	}
	return &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: s.Name(), Namespace: namespace,
			Labels: map[string]string{gpushare.LabelManagedBy: gpushare.ManagedByWebhook}},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: claim}},
	}
}

// request is one share: mib on each of Count GPUs of the tier asked for;
// with PreferNVLink, the same asked twice as alternatives.
func (s Shape) request(name string, mib uint64) resourceapi.DeviceRequest {
	r := s.exact(mib)
	if !s.PreferNVLink {
		return resourceapi.DeviceRequest{Name: name, Exactly: r}
	}
	alternative := func(sub string) resourceapi.DeviceSubRequest {
		return resourceapi.DeviceSubRequest{Name: sub, DeviceClassName: r.DeviceClassName, Selectors: r.Selectors,
			AllocationMode: r.AllocationMode, Count: r.Count, Capacity: r.Capacity}
	}
	return resourceapi.DeviceRequest{Name: name, FirstAvailable: []resourceapi.DeviceSubRequest{
		alternative(gpushare.DRASubrequestLinked), alternative(gpushare.DRASubrequestAny)}}
}

// exact is one share's request: mib on each of Count GPUs of the tier.
func (s Shape) exact(mib uint64) *resourceapi.ExactDeviceRequest {
	r := &resourceapi.ExactDeviceRequest{
		DeviceClassName: gpushare.DRADeviceClassName,
		AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
		Count:           int64(s.Count),
		Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
			gpushare.DRACapacityMemory: *resource.NewQuantity(int64(mib)<<20, resource.BinarySI)}},
	}
	if _, ok := tierTokens[s.Isolation]; ok {
		r.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: gpushare.DRAIsolationSelector(s.Isolation)}}}
	}
	return r
}
