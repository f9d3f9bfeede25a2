package main

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

func TestUnrecorded(t *testing.T) {
	const both = `{"a":{"gpu":0,"pod":3,"container":2,"dev":80},"b":{"gpu":0,"pod":3,"container":1,"dev":80}}`
	pod := func(name string, phase corev1.PodPhase, annotations map[string]string, units ...int64) corev1.Pod {
		p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Annotations: annotations}, Status: corev1.PodStatus{Phase: phase}}
		for i, u := range units {
			c := corev1.Container{Name: string(rune('a' + i))}
			if u > 0 {
				c.Resources.Limits = corev1.ResourceList{gpushare.ResourceName: *resource.NewQuantity(u, resource.DecimalSI)}
			}
			p.Spec.Containers = append(p.Spec.Containers, c)
		}
		return p
	}
	assigned := func(env string) map[string]string {
		return map[string]string{gpushare.AnnotationAssigned: "true", gpushare.AnnotationContainerEnv: env}
	}
	pods := []corev1.Pod{
		pod("done", corev1.PodRunning, assigned(both), 2, 1),
		pod("no-gpu", corev1.PodRunning, nil, 0),
		pod("pending", corev1.PodPending, nil, 2),
		pod("not-assigned", corev1.PodRunning, map[string]string{gpushare.AnnotationAssigned: "false"}, 2, 1),
		pod("one-container-missing", corev1.PodRunning, assigned(`{"a":{"gpu":0,"pod":3,"container":2,"dev":80}}`), 2, 1),
		pod("bad-record", corev1.PodRunning, assigned(`not json`), 2, 1),
		pod("gpu-free-sidecar", corev1.PodRunning, assigned(`{"a":{"gpu":0,"pod":2,"container":2,"dev":80}}`), 2, 0),
	}
	translated := func(name string, annotations map[string]string) corev1.Pod {
		p := pod(name, corev1.PodRunning, annotations, 0, 0)
		for i := range p.Spec.Containers {
			p.Spec.Containers[i].Resources.Claims = []corev1.ResourceClaim{{Name: gpushare.DRAPodClaimName, Request: "gpu-" + string(rune('0'+i))}}
		}
		return p
	}
	pods = append(pods, translated("dra-done", assigned(both)), translated("dra-waiting", nil),
		translated("dra-one-missing", assigned(`{"b":{"gpu":0,"pod":3,"container":1,"dev":80}}`)))
	got := unrecorded(pods)
	want := []string{"ns/bad-record", "ns/dra-one-missing", "ns/dra-waiting", "ns/not-assigned", "ns/one-container-missing"}
	if !slices.Equal(got, want) {
		t.Fatalf("unrecorded = %v, want %v", got, want)
	}
}

// TestWaitRecorded: a fully recorded cluster passes at once; an unrecorded Running pod fails the
// wait at its deadline, naming the pod.
func TestWaitRecorded(t *testing.T) {
	running := func(name string, annotations map[string]string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Annotations: annotations},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "w", Resources: corev1.ResourceRequirements{
				Limits: corev1.ResourceList{gpushare.ResourceName: *resource.NewQuantity(2, resource.DecimalSI)}}}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning},
		}
	}
	done := running("done", map[string]string{gpushare.AnnotationAssigned: "true",
		gpushare.AnnotationContainerEnv: `{"w":{"gpu":0,"pod":2,"container":2,"dev":80}}`})
	ctx := context.Background()
	if err := waitRecorded(ctx, fake.NewClientset(done), time.Second); err != nil {
		t.Fatalf("recorded cluster: %v", err)
	}
	err := waitRecorded(ctx, fake.NewClientset(done, running("late", nil)), 300*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "default/late") {
		t.Fatalf("unrecorded pod: got %v, want an error naming default/late", err)
	}
}
