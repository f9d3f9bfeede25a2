//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpushare/gpushare/plugin/allocate"
	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/test/cluster"
)

// The device plugin's ServiceAccount and admission policy, as manifests/ names them.
const (
	pluginNamespace      = "kube-system"
	pluginServiceAccount = "gpushare-device-plugin"
	pluginPolicy         = "gpushare-device-plugin"
)

// nodeNameExtra is the user extra in which the API server names the node of the pod a token is
// bound to (ServiceAccountTokenPodNodeInfo).
const nodeNameExtra = "authentication.kubernetes.io/node-name"

// apiWrite is one API write, made with the given client and dry-run option.
type apiWrite func(ctx context.Context, c kubernetes.Interface, dryRun []string) error

// policyRefusal is a write the policy must refuse, and the part of its message that names the rule.
type policyRefusal struct {
	name string
	do   apiWrite
	want string
}

// TestDevicePluginAdmission checks manifests/base/device-plugin-admission.yaml on the real API server.
// Each plugin, with the token of a pod on its node as its DaemonSet pod has, writes what the
// plugin writes on its own node and the pods bound to it; every other write it makes is refused
// with the rule's message, even where RBAC is widened to allow it; credentials of the plugin's
// ServiceAccount without a node claim write nothing. Each refused write is made again by the
// admin (dry run), whom the policy does not match, and passes: the refusal is the policy's.
func TestDevicePluginAdmission(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	c := cluster.StartT(t, cluster.Config{NoScheduler: true})
	applyPluginObjects(t, c)
	// Node objects without kubelets: admission needs only the objects, and a token carries its
	// pod's node as long as the Node exists.
	gpus := map[corev1.ResourceName]int64{gpushare.ResourceName: 80, gpushare.ResourceCount: 1}
	if err := c.CreateNodes(ctx, []cluster.NodeSpec{
		{Name: "node-a", Resources: gpus, Annotations: map[string]string{"example.com/keep": "x"}},
		{Name: "node-b", Resources: gpus},
	}); err != nil {
		t.Fatal(err)
	}
	for name, node := range map[string]string{"on-a": "node-a", "on-b": "node-b", "unbound": ""} {
		createAdmissionPod(t, c, name, node)
	}
	a, b := pluginClient(t, c, "node-a"), pluginClient(t, c, "node-b")
	if u := whoAmI(t, a); u.Username != saPlugin || !slices.Equal(u.Extra[nodeNameExtra], []string{"node-a"}) {
		t.Fatalf("plugin A's token authenticates as %q with %s %v; want %s on node-a", u.Username, nodeNameExtra, u.Extra[nodeNameExtra], saPlugin)
	}
	waitPolicyInForce(t, a, "node-a")

	t.Run("allowed", func(t *testing.T) { checkAllowed(t, c.Client(), a, b) })
	t.Run("refused", func(t *testing.T) {
		checkRefused(t, c.Client(), a, refusedWrites())
		n, err := c.Client().CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
		if err != nil || n.Annotations[gpushare.AnnotationNodeGPUs] == "refused" {
			t.Errorf("node-a annotations %v (%v): a refused patch changed what it also allowed", n.Annotations, err)
		}
	})
	t.Run("no node claim", func(t *testing.T) { checkNoClaim(t, c) })
	t.Run("through a token fault proxy", func(t *testing.T) { checkTokenProxy(t, c) })
	t.Run("RBAC widened", func(t *testing.T) { checkWidened(t, c, a) })
}

// checkTokenProxy: behind the fault proxy that the soak puts between the plugins and the API
// server, each plugin keeps its own token's identity and node, so the policy still applies.
func checkTokenProxy(t *testing.T, c *cluster.Cluster) {
	proxy, err := c.StartTokenFaultProxy("admission-proxy")
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	path, err := proxy.Through(pluginKubeconfig(t, c, "node-b"))
	if err != nil {
		t.Fatal(err)
	}
	b := kubeconfigClient(t, path)
	if u := whoAmI(t, b); u.Username != saPlugin || !slices.Equal(u.Extra[nodeNameExtra], []string{"node-b"}) {
		t.Fatalf("plugin B through the proxy: user %q, %s %v; want %s on node-b", u.Username, nodeNameExtra, u.Extra[nodeNameExtra], saPlugin)
	}
	if err := patchNode("node-b", types.StrategicMergePatchType, gpuCountPatch("2"), "status")(t.Context(), b, nil); err != nil {
		t.Errorf("plugin B's GPU count through the proxy: %v", err)
	}
	checkRefused(t, c.Client(), b, []policyRefusal{{"node-a's GPU count through the proxy",
		patchNode("node-a", types.StrategicMergePatchType, gpuCountPatch("9"), "status"), "the device plugin of node node-b may write only its own node"}})
	if n := proxy.Count(cluster.Forward); n < 3 {
		t.Errorf("the proxy forwarded %d requests, want the 3 made through it", n)
	}
}

// applyPluginObjects applies the device plugin's shipped objects but its DaemonSet (no
// controller-manager runs it here): ServiceAccount, ClusterRole and binding, policy and binding.
func applyPluginObjects(t *testing.T, c *cluster.Cluster) {
	t.Helper()
	kinds := map[string]bool{}
	applyShipped(t, c, func(o *unstructured.Unstructured) bool {
		if o.GetName() != pluginServiceAccount || o.GetKind() == "DaemonSet" {
			return false
		}
		kinds[o.GetKind()] = true
		return true
	})
	for _, k := range []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
		if !kinds[k] {
			t.Fatalf("manifests/ ships no %s %s", k, pluginServiceAccount)
		}
	}
}

// createAdmissionPod creates default/name asking for 4 units of gpu-mem, bound to node ("": unbound;
// no scheduler runs).
func createAdmissionPod(t *testing.T, c *cluster.Cluster, name, node string) {
	t.Helper()
	limits := corev1.ResourceList{gpushare.ResourceName: resource.MustParse("4")}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{
			Name: "c", Image: "example.com/app:1", Resources: corev1.ResourceRequirements{Limits: limits},
		}}},
	}
	if _, err := c.Client().CoreV1().Pods("default").Create(t.Context(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// pluginKubeconfig has the credentials of a device plugin pod on node: a token of the plugin's
// ServiceAccount bound to a pod on that node (created here: no DaemonSet controller runs).
func pluginKubeconfig(t *testing.T, c *cluster.Cluster, node string) string {
	t.Helper()
	path, err := c.PodTokenKubeconfig(t.Context(), pluginNamespace, pluginServiceAccount, pluginServiceAccount+"-"+node, node)
	if err != nil {
		t.Fatal(err)
	}
	return path
}

func pluginClient(t *testing.T, c *cluster.Cluster, node string) kubernetes.Interface {
	t.Helper()
	return kubeconfigClient(t, pluginKubeconfig(t, c, node))
}

func kubeconfigClient(t testing.TB, path string) kubernetes.Interface {
	t.Helper()
	return kubeconfigClientWithLimits(t, path, 0, 0)
}

// kubeconfigClientWithLimits is kubeconfigClient at qps queries a second, burst above it (zero:
// client-go's defaults, 5 and 10).
func kubeconfigClientWithLimits(t testing.TB, path string, qps float32, burst int) kubernetes.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = qps, burst
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return client
}

// whoAmI is the user the API server authenticates the client's requests as.
func whoAmI(t *testing.T, c kubernetes.Interface) authenticationv1.UserInfo {
	t.Helper()
	r, err := c.AuthenticationV1().SelfSubjectReviews().Create(t.Context(), &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return r.Status.UserInfo
}

// waitPolicyInForce waits until the API server enforces the shipped policy on plugin, whose token
// is bound to a pod on node: it loads policies and bindings through informers, a moment after
// they are created. The probe is a dry run (admission runs, nothing is written) of a label on the
// plugin's own node, which RBAC allows and only the policy refuses.
func waitPolicyInForce(t *testing.T, plugin kubernetes.Interface, node string) {
	t.Helper()
	probe := patchNode(node, types.MergePatchType, `{"metadata":{"labels":{"gpushare-e2e/probe":"x"}}}`)
	if err := cluster.Poll(t.Context(), waitLong, "the device plugin's admission policy in force", func(ctx context.Context) (bool, error) {
		err := probe(ctx, plugin, []string{metav1.DryRunAll})
		if err == nil {
			err = errors.New("a dry run of a label on its own node passed")
		}
		return refusedByPolicy(err), err
	}); err != nil {
		t.Fatal(err)
	}
}

func refusedByPolicy(err error) bool {
	return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+pluginPolicy+"'")
}

func patchNode(name string, pt types.PatchType, body string, subresource ...string) apiWrite {
	return func(ctx context.Context, c kubernetes.Interface, dryRun []string) error {
		_, err := c.CoreV1().Nodes().Patch(ctx, name, pt, []byte(body), metav1.PatchOptions{DryRun: dryRun}, subresource...)
		return err
	}
}

func patchPod(name string, pt types.PatchType, body string, subresource ...string) apiWrite {
	return func(ctx context.Context, c kubernetes.Interface, dryRun []string) error {
		_, err := c.CoreV1().Pods("default").Patch(ctx, name, pt, []byte(body), metav1.PatchOptions{DryRun: dryRun}, subresource...)
		return err
	}
}

// annotationPatch is a merge patch setting annotations (a nil value removes one).
func annotationPatch(annotations map[string]any) string {
	body, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
	return string(body)
}

// gpuCountPatch is the plugin's nodes/status patch (plugin/manager: capacity and allocatable).
func gpuCountPatch(count string) string {
	body, _ := json.Marshal(map[string]any{"status": map[string]any{
		"capacity":    map[string]string{string(gpushare.ResourceCount): count},
		"allocatable": map[string]string{string(gpushare.ResourceCount): count},
	}})
	return string(body)
}

// checkAllowed makes, as plugins A and B, each write the plugin makes, and reads the result back.
func checkAllowed(t *testing.T, admin, a, b kubernetes.Interface) {
	ctx := t.Context()
	record := podRecordPatch(t, admin, "on-a")
	for _, s := range []struct {
		name   string
		client kubernetes.Interface
		do     apiWrite
	}{
		{"its node's annotations", a, patchNode("node-a", types.MergePatchType, annotationPatch(map[string]any{
			gpushare.AnnotationNodeGPUs: "published", gpushare.AnnotationSkippedGPUs: "skipped"}))},
		{"removing skipped-gpus", a, patchNode("node-a", types.MergePatchType, annotationPatch(map[string]any{gpushare.AnnotationSkippedGPUs: nil}))},
		{"its node's GPU count", a, patchNode("node-a", types.StrategicMergePatchType, gpuCountPatch("3"), "status")},
		{"the record on a pod bound to its node", a, patchPod("on-a", types.MergePatchType, record)},
		{"plugin B on its node", b, patchNode("node-b", types.MergePatchType, annotationPatch(map[string]any{gpushare.AnnotationNodeGPUs: "published-b"}))},
	} {
		if err := s.do(ctx, s.client, nil); err != nil {
			t.Errorf("%s: %v", s.name, err)
		}
	}
	n, err := admin.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, skipped := n.Annotations[gpushare.AnnotationSkippedGPUs]
	count := n.Status.Allocatable[gpushare.ResourceCount]
	if n.Annotations[gpushare.AnnotationNodeGPUs] != "published" || skipped || n.Annotations["example.com/keep"] != "x" || count.Value() != 3 {
		t.Errorf("node-a: annotations %v, allocatable %v; want gpus published, no skipped-gpus, example.com/keep kept, gpu-count 3", n.Annotations, n.Status.Allocatable)
	}
	p, err := admin.CoreV1().Pods("default").Get(ctx, "on-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Annotations[gpushare.AnnotationAssigned] != "true" || p.Annotations[gpushare.AnnotationContainerEnv] == "" {
		t.Errorf("pod on-a annotations %v: the plugin's record did not land", p.Annotations)
	}
}

// podRecordPatch is the patch the plugin writes when it served the only container of the pod
// (plugin/podsource PatchPod with allocate.Record): the pod has no placement from the extender,
// so the record names every annotation the plugin ever writes on a pod.
func podRecordPatch(t *testing.T, admin kubernetes.Interface, name string) string {
	t.Helper()
	p, err := admin.CoreV1().Pods("default").Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ann, _, err := allocate.Record(p, "c", gpushare.ContainerEnv{GPUIndex: 0, PodUnits: 4, ContainerUnits: 4, DevUnits: 80})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{gpushare.AnnotationContainerEnv, gpushare.AnnotationAssigned, gpushare.AnnotationGPUIndex, gpushare.AnnotationPodUnits, gpushare.AnnotationDevUnits} {
		if _, ok := ann[k]; !ok {
			t.Fatalf("the plugin's record %v lacks %s", ann, k)
		}
	}
	body, _ := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": p.ResourceVersion, "annotations": ann}})
	return string(body)
}

// refusedWrites are writes of plugin A (node-a) outside its scope, through the verbs its RBAC has.
func refusedWrites() []policyRefusal {
	merge, strategic := types.MergePatchType, types.StrategicMergePatchType
	other := annotationPatch(map[string]any{"example.com/other": "x"})
	record := annotationPatch(map[string]any{gpushare.AnnotationContainerEnv: "{}"})
	labelWithAnnotation, _ := json.Marshal(map[string]any{"metadata": map[string]any{
		"labels": map[string]string{"example.com/l": "x"}, "annotations": map[string]string{gpushare.AnnotationNodeGPUs: "refused"}}})
	return []policyRefusal{
		{"another node's annotation", patchNode("node-b", merge, annotationPatch(map[string]any{gpushare.AnnotationNodeGPUs: "x"})),
			"the device plugin of node node-a may write only its own node, not node node-b"},
		{"another node's GPU count", patchNode("node-b", strategic, gpuCountPatch("9"), "status"),
			"may write only its own node, not node node-b"},
		{"the record on a pod bound to another node", patchPod("on-b", merge, record),
			"may write only pods bound to it, not pod default/on-b (bound to node-b)"},
		{"the record on an unbound pod", patchPod("unbound", merge, record), "not pod default/unbound (not bound)"},
		{"a label with its annotation", patchNode("node-a", merge, string(labelWithAnnotation)),
			"of node node-a; this request changes metadata.labels"},
		{"a taint on its node", patchNode("node-a", merge, `{"spec":{"taints":[{"key":"example.com/evict","effect":"NoExecute"}]}}`),
			"may not change the spec of node node-a; this request changes spec.taints"},
		{"cordoning its node", patchNode("node-a", merge, `{"spec":{"unschedulable":true}}`), "this request changes spec.unschedulable"},
		{"another annotation on its node", patchNode("node-a", merge, other), "this request changes metadata.annotations[example.com/other]"},
		{"removing another annotation of its node", patchNode("node-a", merge, annotationPatch(map[string]any{"example.com/keep": nil})),
			"this request changes metadata.annotations[example.com/keep]"},
		{"a condition of its node", patchNode("node-a", strategic, `{"status":{"conditions":[{"type":"Ready","status":"False","reason":"Refused"}]}}`, "status"),
			"this request changes status.conditions"},
		{"its node's gpu-mem capacity", patchNode("node-a", strategic, `{"status":{"capacity":{"aliyun.com/gpu-mem":"1000"}}}`, "status"),
			"this request changes status.capacity[aliyun.com/gpu-mem]"},
		{"the image of a pod on its node", patchPod("on-a", strategic, `{"spec":{"containers":[{"name":"c","image":"example.com/evil:1"}]}}`),
			"may not change the spec of pod default/on-a; this request changes spec.containers"},
		{"a label of a pod on its node", patchPod("on-a", merge, `{"metadata":{"labels":{"app":"x"}}}`), "this request changes metadata.labels"},
		{"another annotation of a pod on its node", patchPod("on-a", merge, other), "this request changes metadata.annotations[example.com/other]"},
		{"a finalizer on a pod on its node", patchPod("on-a", merge, `{"metadata":{"finalizers":["example.com/hold"]}}`), "this request changes metadata.finalizers"},
	}
}

// checkRefused makes each write as the client, which the policy must refuse with its rule's
// message, then as the admin in a dry run, which must pass.
func checkRefused(t *testing.T, admin, as kubernetes.Interface, refusals []policyRefusal) {
	t.Helper()
	for _, r := range refusals {
		if err := r.do(t.Context(), as, nil); !refusedByPolicy(err) || !strings.Contains(err.Error(), r.want) {
			t.Errorf("%s: %v; want refused by policy %s with %q", r.name, err, pluginPolicy, r.want)
		}
		if err := r.do(t.Context(), admin, []string{metav1.DryRunAll}); err != nil {
			t.Errorf("%s as admin (dry run): %v; the write itself must be valid", r.name, err)
		}
	}
}

// checkNoClaim: a token of the plugin's ServiceAccount not bound to a pod, and a client
// certificate with its name, write nothing, not even what the plugin writes on node-a.
func checkNoClaim(t *testing.T, c *cluster.Cluster) {
	expiration := int64(600)
	tr, err := c.Client().CoreV1().ServiceAccounts(pluginNamespace).CreateToken(t.Context(), pluginServiceAccount,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiration}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	path, err := c.TokenKubeconfig("plugin-unbound-token", tr.Status.Token)
	if err != nil {
		t.Fatal(err)
	}
	const want = "gpushare-device-plugin credentials without a node"
	own := []policyRefusal{
		{"its node's annotation", patchNode("node-a", types.MergePatchType, annotationPatch(map[string]any{gpushare.AnnotationNodeGPUs: "x"})), want},
		{"its node's GPU count", patchNode("node-a", types.StrategicMergePatchType, gpuCountPatch("4"), "status"), want},
		{"the record on a pod bound to its node", patchPod("on-a", types.MergePatchType, annotationPatch(map[string]any{gpushare.AnnotationAssigned: "true"})), want},
	}
	for name, client := range map[string]kubernetes.Interface{
		"token not bound to a pod": kubeconfigClient(t, path),
		"client certificate":       identityClient(t, c, "plugin-certificate", saPlugin),
	} {
		if u := whoAmI(t, client); u.Username != saPlugin || len(u.Extra[nodeNameExtra]) != 0 {
			t.Fatalf("%s: user %q, %s %v; want %s without a node", name, u.Username, nodeNameExtra, u.Extra[nodeNameExtra], saPlugin)
		}
		t.Run(name, func(t *testing.T) { checkRefused(t, c.Client(), client, own) })
	}
}

// checkWidened grants the plugin's ServiceAccount more than the shipped RBAC (create and delete,
// pods/status): the policy still refuses every write but the plugin's patches.
func checkWidened(t *testing.T, c *cluster.Cluster, a kubernetes.Interface) {
	widenPluginRBAC(t, c, a)
	checkRefused(t, c.Client(), a, []policyRefusal{
		{"deleting a pod on its node", func(ctx context.Context, c kubernetes.Interface, dryRun []string) error {
			return c.CoreV1().Pods("default").Delete(ctx, "on-a", metav1.DeleteOptions{DryRun: dryRun})
		}, "the device plugin may only patch nodes and pods, not DELETE pods"},
		{"deleting its node", func(ctx context.Context, c kubernetes.Interface, dryRun []string) error {
			return c.CoreV1().Nodes().Delete(ctx, "node-a", metav1.DeleteOptions{DryRun: dryRun})
		}, "not DELETE nodes"},
		{"creating a pod on its node", func(ctx context.Context, c kubernetes.Interface, dryRun []string) error {
			p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "made-by-plugin"}, Spec: corev1.PodSpec{
				NodeName: "node-a", Containers: []corev1.Container{{Name: "c", Image: "example.com/evil:1"}}}}
			_, err := c.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{DryRun: dryRun})
			return err
		}, "not CREATE pods"},
		{"the status of a pod on its node", patchPod("on-a", types.StrategicMergePatchType,
			`{"status":{"conditions":[{"type":"example.com/Refused","status":"True"}]}}`, "status"), "may not write pods/status"},
	})
}

// widenPluginRBAC binds the plugin's ServiceAccount a ClusterRole to create and delete pods and
// nodes and patch pods/status, and waits until the authorizer lets plugin client a use it.
func widenPluginRBAC(t *testing.T, c *cluster.Cluster, a kubernetes.Interface) {
	t.Helper()
	ctx := t.Context()
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-widened-device-plugin"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods", "nodes"}, Verbs: []string{"create", "delete"}},
			{APIGroups: []string{""}, Resources: []string{"pods/status"}, Verbs: []string{"patch"}},
		},
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: pluginServiceAccount, Namespace: pluginNamespace}},
	}
	if _, err := c.Client().RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client().RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// RBAC changes reach the authorizer through its informer.
	pollUntil(t, waitLong, "RBAC lets the plugin delete pods", func() bool {
		r, err := a.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "delete", Resource: "pods", Namespace: "default"},
		}}, metav1.CreateOptions{})
		return err == nil && r.Status.Allowed
	})
}
