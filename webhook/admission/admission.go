// Package admission serves the mutating admission webhook that lets
// gpushare pods run on DRA-mode nodes unchanged: it answers the API
// server's AdmissionReview for a pod by translating its aliyun.com/gpu-mem
// request into a ResourceClaim (webhook/translate), after making sure the
// claim's template exists.
package admission

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"

	"go.uber.org/zap"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/webhook/translate"
)

// MaxBody bounds a review: the API server sends objects of at most 3 MiB,
// twice over (object and oldObject) with room for the envelope.
const MaxBody = 8 << 20

// Templates makes sure a shape's claim template exists in a namespace.
type Templates interface {
	Ensure(ctx context.Context, namespace string, s translate.Shape) error
}

// Handler answers AdmissionReviews for pods.
type Handler struct {
	Unit      gpushare.Unit
	Templates Templates
	Log       *zap.Logger
}

// ServeHTTP reads one AdmissionReview and writes its answer. A malformed
// review is a 400 (the API server then applies the failure policy); a pod
// that cannot be translated is refused in the review with the reason.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "POST an AdmissionReview", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBody))
	if err != nil {
		http.Error(w, "reading the review: "+err.Error(), http.StatusRequestEntityTooLarge)
		return
	}
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &review); err != nil || review.Request == nil {
		http.Error(w, fmt.Sprintf("not an AdmissionReview with a request: %v", err), http.StatusBadRequest)
		return
	}
	review.Response = h.review(r.Context(), review.Request)
	review.Response.UID = review.Request.UID
	review.Request = nil
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(&review)
}

// review decides one request.
func (h *Handler) review(ctx context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	if req.Resource.Resource != "pods" || req.SubResource != "" || req.Operation != admissionv1.Create {
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	var pod corev1.Pod
	if err := json.Unmarshal(req.Object.Raw, &pod); err != nil {
		return refuse(http.StatusBadRequest, "the pod does not decode: "+err.Error())
	}
	// At admission a pod may have no name yet (generateName) and no namespace.
	pod.Namespace = req.Namespace
	if pod.Name == "" {
		pod.Name = pod.GenerateName + "<generated>"
	}
	t, ok, err := translate.Translate(&pod, h.Unit)
	if err != nil {
		h.Log.Info("refused", zap.String("pod", pod.Namespace+"/"+pod.Name), zap.Error(err))
		return refuse(http.StatusUnprocessableEntity, err.Error())
	}
	if !ok {
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	patch, err := t.Patch(&pod)
	if err != nil {
		return refuse(http.StatusUnprocessableEntity, err.Error())
	}
	if req.DryRun == nil || !*req.DryRun {
		if err := h.Templates.Ensure(ctx, pod.Namespace, t.Shape); err != nil {
			h.Log.Warn("no claim template", zap.String("pod", pod.Namespace+"/"+pod.Name), zap.String("template", t.Shape.Name()), zap.Error(err))
			return refuse(http.StatusInternalServerError, fmt.Sprintf("gpushare could not make the claim template %s/%s for pod %s: %v",
				pod.Namespace, t.Shape.Name(), pod.Name, err))
		}
	}
	h.Log.Debug("translated", zap.String("pod", pod.Namespace+"/"+pod.Name), zap.String("template", t.Shape.Name()))
	jsonPatch := admissionv1.PatchTypeJSONPatch
	return &admissionv1.AdmissionResponse{Allowed: true, Patch: patch, PatchType: &jsonPatch,
		Warnings: []string{"gpushare: " + string(gpushare.ResourceName) + " became resource claim " + gpushare.DRAPodClaimName +
			" from template " + t.Shape.Name()}}
}

// refuse is a refusal with the reason the user sees.
func refuse(code int32, message string) *admissionv1.AdmissionResponse {
	return &admissionv1.AdmissionResponse{Allowed: false, Result: &metav1.Status{Status: metav1.StatusFailure, Code: code, Message: message}}
}
