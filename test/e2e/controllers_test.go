//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/test/cluster"
)

// TestControllers runs the bed's kube-controller-manager with our system as a user meets it:
// a Deployment of gpu-mem pods reaches its replicas through the ReplicaSet controller, the
// real kube-scheduler with our extender and our device plugin (every container's checkpoint env is
// the GPU its annotations name, and the extender, the inspector and the checkpoints agree); a Job's
// gpu-mem pod is placed by the extender, runs to completion and the Job completes; deleting the
// Deployment lets the garbage collector delete its ReplicaSet and their pods, after which the
// extender has freed every unit; and the ResourceClaim controller makes a pod's claim from its
// template.
func TestControllers(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := startSystem(t)
	b.addNode(t, "ctl-a100", "simulated:dgxa100")

	// 1. A Deployment: 6 replicas of 10 units.
	const replicas = 6
	sel := map[string]string{"app": "ctl-share"}
	deploy := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "ctl-share", Namespace: "default"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptrTo(int32(replicas)),
			Selector: &metav1.LabelSelector{MatchLabels: sel},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: sel},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name: "main", Image: "registry.k8s.io/pause:3.10", Resources: units(10),
				}}},
			},
		},
	}
	if _, err := b.client.AppsV1().Deployments("default").Create(ctx, deploy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var d *appsv1.Deployment
	if err := cluster.Poll(ctx, systemWait, "Deployment ctl-share available with 6 replicas", func(ctx context.Context) (bool, error) {
		var err error
		d, err = b.client.AppsV1().Deployments("default").Get(ctx, "ctl-share", metav1.GetOptions{})
		return err == nil && d.Status.ObservedGeneration == d.Generation && d.Status.UpdatedReplicas == replicas &&
			d.Status.AvailableReplicas == replicas && d.Status.Replicas == replicas, err
	}); err != nil {
		t.Fatalf("%v (status %+v)", err, d.Status)
	}
	selector := labels.SelectorFromSet(sel).String()
	list, err := b.client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]*corev1.Pod{}
	for i := range list.Items {
		p := &list.Items[i]
		if !ownedBy(p.OwnerReferences, "ReplicaSet") {
			t.Errorf("pod %s has owners %v; want its ReplicaSet", p.Name, p.OwnerReferences)
		}
		names[p.Name] = p
	}
	if len(names) != replicas {
		t.Fatalf("%d pods match %s, want %d", len(names), selector, replicas)
	}
	items := b.waitAllRunning(t, names, systemWait)
	v := b.verifySystem(t, items)
	b.compareViews(t, v)
	if t.Failed() {
		return
	}
	t.Logf("Deployment ctl-share: %d replicas Running, placed by the extender, allocated by the plugin", replicas)

	// 2. A Job: its pod asks for 4 units; the fake runtime ends containers of an exit-0 image.
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "ctl-job", Namespace: "default"},
		Spec: batchv1.JobSpec{
			BackoffLimit: ptrTo(int32(0)),
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{
					Name: "main", Image: "registry.k8s.io/e2e-test-images/exit-0:1.0", Resources: units(4),
				}},
			}},
		},
	}
	if _, err := b.client.BatchV1().Jobs("default").Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var j *batchv1.Job
	if err := cluster.Poll(ctx, systemWait, "Job ctl-job complete", func(ctx context.Context) (bool, error) {
		var err error
		j, err = b.client.BatchV1().Jobs("default").Get(ctx, "ctl-job", metav1.GetOptions{})
		return err == nil && (jobCondition(j, batchv1.JobComplete) || jobCondition(j, batchv1.JobFailed)), err
	}); err != nil {
		t.Fatal(err)
	}
	if !jobCondition(j, batchv1.JobComplete) || j.Status.Succeeded != 1 || j.Status.Failed != 0 {
		t.Fatalf("Job ctl-job: succeeded %d, failed %d, conditions %+v; want complete with one success", j.Status.Succeeded, j.Status.Failed, j.Status.Conditions)
	}
	jobPods, err := b.client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=ctl-job"})
	if err != nil {
		t.Fatal(err)
	}
	if len(jobPods.Items) != 1 {
		t.Fatalf("Job ctl-job has %d pods, want 1", len(jobPods.Items))
	}
	jp := &jobPods.Items[0]
	if asg, placed, err := gpushare.DecodePodAssignment(jp.Annotations); err != nil || !placed || jp.Spec.NodeName != "ctl-a100" {
		t.Errorf("Job pod %s: node %q, placed by the extender %v (%v); want placed on ctl-a100", jp.Name, jp.Spec.NodeName, placed, err)
	} else if asg.PodUnits != 4 {
		t.Errorf("Job pod %s: %d units assigned, want 4", jp.Name, asg.PodUnits)
	}
	if jp.Status.Phase != corev1.PodSucceeded {
		t.Errorf("Job pod %s is %s, want Succeeded", jp.Name, jp.Status.Phase)
	}

	// 3. Garbage collection: deleting the Deployment deletes its ReplicaSet, and that its pods.
	background := metav1.DeletePropagationBackground
	if err := b.client.AppsV1().Deployments("default").Delete(ctx, "ctl-share", metav1.DeleteOptions{PropagationPolicy: &background}); err != nil {
		t.Fatal(err)
	}
	if err := cluster.Poll(ctx, systemWait, "the garbage collector deletes ctl-share's ReplicaSet and pods", func(ctx context.Context) (bool, error) {
		rs, err := b.client.AppsV1().ReplicaSets("default").List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return false, err
		}
		pods, err := b.client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return false, err
		}
		return len(rs.Items) == 0 && len(pods.Items) == 0, fmt.Errorf("%d ReplicaSets and %d pods left", len(rs.Items), len(pods.Items))
	}); err != nil {
		t.Fatal(err)
	}
	// Nothing runs any more: the extender has freed every unit (the Job's pod has ended).
	var used uint64
	if err := cluster.Poll(ctx, waitLong, "the extender frees the deleted pods' units", func(context.Context) (bool, error) {
		in, err := b.inspect()
		if err != nil {
			return false, err
		}
		used = 0
		for _, n := range in.Nodes {
			used += n.UsedGPU
		}
		return used == 0, nil
	}); err != nil {
		t.Fatalf("%v: %d units still used", err, used)
	}

	// 4. The ResourceClaim controller makes a pod's claim from its template (no DRA driver
	//    publishes devices here, so the pod itself stays unscheduled).
	rct := &resourcev1.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "ctl-claim", Namespace: "default"},
		Spec: resourcev1.ResourceClaimTemplateSpec{Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
			Requests: []resourcev1.DeviceRequest{{Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpu.example.com"}}},
		}}},
	}
	if _, err := b.client.ResourceV1().ResourceClaimTemplates("default").Create(ctx, rct, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	claimPod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "ctl-claimer", Namespace: "default"},
		Spec: corev1.PodSpec{
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptrTo("ctl-claim")}},
			Containers: []corev1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10",
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}},
		},
	}
	if _, err := b.client.CoreV1().Pods("default").Create(ctx, claimPod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p, err := b.c.WaitForPod(ctx, "default", "ctl-claimer", waitLong, "its claim made from the template", func(p *corev1.Pod) bool {
		return len(p.Status.ResourceClaimStatuses) == 1 && p.Status.ResourceClaimStatuses[0].ResourceClaimName != nil
	})
	if err != nil {
		t.Fatal(err)
	}
	claimName := *p.Status.ResourceClaimStatuses[0].ResourceClaimName
	claim, err := b.client.ResourceV1().ResourceClaims("default").Get(ctx, claimName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("claim %s of pod ctl-claimer: %v", claimName, err)
	}
	if !ownedBy(claim.OwnerReferences, "Pod") || !strings.HasPrefix(claimName, "ctl-claimer-gpu-") {
		t.Errorf("claim %s: owners %v; want named after pod ctl-claimer and owned by it", claimName, claim.OwnerReferences)
	}
}

func ownedBy(refs []metav1.OwnerReference, kind string) bool {
	for _, r := range refs {
		if r.Kind == kind && r.Controller != nil && *r.Controller {
			return true
		}
	}
	return false
}

func jobCondition(j *batchv1.Job, typ batchv1.JobConditionType) bool {
	for _, c := range j.Status.Conditions {
		if c.Type == typ && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

func ptrTo[T any](v T) *T { return &v }
