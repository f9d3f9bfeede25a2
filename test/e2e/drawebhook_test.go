//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/test/cluster"
	"github.com/gpushare/gpushare/test/localcluster/manifests"
)

// The webhook's names, as manifests/dra/webhook.yaml ships them.
const (
	webhookServiceAccount = "gpushare-webhook"
	webhookConfiguration  = "gpushare-webhook"
	// webhookProcess names the webhook's process, and so its CPU metrics.
	webhookProcess = "gpushare-webhook"
)

// draWebhook is gpushare-webhook running as a process with its Deployment's credentials, and the
// shipped MutatingWebhookConfiguration pointing at it.
type draWebhook struct {
	prog *cluster.Program
}

// startWebhook runs the webhook binary on a loopback port with the shipped ServiceAccount's
// token and registers the shipped MutatingWebhookConfiguration with a URL to it instead of the
// Service (the bed routes no Services), keeping its scope, match conditions and failure policy.
func startWebhook(t testing.TB, c *cluster.Cluster, node string, extra ...string) *draWebhook {
	t.Helper()
	bin, err := cluster.OwnBinaries(t.TempDir(), false)
	if err != nil {
		t.Fatal(err)
	}
	cert, key, ca, err := c.ServingCert("gpushare-webhook")
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := c.PodTokenKubeconfig(t.Context(), "kube-system", webhookServiceAccount, webhookServiceAccount+"-0", node)
	if err != nil {
		t.Fatal(err)
	}
	port, err := cluster.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"-listen", "127.0.0.1:" + strconv.Itoa(port), "-tls-cert-file", cert, "-tls-key-file", key,
		"-kubeconfig", kubeconfig, "-log-level", "debug"}, extra...)
	prog, err := c.StartProgram(webhookProcess, filepath.Join(bin, "gpushare-webhook"), args)
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(ca)
	if err != nil {
		t.Fatal(err)
	}
	cfg := shippedWebhookConfiguration(t)
	cfg.Webhooks[0].ClientConfig = admissionregistrationv1.WebhookClientConfig{
		URL: ptr.To(fmt.Sprintf("https://127.0.0.1:%d/mutate-pods", port)), CABundle: caPEM}
	if _, err := c.Client().AdmissionregistrationV1().MutatingWebhookConfigurations().Create(t.Context(), cfg, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return &draWebhook{prog: prog}
}

// shippedWebhookConfiguration is the MutatingWebhookConfiguration of manifests/dra.
func shippedWebhookConfiguration(t testing.TB) *admissionregistrationv1.MutatingWebhookConfiguration {
	t.Helper()
	dir, err := manifests.Dir()
	if err != nil {
		t.Fatal(err)
	}
	objs, err := manifests.Load(filepath.Join(dir, "dra"))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.GetKind() != "MutatingWebhookConfiguration" || o.GetName() != webhookConfiguration {
			continue
		}
		var cfg admissionregistrationv1.MutatingWebhookConfiguration
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &cfg); err != nil {
			t.Fatal(err)
		}
		if len(cfg.Webhooks) != 1 || cfg.Webhooks[0].FailurePolicy == nil || *cfg.Webhooks[0].FailurePolicy != admissionregistrationv1.Fail {
			t.Fatalf("manifests/dra's webhook configuration: want one webhook with failurePolicy Fail, got %+v", cfg.Webhooks)
		}
		return &cfg
	}
	t.Fatalf("manifests/dra ships no MutatingWebhookConfiguration %s", webhookConfiguration)
	return nil
}

// gpuMemPod is a gpushare pod as written for device-plugin mode: each container limits
// aliyun.com/gpu-mem to its units ("" for none).
func gpuMemPod(ns, name string, units ...string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{}, Annotations: map[string]string{}},
		Spec: corev1.PodSpec{TerminationGracePeriodSeconds: ptr.To[int64](0)}}
	for i, u := range units {
		c := corev1.Container{Name: "c" + strconv.Itoa(i), Image: "registry.k8s.io/pause:3.10"}
		if u != "" {
			c.Resources.Limits = corev1.ResourceList{gpushare.ResourceName: resource.MustParse(u)}
		}
		p.Spec.Containers = append(p.Spec.Containers, c)
	}
	return p
}

// TestDRAWebhook: gpushare pods written for device-plugin mode, unchanged, run on a DRA node
// through gpushare-webhook, with its shipped RBAC and configuration: a pod of one container, of
// two containers (both on one GPU, each with its own limit) and of aliyun.com/gpu-count 2 each
// get a claim from a template the webhook made, and every container runs with exactly its share;
// an uneven split is refused in the extender's words; a pod in a namespace not opted in is left as
// written; with the webhook down a gpu-mem pod is refused and any other pod is admitted; a
// template deleted while the webhook was down is made again when it starts, and an unused one is
// deleted after the grace period.
func TestDRAWebhook(t *testing.T) {
	t.Parallel()
	b := startDRABed(t)
	b.addNode(t, "dra-web", "simulated:dgxh100", nil)
	ns, plain := "gpu-team", "plain"
	for name, labels := range map[string]map[string]string{ns: {gpushare.LabelNamespaceDRA: gpushare.LabelValueDRA}, plain: nil} {
		if _, err := b.client.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	web := startWebhook(t, b.c, "dra-web", "-template-grace", "3s", "-sweep-interval", "300ms")

	one := gpuMemPod(ns, "one", "4")
	two := gpuMemPod(ns, "two", "3", "", "2")
	pair := gpuMemPod(ns, "pair", "16")
	pair.Labels[gpushare.LabelPodGPUCount] = "2"
	for _, p := range []*corev1.Pod{one, two, pair} {
		createWhenWebhookServes(t, b, p)
	}
	uneven := gpuMemPod(ns, "uneven", "5")
	uneven.Labels[gpushare.LabelPodGPUCount] = "2"
	if _, err := b.client.CoreV1().Pods(ns).Create(t.Context(), uneven, metav1.CreateOptions{}); err == nil ||
		!strings.Contains(err.Error(), "do not divide evenly over the 2 GPUs") {
		t.Errorf("an uneven split was %v; want refused in the extender's words", err)
	}
	untouched, err := b.client.CoreV1().Pods(plain).Create(t.Context(), gpuMemPod(plain, "as-written", "4"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if q := untouched.Spec.Containers[0].Resources.Limits[gpushare.ResourceName]; q.String() != "4" || len(untouched.Spec.ResourceClaims) != 0 {
		t.Errorf("a pod in a namespace not opted in was changed: limits %v, claims %+v", untouched.Spec.Containers[0].Resources.Limits, untouched.Spec.ResourceClaims)
	}

	for _, tmpl := range []string{"gpushare-4gi", "gpushare-3gi-2gi", "gpushare-8gi-x2-nvlinkpref"} {
		if log := web.prog.LogTail(200); !strings.Contains(log, `"msg":"made claim template","namespace":"gpu-team","template":"`+tmpl+`"`) {
			t.Errorf("the webhook's log does not say it made %s:\n%s", tmpl, log)
		}
	}
	waitPodsRunningIn(t, b, ns, 2*waitLong, "one", "two", "pair")
	checkWebhookPod(t, b, ns, "one", "gpushare-4gi", map[string]webhookShare{"c0": {request: "gpu-0", gib: 4, gpus: 1, pod: 4}})
	twoAlloc := checkWebhookPod(t, b, ns, "two", "gpushare-3gi-2gi", map[string]webhookShare{
		"c0": {request: "gpu-0", gib: 3, gpus: 1, pod: 5}, "c2": {request: "gpu-1", gib: 2, gpus: 1, pod: 5}})
	if devs := slices.Compact(slices.Sorted(slices.Values(twoAlloc.devices))); len(devs) != 1 {
		t.Errorf("pod two's containers are on GPUs %v; want one GPU for the pod, as the extender places it", devs)
	}
	pairAlloc := checkWebhookPod(t, b, ns, "pair", "gpushare-8gi-x2-nvlinkpref", map[string]webhookShare{"c0": {request: "gpu-0/" + gpushare.DRASubrequestLinked, gib: 8, gpus: 2, pod: 16}})
	if devs := slices.Compact(slices.Sorted(slices.Values(pairAlloc.devices))); len(devs) != 2 {
		t.Errorf("the gpu-count 2 pod got GPUs %v; want two distinct", devs)
	}
	checkDriverPodPolicy(t, b, "dra-web", ns, "two", plain, "as-written")

	// The webhook down: a gpu-mem pod is refused (failurePolicy Fail), any other pod admitted
	// (matchConditions keep it from calling the webhook at all).
	web.prog.Stop(5 * time.Second)
	if _, err := b.client.CoreV1().Pods(ns).Create(t.Context(), gpuMemPod(ns, "while-down", "4"), metav1.CreateOptions{}); err == nil ||
		!strings.Contains(err.Error(), "failed calling webhook") {
		t.Errorf("a gpu-mem pod while the webhook is down: %v; want refused", err)
	}
	if _, err := b.client.CoreV1().Pods(ns).Create(t.Context(), gpuMemPod(ns, "no-gpu", ""), metav1.CreateOptions{}); err != nil {
		t.Errorf("a pod without gpu-mem while the webhook is down: %v; want admitted", err)
	}
	// A template a running pod names, deleted while the webhook is down, is made again when it
	// starts: its name is its shape.
	if err := b.client.ResourceV1().ResourceClaimTemplates(ns).Delete(t.Context(), "gpushare-8gi-x2-nvlinkpref", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := web.prog.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, waitLong, "the deleted template made again", func() (bool, string) {
		_, err := b.client.ResourceV1().ResourceClaimTemplates(ns).Get(t.Context(), "gpushare-8gi-x2-nvlinkpref", metav1.GetOptions{})
		return err == nil, fmt.Sprint(err)
	})
	// Deleting the pods that name gpushare-4gi: the template goes after the 3 s grace.
	if err := b.client.CoreV1().Pods(ns).Delete(t.Context(), "one", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	waitFor(t, waitLong, "the unused template deleted", func() (bool, string) {
		_, err := b.client.ResourceV1().ResourceClaimTemplates(ns).Get(t.Context(), "gpushare-4gi", metav1.GetOptions{})
		return err != nil && strings.Contains(err.Error(), "not found"), fmt.Sprint(err)
	})
	if since := time.Since(deleted); since < 3*time.Second {
		t.Errorf("the template went %v after its last pod; want no sooner than the 3 s grace", since)
	}
	if _, err := b.client.ResourceV1().ResourceClaimTemplates(ns).Get(t.Context(), "gpushare-3gi-2gi", metav1.GetOptions{}); err != nil {
		t.Errorf("a template a running pod names: %v; want kept", err)
	}
}

// createWhenWebhookServes creates p, retrying while the webhook's listener is not up yet (a
// refusal saying the call failed), and checks the pod as admitted carries no gpu-mem limit.
func createWhenWebhookServes(t testing.TB, b *draBed, p *corev1.Pod) {
	t.Helper()
	waitFor(t, waitLong, "pod "+p.Name+" admitted", func() (bool, string) {
		got, err := b.client.CoreV1().Pods(p.Namespace).Create(t.Context(), p, metav1.CreateOptions{})
		if err != nil {
			if strings.Contains(err.Error(), "failed calling webhook") {
				return false, err.Error()
			}
			t.Fatalf("creating %s: %v", p.Name, err)
		}
		for _, c := range got.Spec.Containers {
			if _, left := c.Resources.Limits[gpushare.ResourceName]; left {
				t.Fatalf("pod %s was admitted with its gpu-mem limit: the webhook did not translate it", p.Name)
			}
		}
		return true, ""
	})
}

// waitPodsRunningIn waits until the pods of ns run.
func waitPodsRunningIn(t testing.TB, b *draBed, ns string, timeout time.Duration, names ...string) {
	t.Helper()
	waitFor(t, timeout, fmt.Sprintf("%d pods to run", len(names)), func() (bool, string) {
		var notYet []string
		for _, n := range names {
			p, err := b.client.CoreV1().Pods(ns).Get(t.Context(), n, metav1.GetOptions{})
			if err != nil || p.Status.Phase != corev1.PodRunning {
				notYet = append(notYet, n+" "+podState(p, err))
			}
		}
		return len(notYet) == 0, strings.Join(notYet, "; ")
	})
}

// webhookShare is what a container of a translated pod must run with.
type webhookShare struct {
	request string
	gib     uint64 // on each GPU
	gpus    int
	pod     uint64 // ALIYUN_COM_GPU_MEM_POD: the claim's units over all its requests
}

// checkWebhookPod checks the translated pod names the template, its claim's results, and each
// container's record in fake-cri: its own request's CDI devices, its GPU count and the gpushare
// variables for its share.
func checkWebhookPod(t testing.TB, b *draBed, ns, pod, template string, want map[string]webhookShare) allocation {
	t.Helper()
	p, err := b.client.CoreV1().Pods(ns).Get(t.Context(), pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Spec.ResourceClaims) != 1 || ptr.Deref(p.Spec.ResourceClaims[0].ResourceClaimTemplateName, "") != template {
		t.Fatalf("pod %s claims %s; want one claim from template %s", pod, jsonOf(p.Spec.ResourceClaims), template)
	}
	tmpl, err := b.client.ResourceV1().ResourceClaimTemplates(ns).Get(t.Context(), template, metav1.GetOptions{})
	if err != nil || tmpl.Labels[gpushare.LabelManagedBy] != gpushare.ManagedByWebhook {
		t.Fatalf("template %s: %v, labels %v", template, err, tmpl.GetLabels())
	}
	a := b.claimAllocation(t, ns, pod, gpushare.DRAPodClaimName)
	perRequest := map[string][]string{}
	for _, r := range a.claim.Status.Allocation.Devices.Results {
		perRequest[r.Request] = append(perRequest[r.Request], r.Device)
	}
	recs := criContainers(t, b.nodes[a.node].kubelet)
	for name, w := range want {
		if got := perRequest[w.request]; len(got) != w.gpus {
			t.Errorf("%s/%s: request %s has devices %v; want %d", pod, name, w.request, got, w.gpus)
		}
		ctrs := recs[ns+"/"+pod+"/"+name]
		if len(ctrs) != 1 {
			t.Errorf("%s/%s: fake-cri recorded %d containers", pod, name, len(ctrs))
			continue
		}
		env := map[string]string{gpushare.EnvContainerUnits: strconv.FormatUint(w.gib*uint64(w.gpus), 10),
			gpushare.EnvPodUnits: strconv.FormatUint(w.pod, 10)}
		for k, v := range env {
			if got, _ := ctrs[0].effective(k); got != v {
				t.Errorf("%s/%s runs with %s=%q, want %q (CDI devices %v)", pod, name, k, got, v, ctrs[0].CDIDevices)
			}
		}
		if idx, _ := ctrs[0].effective(gpushare.EnvGPUIndex); len(strings.Split(idx, ",")) != w.gpus {
			t.Errorf("%s/%s runs on GPUs %q, want %d", pod, name, idx, w.gpus)
		}
	}
	checkDRARecord(t, p, recs, want)
	return a
}

// checkDRARecord checks the device-plugin mode's record the driver's Prepare wrote on a translated
// pod before its containers started: ASSIGNED, _POD, _IDX and _DEV as the first container runs
// with them, and each container's variables in gpushare.io/container-env.
func checkDRARecord(t testing.TB, p *corev1.Pod, recs map[string][]criContainer, want map[string]webhookShare) {
	t.Helper()
	first := recs[p.Namespace+"/"+p.Name+"/"+p.Spec.Containers[0].Name]
	if len(first) != 1 {
		return // reported by the caller
	}
	ann := p.Annotations
	idx, _ := first[0].effective(gpushare.EnvGPUIndex)
	dev, _ := first[0].effective(gpushare.EnvDevUnits)
	podUnits, _ := first[0].effective(gpushare.EnvPodUnits)
	if ann[gpushare.AnnotationAssigned] != "true" || ann[gpushare.AnnotationPodUnits] != podUnits ||
		ann[gpushare.AnnotationGPUIndex] != strings.Split(idx, ",")[0] || ann[gpushare.AnnotationDevUnits] != dev {
		t.Errorf("pod %s's record: ASSIGNED %q, POD %q, IDX %q, DEV %q; want true, %s, first of %s, %s",
			p.Name, ann[gpushare.AnnotationAssigned], ann[gpushare.AnnotationPodUnits], ann[gpushare.AnnotationGPUIndex], ann[gpushare.AnnotationDevUnits], podUnits, idx, dev)
	}
	envs, err := gpushare.DecodeContainerEnvs(ann[gpushare.AnnotationContainerEnv])
	if err != nil || len(envs) != len(want) {
		t.Errorf("pod %s's container record %v (%v); want %d containers", p.Name, envs, err, len(want))
	}
	for name, w := range want {
		if got := envs[name].ContainerUnits; got != w.gib*uint64(w.gpus) {
			t.Errorf("pod %s's record of %s: %d units, want %d", p.Name, name, got, w.gib*uint64(w.gpus))
		}
	}
}

// checkDriverPodPolicy checks manifests/dra's pod policy on the real API server: the driver of
// node, with its DaemonSet pod's token, may write the record on a pod bound to its node, and is
// refused any other annotation or label on it, and any write to a pod not bound to its node (dry
// runs: nothing is written). The admin, whom the policy does not match, may make each write.
func checkDriverPodPolicy(t *testing.T, b *draBed, node, ns, own, otherNS, other string) {
	t.Helper()
	as := b.nodes[node].client
	patch := func(ns, name, body string) func(kubernetes.Interface) error {
		return func(c kubernetes.Interface) error {
			_, err := c.CoreV1().Pods(ns).Patch(t.Context(), name, types.MergePatchType, []byte(body), metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		}
	}
	refused := func(err error) bool {
		return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "ValidatingAdmissionPolicy 'gpushare-dra-driver-pods'")
	}
	record := `{"metadata":{"annotations":{"` + gpushare.AnnotationAssigned + `":"true","` + gpushare.AnnotationPodUnits + `":"99"}}}`
	if err := patch(ns, own, record)(as); err != nil {
		t.Errorf("the driver of %s writing the record of its pod %s: %v; want allowed", node, own, err)
	}
	writes := []struct {
		name string
		do   func(kubernetes.Interface) error
		want string
	}{
		{"another annotation", patch(ns, own, `{"metadata":{"annotations":{"gpushare.io/isolation":"none"}}}`), "metadata.annotations[gpushare.io/isolation]"},
		{"a label", patch(ns, own, `{"metadata":{"labels":{"app":"x"}}}`), "metadata.labels"},
		{"a pod not bound to its node", patch(otherNS, other, record), "may write only pods bound to its own node"},
	}
	// The API server loads policies through informers: wait until the first refusal is the policy's.
	waitFor(t, waitLong, "the DRA pod policy to be in force", func() (bool, string) {
		err := writes[0].do(as)
		return refused(err), fmt.Sprint(err)
	})
	for _, w := range writes {
		if err := w.do(as); !refused(err) || !strings.Contains(err.Error(), w.want) {
			t.Errorf("driver of %s, %s: %v; want refused by gpushare-dra-driver-pods with %q", node, w.name, err, w.want)
		}
		if err := w.do(b.client); err != nil {
			t.Errorf("%s as the admin (dry run): %v; the write itself must be valid", w.name, err)
		}
	}
}

func jsonOf(v any) string {
	data, _ := json.Marshal(v)
	return string(data)
}
