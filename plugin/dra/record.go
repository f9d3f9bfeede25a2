package dra

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/gpushare/gpushare/plugin/dra/prepare"
	"github.com/gpushare/gpushare/plugin/dra/store"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

// recordTarget is a prepared claim whose pod may need the device-plugin
// mode's record.
type recordTarget struct {
	claim *resourceapi.ResourceClaim
	done  store.Claim
}

// podRecord is the device-plugin mode's record of a pod the webhook
// translated (its claim gpushare.DRAPodClaimName is claim): _IDX the first
// request's first GPU, _POD the claim's units, _DEV that GPU's units,
// ASSIGNED true, and gpushare.io/container-env each container's variables
// by the request it names; so scripts and tools written for device-plugin
// mode read DRA pods alike. ok is false for any other pod: a claim it names
// itself, or by another entry, is not ours to describe. Only the keys whose
// value differs are returned.
func podRecord(pod *corev1.Pod, claim *resourceapi.ResourceClaim, done store.Claim) (map[string]string, bool, error) {
	if !translated(pod, claim.Name) {
		return nil, false, nil
	}
	envs, err := requestEnvs(claim.UID, done)
	if err != nil {
		return nil, false, err
	}
	first, ok := envs[firstRequest(done)]
	if !ok {
		return nil, false, fmt.Errorf("claim %s/%s: no variables for its first request", claim.Namespace, claim.Name)
	}
	byContainer := gpushare.ContainerEnvs{}
	for _, c := range append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...) {
		for _, ref := range c.Resources.Claims {
			request := ref.Request
			if request == "" && len(envs) == 1 {
				request = firstRequest(done) // the whole claim, of one request
			}
			if env, ok := envs[request]; ok && ref.Name == gpushare.DRAPodClaimName {
				byContainer[c.Name] = env
			}
		}
	}
	record, err := gpushare.EncodeContainerEnvs(byContainer)
	if err != nil {
		return nil, false, fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	want := map[string]string{
		gpushare.AnnotationGPUIndex:     strconv.Itoa(first.GPUIndex),
		gpushare.AnnotationPodUnits:     strconv.FormatUint(first.PodUnits, 10),
		gpushare.AnnotationDevUnits:     strconv.FormatUint(first.DevUnits, 10),
		gpushare.AnnotationAssigned:     "true",
		gpushare.AnnotationContainerEnv: record,
	}
	for k, v := range want {
		if pod.Annotations[k] == v {
			delete(want, k)
		}
	}
	return want, true, nil
}

// translated tells whether pod holds claimName through the webhook's entry.
func translated(pod *corev1.Pod, claimName string) bool {
	for _, s := range pod.Status.ResourceClaimStatuses {
		if s.Name == gpushare.DRAPodClaimName && s.ResourceClaimName != nil && *s.ResourceClaimName == claimName {
			return true
		}
	}
	return false
}

// requestEnvs reads each request's gpushare variables back from the
// claim's CDI devices: the checkpoint keeps the specification, so a
// restarted driver writes the same record.
func requestEnvs(uid types.UID, done store.Claim) (map[string]gpushare.ContainerEnv, error) {
	out := map[string]gpushare.ContainerEnv{}
	for _, d := range done.Spec.Devices {
		request := firstRequest(done)
		if d.Name != string(uid) {
			var ok bool
			if request, ok = strings.CutPrefix(d.Name, string(uid)+"-"); !ok {
				return nil, fmt.Errorf("CDI device %s is not of claim %s", d.Name, uid)
			}
		}
		vars := map[string]string{}
		for _, kv := range d.ContainerEdits.Env {
			if k, v, ok := strings.Cut(kv, "="); ok {
				vars[k] = v
			}
		}
		env, err := gpushare.ParseContainerEnv(vars)
		if err != nil {
			return nil, fmt.Errorf("CDI device %s: %w", d.Name, err)
		}
		out[request] = env
	}
	return out, nil
}

// firstRequest is the request of the claim's first share.
func firstRequest(done store.Claim) string {
	if len(done.Shares) == 0 {
		return ""
	}
	return prepare.BaseRequest(done.Shares[0].Request)
}

// writeRecords writes the record on the pods of targets, best effort: the
// record is for tools that read device-plugin mode's annotations, while the
// scheduler and the kubelet account DRA pods by their claims, so a failed
// write is logged and Prepare still succeeds. Each pod is read by the name
// and UID the claim reserves it for, and written only while it runs on this
// node; the patch carries the UID, so a pod recreated under the name is
// never written.
func writeRecords(ctx context.Context, log *zap.Logger, client kubernetes.Interface, node string, targets []recordTarget) {
	for _, t := range targets {
		for _, ref := range t.claim.Status.ReservedFor {
			if ref.APIGroup != "" || ref.Resource != "pods" {
				continue
			}
			if err := writeRecord(ctx, client, node, t, ref); err != nil {
				log.Warn("pod's gpushare record not written", zap.String("pod", t.claim.Namespace+"/"+ref.Name),
					zap.String("claim", t.claim.Name), zap.Error(err))
			}
		}
	}
}

func writeRecord(ctx context.Context, client kubernetes.Interface, node string, t recordTarget, ref resourceapi.ResourceClaimConsumerReference) error {
	pods := client.CoreV1().Pods(t.claim.Namespace)
	pod, err := pods.Get(ctx, ref.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if pod.UID != ref.UID || pod.Spec.NodeName != node {
		return nil
	}
	annotations, ok, err := podRecord(pod, t.claim, t.done)
	if err != nil || !ok || len(annotations) == 0 {
		return err
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"uid": pod.UID, "annotations": annotations}})
	if err != nil {
		return err
	}
	_, err = pods.Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "gpushare-dra-driver"})
	return err
}
