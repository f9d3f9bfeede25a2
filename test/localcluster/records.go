package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

// waitRecorded polls until every Running pod that asks for gpu-mem carries the device plugins'
// records (see unrecorded), printing which pods it still waits for whenever that changes. A pod
// is Running once its containers started, but the plugin writes its record on the pod after the
// kubelet confirmed who got the devices, a moment later; the inspector shows "(not allocated yet)"
// until then.
func waitRecorded(ctx context.Context, client kubernetes.Interface, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	last := ""
	for {
		pods, err := client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
		if err == nil {
			missing := unrecorded(pods.Items)
			if len(missing) == 0 {
				return nil
			}
			if line := strings.Join(missing, ", "); line != last {
				fmt.Printf("  waiting for the device plugins' and DRA drivers' records (%s and %s) on %d Running pods: %s\n",
					gpushare.AnnotationAssigned, gpushare.AnnotationContainerEnv, len(missing), line)
				last = line
			}
		}
		select {
		case <-ctx.Done():
			if ctx.Err() == context.DeadlineExceeded {
				return fmt.Errorf("the device plugins did not record every Running pod within %s (still missing: %s); see their logs in the cluster directory", timeout, last)
			}
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// unrecorded names (namespace/name) the Running pods asking for gpu-mem that the device plugin has
// not fully recorded yet: ALIYUN_COM_GPU_MEM_ASSIGNED=true, and a gpushare.io/container-env entry
// for each gpu-mem container (what the inspector shows as the container's limits).
func unrecorded(pods []corev1.Pod) []string {
	var out []string
	for i := range pods {
		p := &pods[i]
		if p.Status.Phase != corev1.PodRunning || recorded(p) {
			continue
		}
		out = append(out, p.Namespace+"/"+p.Name)
	}
	slices.Sort(out)
	return out
}

// recorded reports whether pod is fully recorded; a pod asking for no gpu-mem needs no record.
// A pod the webhook translated asks for none any more: its containers naming the webhook's claim
// need the DRA driver's record instead.
func recorded(pod *corev1.Pod) bool {
	var names []string
	reqs, err := gpushare.ContainerRequests(pod)
	if err != nil {
		// An invalid request gets no GPU from the plugin, so no record will come either.
		return true
	}
	for _, r := range reqs {
		names = append(names, r.Name)
	}
	names = append(names, claimContainers(pod)...)
	if len(names) == 0 {
		return true
	}
	if pod.Annotations[gpushare.AnnotationAssigned] != "true" {
		return false
	}
	envs, err := gpushare.DecodeContainerEnvs(pod.Annotations[gpushare.AnnotationContainerEnv])
	if err != nil {
		return false
	}
	for _, n := range names {
		if _, ok := envs[n]; !ok {
			return false
		}
	}
	return true
}

// claimContainers names the containers of pod that use the webhook's claim entry.
func claimContainers(pod *corev1.Pod) []string {
	var out []string
	for _, c := range append(slices.Clone(pod.Spec.InitContainers), pod.Spec.Containers...) {
		if slices.ContainsFunc(c.Resources.Claims, func(r corev1.ResourceClaim) bool { return r.Name == gpushare.DRAPodClaimName }) {
			out = append(out, c.Name)
		}
	}
	return out
}
