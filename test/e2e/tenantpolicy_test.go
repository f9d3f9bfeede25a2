//go:build e2e

package e2e

import (
	"context"
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/test/cluster"
)

// The shipped tenant policies (manifests/base/tenant-admission.yaml).
const (
	tenantEnvPolicy   = "gpushare-tenant-env"
	boundRecordPolicy = "gpushare-bound-record"
)

// TestTenantPolicies checks manifests/base/tenant-admission.yaml on the real API server: a pod
// asking for gpu-mem cannot set, in env, a variable the device plugin sets (its own value would win
// over the plugin's and lift its limit), nor take envFrom when it requires an enforcing tier, unless
// its namespace opts in; and nobody but the device plugin can change a bound pod's GPU record. Every
// refusal names the variable or the annotation and the reason; ordinary pods and edits pass.
func TestTenantPolicies(t *testing.T) {
	t.Parallel()
	c := cluster.StartT(t, cluster.Config{NoScheduler: true})
	applied := applyShipped(t, c, func(o *unstructured.Unstructured) bool {
		return o.GetName() == tenantEnvPolicy || o.GetName() == boundRecordPolicy
	})
	if applied != 4 {
		t.Fatalf("applied %d objects of the tenant policies, want 4 (two policies, two bindings)", applied)
	}
	client := c.Client()
	ctx := t.Context()
	for _, ns := range []*corev1.Namespace{
		{ObjectMeta: metav1.ObjectMeta{Name: "tenant"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "vouched", Labels: map[string]string{gpushare.LabelAllowEnvFrom: "true"}}},
	} {
		if _, err := client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	create := func(ctx context.Context, p *corev1.Pod) error {
		_, err := client.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	overriding := tenantPod("probe", "tenant", "", corev1.EnvVar{Name: gpushare.EnvHAMiMemoryLimit, Value: "200g"})
	if err := cluster.Poll(ctx, waitLong, "the tenant policies in force", func(ctx context.Context) (bool, error) {
		err := create(ctx, overriding)
		if err == nil {
			err = errors.New("a pod setting " + gpushare.EnvHAMiMemoryLimit + " was admitted")
		}
		return refusedBy(err, tenantEnvPolicy), err
	}); err != nil {
		t.Fatal(err)
	}

	t.Run("env", func(t *testing.T) {
		for _, name := range []string{
			gpushare.EnvHAMiMemoryLimit, gpushare.EnvHAMiMemoryLimit + "_0", gpushare.EnvHAMiSharedCache, gpushare.EnvHAMiSMLimit,
			gpushare.EnvMPSPinnedDeviceMemLimit, gpushare.EnvMPSPipeDirectory, gpushare.EnvMPSActiveThreadPercentage, "CUDA_MPS_LOG_DIRECTORY",
			gpushare.EnvVisibleDevices, gpushare.EnvGPUIndex, gpushare.EnvContainerUnits, gpushare.EnvIsolation, gpushare.EnvDisableIsolation,
			gpushare.EnvHAMiDisableControl, gpushare.EnvHAMiCorePolicy,
		} {
			p := tenantPod("sets", "tenant", "", corev1.EnvVar{Name: name, Value: "x"})
			wantRefused(t, create(ctx, p), tenantEnvPolicy, "sets "+name+" in env")
			init := tenantPod("init-sets", "tenant", "")
			init.Spec.InitContainers = []corev1.Container{{Name: "setup", Image: "busybox", Env: []corev1.EnvVar{{Name: name, Value: "x"}}}}
			wantRefused(t, create(ctx, init), tenantEnvPolicy, "container setup of a pod asking for aliyun.com/gpu-mem sets "+name)
		}
		// On mps the plugin narrows a client to its GPUs by UUID; elsewhere the variable is the pod's.
		wantRefused(t, create(ctx, tenantPod("visible", "tenant", "mps", corev1.EnvVar{Name: gpushare.EnvCUDAVisibleDevices, Value: "0"})), tenantEnvPolicy, "sets CUDA_VISIBLE_DEVICES")
		wantAdmitted(t, create(ctx, tenantPod("visible", "tenant", "hami-core", corev1.EnvVar{Name: gpushare.EnvCUDAVisibleDevices, Value: "0"})), "CUDA_VISIBLE_DEVICES without mps")
		// LD_PRELOAD lifts a limit only where one is enforced.
		wantRefused(t, create(ctx, tenantPod("preload", "tenant", "hami-core", corev1.EnvVar{Name: "LD_PRELOAD", Value: "/x.so"})), tenantEnvPolicy, "sets LD_PRELOAD")
		wantAdmitted(t, create(ctx, tenantPod("preload", "tenant", "", corev1.EnvVar{Name: "LD_PRELOAD", Value: "/usr/lib/libjemalloc.so"})), "LD_PRELOAD without an enforcing tier")
		// Pods without gpu-mem, and ordinary variables, are no business of the policy.
		plain := tenantPod("plain", "tenant", "", corev1.EnvVar{Name: gpushare.EnvHAMiMemoryLimit, Value: "200g"})
		plain.Spec.Containers[0].Resources = corev1.ResourceRequirements{}
		wantAdmitted(t, create(ctx, plain), "a pod without gpu-mem")
		wantAdmitted(t, create(ctx, tenantPod("ordinary", "tenant", "mps", corev1.EnvVar{Name: "MODEL", Value: "llama"})), "an ordinary variable")
	})
	t.Run("envFrom", func(t *testing.T) {
		from := func(ns, tier string) *corev1.Pod {
			p := tenantPod("from", ns, tier)
			p.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}}}}
			return p
		}
		wantRefused(t, create(ctx, from("tenant", "mps")), tenantEnvPolicy, "requires gpushare.io/isolation mps and takes envFrom")
		wantRefused(t, create(ctx, from("tenant", "hami-core")), tenantEnvPolicy, "label the namespace gpushare.io/allow-env-from=true")
		wantAdmitted(t, create(ctx, from("vouched", "mps")), "envFrom in a namespace that opted in")
		wantAdmitted(t, create(ctx, from("tenant", "")), "envFrom without an enforcing tier")
	})
	t.Run("ephemeral container", func(t *testing.T) {
		p, err := client.CoreV1().Pods("tenant").Create(ctx, tenantPod("debugged", "tenant", ""), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{
			Name: "debug", Image: "busybox", Env: []corev1.EnvVar{{Name: gpushare.EnvVisibleDevices, Value: "all"}}}}}
		_, err = client.CoreV1().Pods("tenant").UpdateEphemeralContainers(ctx, p.Name, p, metav1.UpdateOptions{})
		wantRefused(t, err, tenantEnvPolicy, "container debug of a pod asking for aliyun.com/gpu-mem sets NVIDIA_VISIBLE_DEVICES")
	})
	t.Run("bound record", func(t *testing.T) { checkBoundRecord(t, c) })
}

// checkBoundRecord: once bound, the annotations the race-free rule reads cannot change; other
// edits of a bound pod, and any edit of a pending one, pass.
func checkBoundRecord(t *testing.T, c *cluster.Cluster) {
	ctx := t.Context()
	pods := c.Client().CoreV1().Pods("tenant")
	pending := tenantPod("pending", "tenant", "mps")
	pending.Annotations[gpushare.AnnotationComputePercent] = "30"
	if _, err := pods.Create(ctx, pending, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	patch := func(name, body string) error {
		_, err := pods.Patch(ctx, name, types.MergePatchType, []byte(body), metav1.PatchOptions{})
		return err
	}
	wantAdmitted(t, patch("pending", `{"metadata":{"annotations":{"gpushare.io/compute-percent":"60"}}}`), "editing a pending pod's compute share")
	assignment, err := gpushare.PodAssignment{GPUIndex: 0, PodUnits: 4, DevUnits: 80, AssumeTime: 1}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	assignment[gpushare.AnnotationBoundBy] = gpushare.BinderExtender
	if err := pods.Bind(ctx, &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: "pending", Annotations: assignment},
		Target: corev1.ObjectReference{Kind: "Node", Name: "gpu-node"}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("the Binding, which carries the record, must pass: %v", err)
	}
	// Policies reach admission through informers, each on its own: the wait above was for the env
	// policy, so wait for this one too (it once admitted three edits 0.04 s after the bind).
	if err := cluster.Poll(ctx, waitLong, "the bound-record policy in force", func(ctx context.Context) (bool, error) {
		_, err := pods.Patch(ctx, "pending", types.MergePatchType, []byte(`{"metadata":{"annotations":{"gpushare.io/compute-percent":"100"}}}`),
			metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
		if err == nil {
			err = errors.New("an edit of the bound pod's compute share was admitted")
		}
		return refusedBy(err, boundRecordPolicy), err
	}); err != nil {
		t.Fatal(err)
	}
	for key, body := range map[string]string{
		gpushare.AnnotationComputePercent: `{"metadata":{"annotations":{"gpushare.io/compute-percent":"100"}}}`,
		gpushare.AnnotationAssumeTime:     `{"metadata":{"annotations":{"ALIYUN_COM_GPU_MEM_ASSUME_TIME":"0"}}}`,
		gpushare.AnnotationIsolation:      `{"metadata":{"annotations":{"gpushare.io/isolation":null}}}`,
		gpushare.AnnotationGPUIndex:       `{"metadata":{"annotations":{"ALIYUN_COM_GPU_MEM_IDX":"3"}}}`,
		gpushare.AnnotationAssigned:       `{"metadata":{"annotations":{"ALIYUN_COM_GPU_MEM_ASSIGNED":"true"}}}`,
	} {
		wantRefused(t, patch("pending", body), boundRecordPolicy, "its annotations "+key+" are its GPU record, fixed at bind")
	}
	wantAdmitted(t, patch("pending", `{"metadata":{"labels":{"team":"a"},"annotations":{"note":"fine"}}}`), "another label and annotation of a bound pod")
	p, err := pods.Get(ctx, "pending", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Annotations[gpushare.AnnotationComputePercent]; got != "60" {
		t.Errorf("compute share %q after the refused edits, want 60", got)
	}
}

// tenantPod is a pod of namespace ns asking for 4 units of gpu-mem in one container with env,
// requiring tier when set.
func tenantPod(name, ns, tier string, env ...corev1.EnvVar) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: map[string]string{}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "main", Image: "cuda", Env: env,
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{gpushare.ResourceName: resource.MustParse("4")}},
		}}},
	}
	if tier != "" {
		p.Annotations[gpushare.AnnotationIsolation] = tier
	}
	return p
}

func refusedBy(err error, policy string) bool {
	return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+policy+"'")
}

func wantRefused(t *testing.T, err error, policy, message string) {
	t.Helper()
	switch {
	case err == nil:
		t.Errorf("admitted; want refused by %s with %q", policy, message)
	case !refusedBy(err, policy) || !strings.Contains(err.Error(), message):
		t.Errorf("%v; want refused by %s with %q", err, policy, message)
	}
}

func wantAdmitted(t *testing.T, err error, what string) {
	t.Helper()
	if err != nil {
		t.Errorf("%s: %v; want admitted", what, err)
	}
}
