//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/test/cluster"
)

// TestMalformedPods sends issue 8's malformed pods through the whole system (real API server,
// kube-scheduler with our extender, a hollow kubelet with our plugin on 8 simulated H100s) and
// checks each gets a clear reason where Kubernetes lets us give one, and that none of them
// disturbs the accounting of a well-formed pod running beside them.
func TestMalformedPods(t *testing.T) {
	t.Parallel()
	b := startSystem(t)
	b.addNode(t, "h100", "simulated:dgxh100")
	ctx := t.Context()
	pods := b.client.CoreV1().Pods("default")
	qty := func(s string) resource.Quantity { return resource.MustParse(s) }
	pod := func(name string, res corev1.ResourceRequirements) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}, Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10", Resources: res}},
		}}
	}

	// A well-formed pod that must keep its GPU and its accounting whatever happens around it.
	good := map[string]*corev1.Pod{}
	for name, p := range createAll(t, b.client, []*corev1.Pod{pod("good", units(10))}) {
		good[name] = p
	}

	// 1. The API server refuses these before anyone schedules them: extended resources must be
	//    whole, non-negative, and set in limits (requests, if any, equal to them).
	for _, tc := range []struct {
		name string
		res  corev1.ResourceRequirements
		want string
	}{
		{"negative", corev1.ResourceRequirements{Limits: corev1.ResourceList{gpushare.ResourceName: qty("-1")}}, "limits[aliyun.com/gpu-mem]: Invalid value: \"-1\": must be greater than or equal to 0"},
		{"fraction", corev1.ResourceRequirements{Limits: corev1.ResourceList{gpushare.ResourceName: qty("1.5")}}, "limits[aliyun.com/gpu-mem]: Invalid value: \"1500m\": must be an integer"},
		{"milli", corev1.ResourceRequirements{Limits: corev1.ResourceList{gpushare.ResourceName: qty("500m")}}, "limits[aliyun.com/gpu-mem]: Invalid value: \"500m\": must be an integer"},
		{"requests-only", corev1.ResourceRequirements{Requests: corev1.ResourceList{gpushare.ResourceName: qty("4")}}, "Limit must be set for non overcommitable resources"},
		{"requests-differ", corev1.ResourceRequirements{
			Requests: corev1.ResourceList{gpushare.ResourceName: qty("2")}, Limits: corev1.ResourceList{gpushare.ResourceName: qty("4")},
		}, "must be equal to aliyun.com/gpu-mem limit of 4"},
	} {
		_, err := pods.Create(ctx, pod("bad-"+tc.name, tc.res), metav1.CreateOptions{})
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: create = %v; want Invalid saying %q", tc.name, err, tc.want)
		} else {
			t.Logf("%s: refused by the API server: %v", tc.name, err)
		}
	}

	// 2. Accepted by the API server, but no GPU can take them: pending with the scheduler's reason.
	//    The last three ask for isolation the node (tier none) cannot give, or ask it wrongly.
	for _, tc := range []struct {
		name, units, want string
		annotations       map[string]string
	}{
		{"absurd", "1000000", "Insufficient " + string(gpushare.ResourceName), nil},
		{"beyond-limit", "1e15", "Insufficient " + string(gpushare.ResourceName), nil},
		{"too-big-for-one-gpu", "100", "more than the largest healthy GPU", nil},
		{"tier-not-offered", "4", `no GPU offers isolation "mps"`, map[string]string{gpushare.AnnotationIsolation: "mps"}},
		{"unknown-tier", "4", "invalid gpushare isolation", map[string]string{gpushare.AnnotationIsolation: "exclusive"}},
		{"zero-share", "4", "invalid gpushare isolation", map[string]string{gpushare.AnnotationComputePercent: "0"}},
	} {
		p := pod("big-"+tc.name, corev1.ResourceRequirements{Limits: corev1.ResourceList{gpushare.ResourceName: qty(tc.units)}})
		p.Annotations = tc.annotations
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got, err := b.c.WaitForPod(ctx, "default", p.Name, waitLong, "judged unschedulable", func(p *corev1.Pod) bool { return unschedulable(p) != "" })
		if err != nil {
			t.Fatal(err)
		}
		if msg := unschedulable(got); !strings.Contains(msg, tc.want) {
			t.Errorf("%s: unschedulable %q; want it to say %q", tc.name, msg, tc.want)
		} else {
			t.Logf("%s: pending: %s", tc.name, msg)
		}
		if !hasEvent(ctx, t, b, p.Name, "FailedScheduling", tc.want) {
			t.Errorf("%s: no FailedScheduling event saying %q", tc.name, tc.want)
		}
	}

	// 3. gpu-mem 0 asks for no GPU memory: it schedules and runs, charged nothing.
	zero := pod("zero", corev1.ResourceRequirements{Limits: corev1.ResourceList{gpushare.ResourceName: qty("0")}})
	if _, err := pods.Create(ctx, zero, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.c.WaitForPod(ctx, "default", "zero", waitLong, "running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning }); err != nil {
		t.Errorf("a pod asking for 0 units of gpu-mem: %v", err)
	}

	// 4. Assignment annotations written by hand (or copied from a running pod) on a pending pod:
	//    the extender's bind replaces every one of them, so the pod runs where its annotations say.
	copied := pod("copied", units(6))
	copied.Annotations = map[string]string{
		gpushare.AnnotationGPUIndex: "7", gpushare.AnnotationAllocation: `{"0":{"5":6}}`, gpushare.AnnotationAssigned: "true",
		gpushare.AnnotationPodUnits: "99", gpushare.AnnotationContainerEnv: `{"main":{"gpu":5,"pod":6,"container":6,"dev":79}}`,
	}
	for name, p := range createAll(t, b.client, []*corev1.Pod{copied}) {
		good[name] = p
	}

	// 5. Bound by hand to the node with annotations naming a GPU it does not have: the kubelet
	//    refuses it with our plugin's reason; nothing is charged for it.
	ghost := pod("ghost", units(4))
	ghost.Spec.NodeName = "h100"
	ghost.Annotations = map[string]string{gpushare.AnnotationGPUIndex: "9", gpushare.AnnotationPodUnits: "4", gpushare.AnnotationAssigned: "false"}
	if _, err := pods.Create(ctx, ghost, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	failed, err := b.c.WaitForPod(ctx, "default", "ghost", waitLong, "refused by the kubelet", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
	if err != nil {
		t.Fatal(err)
	}
	if failed.Status.Reason != "UnexpectedAdmissionError" || !strings.Contains(failed.Status.Message, "this node has no GPU 9") {
		t.Errorf("ghost: %s: %s; want the plugin's reason naming GPU 9", failed.Status.Reason, failed.Status.Message)
	} else {
		t.Logf("ghost: %s: %s", failed.Status.Reason, failed.Status.Message)
	}

	// The well-formed pods run with exactly their annotations' GPU, and every view agrees.
	items := b.waitAllRunning(t, good, systemWait)
	v := b.verifySystem(t, items)
	var diff string
	if err := cluster.Poll(ctx, waitLong, "the extender agrees with the checkpoint", func(context.Context) (bool, error) {
		diff = b.extenderDiff(v.byCheckpoint)
		return diff == "", nil
	}); err != nil {
		t.Errorf("after the malformed pods: %s", diff)
	}
	got, err := pods.Get(ctx, "copied", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Annotations[gpushare.AnnotationGPUIndex] == "7" || got.Annotations[gpushare.AnnotationPodUnits] != "6" {
		t.Errorf("copied pod kept hand-written annotations: %v", got.Annotations)
	}
}

// hasEvent tells whether the pod has an event of reason whose message contains substr.
func hasEvent(ctx context.Context, t *testing.T, b *systemBed, pod, reason, substr string) bool {
	t.Helper()
	found := false
	_ = cluster.Poll(ctx, 10*time.Second, fmt.Sprintf("event %s on %s", reason, pod), func(ctx context.Context) (bool, error) {
		l, err := b.client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
		if err != nil {
			return false, err
		}
		for _, e := range l.Items {
			if e.Reason == reason && strings.Contains(e.Message, substr) {
				found = true
			}
		}
		return found, nil
	})
	return found
}
