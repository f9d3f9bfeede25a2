package translate

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

func gpuContainer(name string, units string) corev1.Container {
	c := corev1.Container{Name: name, Image: "x"}
	if units != "" {
		c.Resources.Limits = corev1.ResourceList{gpushare.ResourceName: resource.MustParse(units),
			corev1.ResourceCPU: resource.MustParse("1")}
	}
	return c
}

func pod(containers ...corev1.Container) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", Labels: map[string]string{}, Annotations: map[string]string{}},
		Spec: corev1.PodSpec{Containers: containers}}
}

func TestTranslate(t *testing.T) {
	sidecar := gpuContainer("side", "1")
	sidecar.RestartPolicy = ptr.To(corev1.ContainerRestartPolicyAlways)
	cases := []struct {
		name    string
		pod     func() *corev1.Pod
		shape   string
		holders []Holder
	}{
		{"one container", func() *corev1.Pod { return pod(gpuContainer("a", "4")) }, "gpushare-4gi",
			[]Holder{{Index: 0, Request: "gpu-0"}}},
		{"two containers and one without", func() *corev1.Pod {
			return pod(gpuContainer("a", "4"), gpuContainer("b", ""), gpuContainer("c", "2"))
		}, "gpushare-4gi-2gi", []Holder{{Index: 0, Request: "gpu-0"}, {Index: 2, Request: "gpu-1"}}},
		{"init container shares the smallest request that holds it", func() *corev1.Pod {
			p := pod(gpuContainer("a", "8"), gpuContainer("b", "3"))
			p.Spec.InitContainers = []corev1.Container{gpuContainer("init", "3")}
			return p
		}, "gpushare-8gi-3gi", []Holder{{Index: 0, Request: "gpu-0"}, {Index: 1, Request: "gpu-1"}, {Init: true, Index: 0, Request: "gpu-1"}}},
		{"init containers larger than every request share one more", func() *corev1.Pod {
			p := pod(gpuContainer("a", "2"))
			p.Spec.InitContainers = []corev1.Container{gpuContainer("i0", "5"), gpuContainer("i1", "6")}
			return p
		}, "gpushare-2gi-6gi", []Holder{{Index: 0, Request: "gpu-0"}, {Init: true, Index: 0, Request: "gpu-1"}, {Init: true, Index: 1, Request: "gpu-1"}}},
		{"a sidecar holds a request of its own", func() *corev1.Pod {
			p := pod(gpuContainer("a", "2"))
			p.Spec.InitContainers = []corev1.Container{sidecar}
			return p
		}, "gpushare-1gi-2gi", []Holder{{Init: true, Index: 0, Request: "gpu-0"}, {Index: 0, Request: "gpu-1"}}},
		{"gpu-count splits evenly, topology and tier", func() *corev1.Pod {
			p := pod(gpuContainer("a", "16"))
			p.Labels[gpushare.LabelPodGPUCount] = "4"
			p.Annotations[gpushare.AnnotationTopology] = gpushare.TopologyRequired
			p.Annotations[gpushare.AnnotationIsolation] = "hami-core"
			p.Annotations[gpushare.AnnotationComputePercent] = "25"
			return p
		}, "gpushare-4gi-x4-nvlink-hami-c25", []Holder{{Index: 0, Request: "gpu-0"}}},
		{"gpu-count with topology preferred (the default) prefers one NVLink domain", func() *corev1.Pod {
			p := pod(gpuContainer("a", "16"))
			p.Labels[gpushare.LabelPodGPUCount] = "2"
			return p
		}, "gpushare-8gi-x2-nvlinkpref", []Holder{{Index: 0, Request: "gpu-0"}}},
		{"the preference needs one request: two containers on two GPUs get none", func() *corev1.Pod {
			p := pod(gpuContainer("a", "16"), gpuContainer("b", "4"))
			p.Labels[gpushare.LabelPodGPUCount] = "2"
			p.Annotations[gpushare.AnnotationTopology] = gpushare.TopologyPreferred
			return p
		}, "gpushare-8gi-2gi-x2", []Holder{{Index: 0, Request: "gpu-0"}, {Index: 1, Request: "gpu-1"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tr, ok, err := Translate(tc.pod(), gpushare.GiB)
			if err != nil || !ok {
				t.Fatalf("Translate: ok %v, %v", ok, err)
			}
			if tr.Shape.Name() != tc.shape || !reflect.DeepEqual(tr.Holders, tc.holders) {
				t.Errorf("shape %s holders %+v; want %s %+v", tr.Shape.Name(), tr.Holders, tc.shape, tc.holders)
			}
			back, err := ParseName(tr.Shape.Name())
			if err != nil || !reflect.DeepEqual(back, tr.Shape) {
				t.Errorf("ParseName(%s) = %+v, %v; want %+v", tr.Shape.Name(), back, err, tr.Shape)
			}
		})
	}
}

func TestTranslateLeavesOtherPodsAlone(t *testing.T) {
	if _, ok, err := Translate(pod(gpuContainer("a", ""), gpuContainer("b", "0")), gpushare.GiB); ok || err != nil {
		t.Errorf("a pod without gpu-mem: ok %v, %v; want untouched", ok, err)
	}
}

// The refusals are the extender's own errors, word for word.
func TestTranslateRefuses(t *testing.T) {
	cases := []struct {
		name string
		pod  func() *corev1.Pod
		want error
		says string
	}{
		{"fraction", func() *corev1.Pod { return pod(gpuContainer("a", "1500m")) }, gpushare.ErrInvalidRequest, "not a whole number of units"},
		{"uneven split", func() *corev1.Pod {
			p := pod(gpuContainer("a", "6"))
			p.Labels[gpushare.LabelPodGPUCount] = "4"
			return p
		}, gpushare.ErrInvalidGPUCount, "do not divide evenly"},
		{"bad tier", func() *corev1.Pod {
			p := pod(gpuContainer("a", "2"))
			p.Annotations[gpushare.AnnotationIsolation] = "vgpu"
			return p
		}, gpushare.ErrInvalidIsolation, "is not one of none, mps, hami-core, any"},
		{"compute on none", func() *corev1.Pod {
			p := pod(gpuContainer("a", "2"))
			p.Annotations[gpushare.AnnotationIsolation] = "none"
			p.Annotations[gpushare.AnnotationComputePercent] = "50"
			return p
		}, gpushare.ErrInvalidIsolation, "cannot be enforced"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.pod()
			_, _, err := Translate(p, gpushare.GiB)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("err %v; want %v saying %q", err, tc.want, tc.says)
			}
			// The extender's words for the same pod.
			var extender error
			reqs, rerr := gpushare.ContainerRequests(p)
			switch {
			case rerr != nil:
				extender = rerr
			default:
				if _, merr := gpushare.PodMultiGPU(p.Namespace+"/"+p.Name, p.Labels, p.Annotations, reqs); merr != nil {
					extender = merr
				} else {
					_, _, extender = gpushare.PodIsolationRequest(p.Annotations)
				}
			}
			if extender == nil || err.Error() != extender.Error() {
				t.Errorf("webhook says %q, extender %v", err, extender)
			}
		})
	}
}

func TestPatchMakesTheClaim(t *testing.T) {
	p := pod(gpuContainer("a", "4"), gpuContainer("b", ""))
	p.Spec.InitContainers = []corev1.Container{gpuContainer("init", "2")}
	p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "other", ResourceClaimName: ptr.To("nic")}}
	tr, _, err := Translate(p, gpushare.GiB)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := tr.Patch(p)
	if err != nil {
		t.Fatal(err)
	}
	out := applyPatch(t, p, raw)
	wantClaims := []corev1.PodResourceClaim{p.Spec.ResourceClaims[0],
		{Name: gpushare.DRAPodClaimName, ResourceClaimTemplateName: ptr.To("gpushare-4gi")}}
	if !reflect.DeepEqual(out.Spec.ResourceClaims, wantClaims) {
		t.Errorf("resourceClaims %+v; want %+v", out.Spec.ResourceClaims, wantClaims)
	}
	for _, c := range append(out.Spec.InitContainers, out.Spec.Containers...) {
		if _, left := c.Resources.Limits[gpushare.ResourceName]; left {
			t.Errorf("container %s still limits %s", c.Name, gpushare.ResourceName)
		}
	}
	claimOf := func(c corev1.Container) []corev1.ResourceClaim { return c.Resources.Claims }
	want := []corev1.ResourceClaim{{Name: gpushare.DRAPodClaimName, Request: "gpu-0"}}
	if !reflect.DeepEqual(claimOf(out.Spec.Containers[0]), want) || !reflect.DeepEqual(claimOf(out.Spec.InitContainers[0]), want) ||
		claimOf(out.Spec.Containers[1]) != nil {
		t.Errorf("claims a %+v init %+v b %+v; want a and init %+v, b none", claimOf(out.Spec.Containers[0]),
			claimOf(out.Spec.InitContainers[0]), claimOf(out.Spec.Containers[1]), want)
	}
	if cpu := out.Spec.Containers[0].Resources.Limits[corev1.ResourceCPU]; cpu.String() != "1" {
		t.Errorf("cpu limit %s; the patch must keep the other resources", cpu.String())
	}
	if _, err := tr.Patch(out); !errors.Is(err, gpushare.ErrInvalidRequest) {
		t.Errorf("patching a translated pod again: %v; want refused", err)
	}
}

func applyPatch(t *testing.T, p *corev1.Pod, patch []byte) *corev1.Pod {
	t.Helper()
	doc, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	decoded, err := jsonpatch.DecodePatch(patch)
	if err != nil {
		t.Fatal(err)
	}
	patched, err := decoded.Apply(doc)
	if err != nil {
		t.Fatalf("apply %s: %v", patch, err)
	}
	var out corev1.Pod
	if err := json.Unmarshal(patched, &out); err != nil {
		t.Fatal(err)
	}
	return &out
}

func TestTemplate(t *testing.T) {
	s := Shape{MiB: []uint64{4096, 512}, Count: 1, Isolation: gpushare.IsolationMPS, ComputePercent: 30}
	tmpl := s.Template("ns")
	if tmpl.Name != "gpushare-4gi-512mi-mps-c30" || tmpl.Namespace != "ns" || tmpl.Labels[gpushare.LabelManagedBy] != gpushare.ManagedByWebhook {
		t.Errorf("meta %+v", tmpl.ObjectMeta)
	}
	d := tmpl.Spec.Spec.Devices
	if len(d.Requests) != 2 || d.Requests[1].Name != "gpu-1" {
		t.Fatalf("requests %+v", d.Requests)
	}
	r := d.Requests[1].Exactly
	if q := r.Capacity.Requests[gpushare.DRACapacityMemory]; q.String() != "512Mi" || r.Count != 1 || r.DeviceClassName != gpushare.DRADeviceClassName {
		t.Errorf("request %+v memory %s", r, q.String())
	}
	if len(r.Selectors) != 1 || r.Selectors[0].CEL.Expression != `device.attributes["gpu-mem.gpushare.io"].isolation == "mps"` {
		t.Errorf("selectors %+v", r.Selectors)
	}
	if len(d.Constraints) != 1 || *d.Constraints[0].MatchAttribute != "gpu-mem.gpushare.io/uuid" || d.Constraints[0].Requests != nil {
		t.Errorf("constraints %+v; want one GPU for every request", d.Constraints)
	}
	if len(d.Config) != 1 || !strings.Contains(string(d.Config[0].Opaque.Parameters.Raw), `"computePercent":30`) {
		t.Errorf("config %+v", d.Config)
	}
	multi := Shape{MiB: []uint64{8192, 8192}, Count: 2, NVLink: true}.Template("ns").Spec.Spec.Devices
	var kinds []string
	for _, c := range multi.Constraints {
		switch {
		case c.DistinctAttribute != nil:
			kinds = append(kinds, "distinct "+string(*c.DistinctAttribute)+" "+strings.Join(c.Requests, ","))
		case c.MatchAttribute != nil:
			kinds = append(kinds, "match "+string(*c.MatchAttribute)+" "+strings.Join(c.Requests, ","))
		}
	}
	want := []string{"distinct gpu-mem.gpushare.io/uuid gpu-0", "distinct gpu-mem.gpushare.io/uuid gpu-1", "match gpu-mem.gpushare.io/nvlinkDomain "}
	if !reflect.DeepEqual(kinds, want) || multi.Requests[0].Exactly.Count != 2 || multi.Requests[0].Exactly.Selectors != nil {
		t.Errorf("multi-GPU constraints %q count %d; want %q, count 2", kinds, multi.Requests[0].Exactly.Count, want)
	}
	var _ resourceapi.DeviceClaim = d
}

// A preferred NVLink set is one request of two alternatives alike but for
// their names, the linked one first and alone under the domain constraint,
// both under the distinct GPUs constraint.
func TestTemplatePrefersNVLink(t *testing.T) {
	d := Shape{MiB: []uint64{8192}, Count: 4, PreferNVLink: true, Isolation: gpushare.IsolationMPS}.Template("ns").Spec.Spec.Devices
	if len(d.Requests) != 1 || d.Requests[0].Exactly != nil || len(d.Requests[0].FirstAvailable) != 2 {
		t.Fatalf("requests %+v; want one of two alternatives", d.Requests)
	}
	linked, anyGPUs := d.Requests[0].FirstAvailable[0], d.Requests[0].FirstAvailable[1]
	if linked.Name != "linked" || anyGPUs.Name != "any" {
		t.Errorf("alternatives %q, %q; want linked, then any", linked.Name, anyGPUs.Name)
	}
	anyGPUs.Name = linked.Name
	if !reflect.DeepEqual(linked, anyGPUs) {
		t.Errorf("the alternatives differ beyond their names: %+v and %+v", linked, anyGPUs)
	}
	if q := linked.Capacity.Requests[gpushare.DRACapacityMemory]; q.String() != "8Gi" || linked.Count != 4 ||
		linked.AllocationMode != resourceapi.DeviceAllocationModeExactCount || len(linked.Selectors) != 1 {
		t.Errorf("alternative %+v; want 8Gi on each of exactly 4 GPUs of tier mps", linked)
	}
	want := []resourceapi.DeviceConstraint{
		{Requests: []string{"gpu-0"}, DistinctAttribute: ptr.To(resourceapi.FullyQualifiedName("gpu-mem.gpushare.io/uuid"))},
		{Requests: []string{"gpu-0/linked"}, MatchAttribute: ptr.To(resourceapi.FullyQualifiedName("gpu-mem.gpushare.io/nvlinkDomain"))},
	}
	if !reflect.DeepEqual(d.Constraints, want) {
		t.Errorf("constraints %+v; want %+v", d.Constraints, want)
	}
	// The name an earlier webhook gave the shape without alternatives still
	// parses, so the sweep keeps making it for the pods that name it.
	old, err := ParseName("gpushare-8gi-x4")
	if err != nil || old.PreferNVLink || old.Template("ns").Spec.Spec.Devices.Requests[0].Exactly == nil {
		t.Errorf("ParseName(gpushare-8gi-x4) = %+v, %v; want the shape without alternatives", old, err)
	}
}

func TestParseNameRefuses(t *testing.T) {
	for _, name := range []string{"other-4gi", "gpushare-", "gpushare-4gi-x1", "gpushare-04gi", "gpushare-4gi-nvlink",
		"gpushare-4gi-none-c20", "gpushare-4gi-c101", "gpushare-4gi-mps-x2", "gpushare-0gi", "gpushare-4gb", "gpushare-4gi-c0",
		"gpushare-4gi-nvlinkpref", "gpushare-4gi-x2-nvlink-nvlinkpref", "gpushare-4gi-4gi-x2-nvlinkpref"} {
		if s, err := ParseName(name); !errors.Is(err, ErrInvalidName) {
			t.Errorf("ParseName(%q) = %+v, %v; want ErrInvalidName", name, s, err)
		}
	}
}

func FuzzParseName(f *testing.F) {
	for _, s := range []string{"gpushare-4gi", "gpushare-4gi-512mi-x2-nvlink-mps-c30", "gpushare-1gi-hami", "gpushare-8gi-x4-nvlinkpref-none"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		s, err := ParseName(name)
		if err != nil {
			return
		}
		if s.Name() != name || s.Valid() != nil {
			t.Fatalf("ParseName(%q) = %+v, whose name is %q", name, s, s.Name())
		}
		_ = s.Template("ns")
	})
}
