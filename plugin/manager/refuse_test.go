package manager_test

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/manager"
)

// A restarted kubelet admits again, one at a time, pods that were being deleted, and calls
// Allocate for them; when no in-flight container has their size, nobody waits for the call. A
// list of the node's pods answered after the call arrived proves it (the kubelet admits only pods
// it got from the API server), so the call is refused then, not after --allocate-wait: the
// kubelet admits serially, and every live pod behind it waited 5 s per such pod (the soak).
func TestAllocateRefusesAtOnceWhenNobodyWaits(t *testing.T) {
	ctx := t.Context()
	_, sock := startPodResources(t)
	e := run(t, "simulated:dgxh100", func(c *manager.Config) {
		c.PodResourcesSocket = sock
		c.AllocateWait = manager.DefaultAllocateWait
		leaving := gpuPod("leaving", 8, 2, 80)
		leaving.DeletionTimestamp = &metav1.Time{Time: time.Now()}
		leaving.Finalizers = []string{"example.com/hold"}
		for _, p := range []*corev1.Pod{leaving, gpuPod("live", 12, 3, 80)} {
			if _, err := c.Client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	})
	e.kubelet.waitRegister(t)
	restartKubelet(t, e).waitRegister(t)
	c := e.plugin(t)

	began := time.Now()
	_, err := c.Allocate(ctx, reqOn(0, 8))
	refused := time.Since(began)
	t.Logf("the call for the pod being deleted was refused after %v", refused)
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Allocate for a pod being deleted = %v; want FailedPrecondition", err)
	}
	if limit := manager.DefaultAllocateWait / 2; refused >= limit {
		t.Errorf("refused after %v; want at once after the first list that answered, well under --allocate-wait (%v)", refused, limit)
	}
	began = time.Now()
	resp, err := c.Allocate(ctx, reqOn(1, 12))
	if err != nil || resp.ContainerResponses[0].Envs[gpushare.EnvGPUIndex] != "3" {
		t.Fatalf("the live pod's call = %v, %v; want GPU 3", resp, err)
	}
	if took := time.Since(began); took >= time.Second {
		t.Errorf("the live pod's call took %v; its pod is in the cache, so want no wait", took)
	}
}

// The quick refusal needs a list that answered: a call whose pod the stalled watch has not
// delivered, and whose first lists lose their answers, is served by the first list that answers.
func TestAllocateServedByTheFirstListThatAnswers(t *testing.T) {
	ctx := t.Context()
	var faults *podListFaults
	_, sock := startPodResources(t)
	e := run(t, "simulated:dgxh100", func(c *manager.Config) {
		c.PodResourcesSocket = sock
		c.AllocateWait = manager.DefaultAllocateWait
		faults = installPodListFaults(c.Client.(*fake.Clientset))
	})
	e.kubelet.waitRegister(t)
	c := e.plugin(t)
	e.podWatches.hold()
	defer e.podWatches.release()
	if _, err := e.client.CoreV1().Pods("default").Create(ctx, gpuPod("late", 12, 2, 80), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	faults.arm(2)
	resp, err := c.Allocate(ctx, reqOn(0, 12))
	if err != nil || resp.ContainerResponses[0].Envs[gpushare.EnvGPUIndex] != "2" {
		t.Fatalf("Allocate = %v, %v; want late's GPU 2 from the first list that answered", resp, err)
	}
	if n := faults.seen.Load(); n != 3 {
		t.Errorf("the call listed the node's pods %d times; want 2 lost answers and one that answered", n)
	}
}

// A list that shows nobody waiting proves nothing while an earlier answer is unsettled (its mark
// may hide the call's container: TestAllocateOutlastsAnAnswerNobodyHolds). The call lists again
// once that answer settles, 3 s after it was given, and is refused then, not at --allocate-wait.
func TestAllocateRefusedOnceEarlierAnswersSettle(t *testing.T) {
	ctx := t.Context()
	_, sock := startPodResources(t)
	e := run(t, "simulated:dgxh100", func(c *manager.Config) {
		c.PodResourcesSocket = sock
		c.AllocateWait = manager.DefaultAllocateWait
	})
	e.kubelet.waitRegister(t)
	c := e.plugin(t)
	if _, err := e.client.CoreV1().Pods("default").Create(ctx, gpuPod("first", 8, 2, 79), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A call the kubelet gives to a pod that left: matched to first, and nobody ever holds it.
	if _, err := c.Allocate(ctx, allocReq(8)); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	_, err := c.Allocate(ctx, reqOn(1, 12))
	refused := time.Since(began)
	t.Logf("the call nobody waits for was refused after %v, behind an answer settling 3 s after it was given", refused)
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Allocate for 12 units with no such container = %v; want FailedPrecondition", err)
	}
	if limit := manager.DefaultAllocateWait - manager.DefaultAllocateWait/10; refused >= limit {
		t.Errorf("refused after %v; want once the earlier answer settled, before %v", refused, limit)
	}
}
