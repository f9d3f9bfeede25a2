package manager

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpushare/gpushare/plugin/allocate"
	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/podsource"
)

// scriptedPods answers PatchPod with the scripted errors in turn, then nil,
// running compute on its pod as the real one does.
type scriptedPods struct {
	pod *corev1.Pod

	mu      sync.Mutex
	errs    []error
	calls   int
	written map[string]string
}

func (s *scriptedPods) PatchPod(_ context.Context, _, _ string, _ types.UID, compute func(*corev1.Pod) (map[string]string, error)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	ann, err := compute(s.pod)
	if err != nil {
		return err
	}
	if len(s.errs) > 0 {
		err, s.errs = s.errs[0], s.errs[1:]
		return err
	}
	s.written = ann
	return nil
}

func (s *scriptedPods) result() (int, map[string]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls, s.written
}

func recordDecision(annotations map[string]string) allocate.Decision {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default", UID: "uid-p", Annotations: annotations},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{gpushare.ResourceName: *resource.NewQuantity(4, resource.DecimalSI)},
		}}}},
	}
	return allocate.Decision{Pod: pod, Container: gpushare.ContainerRequest{Name: "main", Units: 4},
		Env: gpushare.ContainerEnv{GPUIndex: 1, PodUnits: 4, ContainerUnits: 4, DevUnits: 80}}
}

func TestRecorderRetries(t *testing.T) {
	unavailable := apierrors.NewServiceUnavailable("apiserver restarting")
	replaced := podsource.ErrPodReplaced
	invalid := apierrors.NewInvalid(schema.GroupKind{Kind: "Pod"}, "p", nil)
	fast := wait.Backoff{Duration: time.Millisecond, Factor: 2, Steps: 4}
	for _, tc := range []struct {
		name        string
		annotations map[string]string
		errs        []error
		wantCalls   int
		wantWritten bool
	}{
		{name: "first write lands", wantCalls: 1, wantWritten: true},
		{name: "fails twice then lands", errs: []error{unavailable, unavailable}, wantCalls: 3, wantWritten: true},
		{name: "bounded: gives up after the steps", errs: []error{unavailable, unavailable, unavailable, unavailable, unavailable, unavailable}, wantCalls: 1 + fast.Steps},
		{name: "pod replaced while retrying", errs: []error{unavailable, replaced}, wantCalls: 2},
		{name: "pod replaced at once", errs: []error{replaced}, wantCalls: 1},
		{name: "invalid patch is not retried", errs: []error{invalid}, wantCalls: 1},
		{name: "malformed record is not retried", annotations: map[string]string{gpushare.AnnotationContainerEnv: "{"}, wantCalls: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := recordDecision(tc.annotations)
			pods := &scriptedPods{pod: d.Pod, errs: tc.errs}
			r := newRecorder(t.Context(), pods, fast, zaptest.NewLogger(t))
			retrying, err := r.record(t.Context(), d)
			if (err == nil) != (len(tc.errs) == 0 && tc.annotations == nil) {
				t.Errorf("first write = %v", err)
			}
			if want := tc.wantCalls > 1; retrying != want {
				t.Errorf("retrying = %v; want %v", retrying, want)
			}
			// Every retry ends by itself here: it lands, meets a permanent
			// error or runs out of steps.
			r.wait()
			calls, written := pods.result()
			if calls != tc.wantCalls {
				t.Errorf("writes = %d; want %d", calls, tc.wantCalls)
			}
			if got := written[gpushare.AnnotationAssigned] == "true"; got != tc.wantWritten {
				t.Errorf("record written = %v (%v); want %v", got, written, tc.wantWritten)
			}
		})
	}
}

// A retry waiting for its next try stops when the manager stops.
func TestRecorderStopsWithItsLife(t *testing.T) {
	d := recordDecision(nil)
	pods := &scriptedPods{pod: d.Pod, errs: []error{apierrors.NewServiceUnavailable("down")}}
	life, cancel := context.WithCancel(t.Context())
	r := newRecorder(life, pods, wait.Backoff{Duration: time.Hour, Steps: 3}, zaptest.NewLogger(t))
	if retrying, err := r.record(t.Context(), d); err == nil || !retrying {
		t.Fatalf("first write = %v, retrying %v; want a failure and a retry", err, retrying)
	}
	cancel()
	r.wait() // returns only because the hour-long wait ended with life
	if calls, _ := pods.result(); calls != 1 {
		t.Errorf("writes = %d; want 1", calls)
	}
	// After wait, a failed write starts nothing.
	pods.mu.Lock()
	pods.errs = []error{apierrors.NewServiceUnavailable("down")}
	pods.mu.Unlock()
	if retrying, err := r.record(t.Context(), d); err == nil || retrying {
		t.Fatalf("second write = %v, retrying %v; want a failure and no retry", err, retrying)
	}
	r.wait()
	if calls, _ := pods.result(); calls != 2 {
		t.Errorf("writes = %d; want 2", calls)
	}
}
