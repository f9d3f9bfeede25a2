//go:build e2e

package e2e

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/webhook/translate"
)

// TestDRAWebhookPrefersNVLink: a multi-GPU gpushare pod with topology preferred (the default)
// gets the GPUs of one NVLink island from kube-scheduler's own allocator where the node has such a
// set free, and any GPUs where it has none, on a DRA node of two islands of four H100s (GPU 0
// held by another claim). Negative control: the same claim without the webhook's alternatives
// (the form it wrote before) takes the first four GPUs with room, GPUs 1-4, across both islands.
// A pod of five GPUs, which no island holds, still runs, on the alternative of any GPUs.
func TestDRAWebhookPrefersNVLink(t *testing.T) {
	t.Parallel()
	b := startDRABed(t)
	node := "dra-islands"
	b.addNode(t, node, "simulated:dgxh100:topology=islands", nil)
	ns := "gpu-islands"
	if _, err := b.client.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
		Labels: map[string]string{gpushare.LabelNamespaceDRA: gpushare.LabelValueDRA}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	startWebhook(t, b.c, node)
	domainOf := func(a allocation) []string {
		var out []string
		for _, d := range a.devices {
			out = append(out, b.deviceAttribute(t, node, d, gpushare.DRAAttributeNVLinkDomain))
		}
		return out
	}

	b.createTemplates(t, claimTemplate("fill-80", 80, 0))
	b.createPods(t, claimPod("fill", "fill-80", ""))
	b.waitPodsRunning(t, waitLong, "fill")
	full := b.podAllocation(t, "fill").devices[0]

	plain := translate.Shape{MiB: []uint64{8192}, Count: 4}.Template(b.claimNS)
	plain.Name = "four-no-preference"
	b.createTemplates(t, plain)
	b.createPods(t, claimPod("control", plain.Name, ""))
	b.waitPodsRunning(t, waitLong, "control")
	control := b.podAllocation(t, "control")
	if domains := slices.Compact(slices.Sorted(slices.Values(domainOf(control)))); len(domains) != 2 {
		t.Errorf("negative control: four GPUs without the preference got %v in NVLink domains %v; want both islands, "+
			"or the test cannot tell the preference from luck", control.devices, domains)
	}
	deleteAndWaitClaimsGone(t, b, b.claimNS, "control")

	quad := gpuMemPod(ns, "quad", "32")
	quad.Labels[gpushare.LabelPodGPUCount] = "4"
	five := gpuMemPod(ns, "five", "40")
	five.Labels[gpushare.LabelPodGPUCount] = "5"
	for _, p := range []*corev1.Pod{quad, five} {
		createWhenWebhookServes(t, b, p)
		waitPodsRunningIn(t, b, ns, 2*waitLong, p.Name)
	}
	linked := checkWebhookPod(t, b, ns, "quad", "gpushare-8gi-x4-nvlinkpref",
		map[string]webhookShare{"c0": {request: "gpu-0/" + gpushare.DRASubrequestLinked, gib: 8, gpus: 4, pod: 32}})
	fullDomain := b.deviceAttribute(t, node, full, gpushare.DRAAttributeNVLinkDomain)
	if domains := slices.Compact(domainOf(linked)); len(domains) != 1 || domains[0] == "" || domains[0] == fullDomain {
		t.Errorf("the preferred four got %v in domains %v; want the four of the island without the full GPU %s (%s)",
			linked.devices, domains, full, fullDomain)
	}
	checkWebhookPod(t, b, ns, "five", "gpushare-8gi-x5-nvlinkpref",
		map[string]webhookShare{"c0": {request: "gpu-0/" + gpushare.DRASubrequestAny, gib: 8, gpus: 5, pod: 40}})
}
