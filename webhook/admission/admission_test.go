package admission

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.uber.org/zap"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/webhook/translate"
)

type fakeTemplates struct {
	made []string
	err  error
}

func (f *fakeTemplates) Ensure(_ context.Context, ns string, s translate.Shape) error {
	if f.err != nil {
		return f.err
	}
	f.made = append(f.made, ns+"/"+s.Name())
	return nil
}

func gpuPod(units string, annotations map[string]string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{GenerateName: "web-", Annotations: annotations},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "x",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{gpushare.ResourceName: resource.MustParse(units)}}}}}}
}

func post(t *testing.T, h http.Handler, pod *corev1.Pod, dryRun bool) *admissionv1.AdmissionResponse {
	t.Helper()
	raw, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	review := admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{UID: "u-1", Namespace: "team", Operation: admissionv1.Create, DryRun: ptr.To(dryRun),
			Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"}, Object: runtime.RawExtension{Raw: raw}}}
	body, _ := json.Marshal(review)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/mutate-pods", bytes.NewReader(body)))
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || out.Response == nil || out.Response.UID != "u-1" {
		t.Fatalf("answer %s: %v", rec.Body, err)
	}
	return out.Response
}

func TestHandlerTranslates(t *testing.T) {
	tmpl := &fakeTemplates{}
	h := &Handler{Unit: gpushare.GiB, Templates: tmpl, Log: zap.NewNop()}
	resp := post(t, h, gpuPod("4", nil), false)
	if !resp.Allowed || resp.PatchType == nil || *resp.PatchType != admissionv1.PatchTypeJSONPatch {
		t.Fatalf("response %+v", resp)
	}
	if !strings.Contains(string(resp.Patch), `"resourceClaimTemplateName":"gpushare-4gi"`) || len(tmpl.made) != 1 || tmpl.made[0] != "team/gpushare-4gi" {
		t.Errorf("patch %s, templates made %v", resp.Patch, tmpl.made)
	}
	// A dry run makes nothing.
	if resp := post(t, h, gpuPod("2", nil), true); !resp.Allowed || len(tmpl.made) != 1 {
		t.Errorf("dry run: allowed %v, templates %v", resp.Allowed, tmpl.made)
	}
}

func TestHandlerLeavesOtherPods(t *testing.T) {
	h := &Handler{Unit: gpushare.GiB, Templates: &fakeTemplates{}, Log: zap.NewNop()}
	p := gpuPod("4", nil)
	p.Spec.Containers[0].Resources = corev1.ResourceRequirements{}
	if resp := post(t, h, p, false); !resp.Allowed || resp.Patch != nil {
		t.Errorf("a pod without gpu-mem: %+v", resp)
	}
}

func TestHandlerRefuses(t *testing.T) {
	h := &Handler{Unit: gpushare.GiB, Templates: &fakeTemplates{}, Log: zap.NewNop()}
	resp := post(t, h, gpuPod("4", map[string]string{gpushare.AnnotationIsolation: "vgpu"}), false)
	if resp.Allowed || resp.Result == nil || resp.Result.Code != http.StatusUnprocessableEntity ||
		!strings.Contains(resp.Result.Message, `gpushare.io/isolation "vgpu" is not one of none, mps, hami-core, any`) {
		t.Errorf("bad tier: %+v", resp.Result)
	}
	h.Templates = &fakeTemplates{err: errors.New("forbidden")}
	resp = post(t, h, gpuPod("4", nil), false)
	if resp.Allowed || !strings.Contains(resp.Result.Message, "could not make the claim template team/gpushare-4gi") {
		t.Errorf("template refused: %+v", resp.Result)
	}
}

func TestHandlerMalformed(t *testing.T) {
	h := &Handler{Unit: gpushare.GiB, Templates: &fakeTemplates{}, Log: zap.NewNop()}
	for _, body := range []string{"", "{", `{"request":null}`, strings.Repeat("x", MaxBody+1)} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/mutate-pods", strings.NewReader(body)))
		if rec.Code < 400 || rec.Code >= 500 {
			t.Errorf("body of %d bytes: status %d", len(body), rec.Code)
		}
	}
	raw := []byte(`{"request":{"uid":"u","operation":"CREATE","resource":{"version":"v1","resource":"pods"},"object":{"spec":7}}}`)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/mutate-pods", bytes.NewReader(raw)))
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || out.Response.Allowed || out.Response.Result.Code != http.StatusBadRequest {
		t.Errorf("undecodable pod: %s", rec.Body)
	}
}
