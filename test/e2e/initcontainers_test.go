//go:build e2e

package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/manager"
	"github.com/gpushare/gpushare/test/cluster"
)

// exitingImage names an image whose containers the bed's fake runtime finishes with exit code 0
// soon after they start (test/bed/cmd/fake-cri): a plain init container that runs to completion.
const exitingImage = "registry.k8s.io/exit-0:1"

// plainInitPod is a pod bound to node with a plain (non-restartable) init container "warm" of
// initUnits on gpu, which runs to completion, and a regular container "main" of mainUnits there
// (0: main asks for no GPU), annotated as the extender binds it.
func plainInitPod(name, node string, initUnits, mainUnits int64, gpu int, devUnits uint64, assume time.Time) *corev1.Pod {
	limits := func(u int64) corev1.ResourceRequirements {
		if u == 0 {
			return corev1.ResourceRequirements{}
		}
		return corev1.ResourceRequirements{Limits: corev1.ResourceList{gpushare.ResourceName: *resource.NewQuantity(u, resource.DecimalSI)}}
	}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{NodeName: node,
			InitContainers: []corev1.Container{{Name: "warm", Image: exitingImage, Resources: limits(initUnits)}},
			Containers:     []corev1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10", Resources: limits(mainUnits)}},
		},
	}
	reqs, err := gpushare.ContainerRequests(p)
	if err != nil {
		panic(err)
	}
	a := gpushare.PodAssignment{GPUIndex: gpu, PodUnits: gpushare.PodUnits(reqs), DevUnits: devUnits,
		AssumeTime: assume.UnixNano(), Allocation: gpushare.AllocationForGPU(reqs, gpu)}
	if p.Annotations, err = a.Encode(); err != nil {
		panic(err)
	}
	return p
}

// Pods whose plain init container asks for gpu-mem and runs to completion before the regular
// containers start, on the real kubelet: the pod-resources API never lists such a container, and
// the kubelet hands its devices on to the pod's next containers. Every pod must run, be recorded
// ASSIGNED=true, and every container, init ones included, must have exactly the GPU its
// annotations name in the kubelet's checkpoint. Then a second round of the same sizes on another
// GPU: it is only placeable, by the extender's rule, once the first round left the in-flight set.
func TestPluginPlainInitContainers(t *testing.T) {
	t.Parallel()
	c, kubelet, sim, devUnits := gpuNode(t, "simulated:dgxh100")
	startPlugin(t, c.Client(), kubelet, sim, 10*time.Second).waitRegistered(t)
	waitCapacity(t, c, kubelet.Name(), int64(8*devUnits))

	shapes := []struct {
		name             string
		initUnits, units int64
	}{
		{"reuse", 4, 4},    // main takes over the init container's devices
		{"grow", 2, 6},     // main needs more than the init container had
		{"initonly", 3, 0}, // nothing after the init container uses the GPU
	}
	round := func(suffix string, firstGPU int) []*corev1.Pod {
		var objs []*corev1.Pod
		for i, s := range shapes {
			objs = append(objs, plainInitPod(s.name+suffix, kubelet.Name(), s.initUnits, s.units, firstGPU+i, devUnits, time.Now()))
		}
		return objs
	}
	began := time.Now()
	pods := createAll(t, c.Client(), round("", 1))
	waitRunning(t, c, pods)
	t.Logf("%d pods with GPU init containers ran and were recorded after %v", len(pods), time.Since(began))
	checkEnvs(t, c.Client(), kubelet, pods, devUnits)

	// Released: pods of the same sizes on other GPUs now follow without waiting on the first.
	second := round("-2", 4)
	pods2 := createAll(t, c.Client(), second)
	waitRunning(t, c, pods2)
	checkEnvs(t, c.Client(), kubelet, pods2, devUnits)
}

// The node's own check: pods bound by hand whose annotations put more on a GPU than it has are
// refused at admission with a reason naming the GPU, its size and its holders, whatever the
// scheduler did; the pods that fit run. A pod bound by hand to a one-GPU node without any
// annotation counts too.
func TestPluginRefusesOvercommit(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	c, kubelet, sim, devUnits := gpuNode(t, "simulated:dgxh100")
	startPlugin(t, c.Client(), kubelet, sim, 2*time.Second).waitRegistered(t)
	waitCapacity(t, c, kubelet.Name(), int64(8*devUnits))

	big := int64(devUnits) - 10
	first := createAll(t, c.Client(), []*corev1.Pod{podSpec{name: "first", sizes: []int64{big}, gpus: []int{4}}.object(kubelet.Name(), devUnits, time.Now())})
	waitRunning(t, c, first)
	// Bound by hand (or by a scheduler without our extender) onto the same GPU: 20 units more than it has.
	createAll(t, c.Client(), []*corev1.Pod{podSpec{name: "byhand", sizes: []int64{30}, gpus: []int{4}}.object(kubelet.Name(), devUnits, time.Now())})
	failed, err := c.WaitForPod(ctx, "default", "byhand", waitLong, "refused at admission", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"over-committed", "GPU 4", fmt.Sprintf("%d GiB units", devUnits),
		fmt.Sprintf("default/first=%d", big), "default/byhand=30"} {
		if !strings.Contains(failed.Status.Message, want) {
			t.Errorf("refusal message lacks %q: %s", want, failed.Status.Message)
		}
	}
	t.Logf("the kubelet's message: %s", failed.Status.Message)
	// The refused pod is finished: it no longer counts, and a pod that fits runs on that GPU.
	fits := createAll(t, c.Client(), []*corev1.Pod{podSpec{name: "fits", sizes: []int64{10}, gpus: []int{4}}.object(kubelet.Name(), devUnits, time.Now())})
	waitRunning(t, c, fits)
	checkEnvs(t, c.Client(), kubelet, map[string]*corev1.Pod{"first": first["first"], "fits": fits["fits"]}, devUnits)
}

// A record lost for good: every record PATCH of the plugin is reset (nothing committed) while the
// pod starts, longer than the record's own retries, and the plugin's reconciler fails too. Once
// the API server is reachable again the pod must be ASSIGNED=true within 30 s, with the
// environment the kubelet gave it.
func TestPluginRecordRepairedAfterOutage(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	c, kubelet, sim, devUnits := gpuNode(t, "simulated:dgxh100")
	proxy, err := c.StartFaultProxy("plugin-outage", "gpushare-test-plugin", "system:masters")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	cfg, err := clientcmd.BuildConfigFromFlags("", proxy.Kubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	viaProxy, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	startPluginWith(t, viaProxy, kubelet, sim, 10*time.Second, func(m *manager.Config) {
		m.RecordRetry = wait.Backoff{Duration: 200 * time.Millisecond, Factor: 1, Steps: 2} // gives up after 2 more tries
	}).waitRegistered(t)
	waitCapacity(t, c, kubelet.Name(), int64(8*devUnits))

	proxy.SetRules(cluster.Rule{Match: cluster.MatchRequest("PATCH", "/api/v1/namespaces/default/pods/*"), Fault: cluster.Fault{Kind: cluster.Reset}})
	pods := createAll(t, c.Client(), []*corev1.Pod{podSpec{name: "lost", sizes: []int64{8}, gpus: []int{3}}.object(kubelet.Name(), devUnits, time.Now())})
	if _, err := c.WaitForPod(ctx, "default", "lost", waitLong, "running", cluster.PodRunning); err != nil {
		t.Fatal(err)
	}
	// The first write, both retries and at least two reconciler passes have failed.
	pollUntil(t, waitLong, "five record PATCHes reset", func() bool { return proxy.Count(cluster.Reset) >= 5 })
	if p, err := c.Client().CoreV1().Pods("default").Get(ctx, "lost", metav1.GetOptions{}); err != nil || p.Annotations[gpushare.AnnotationAssigned] == "true" {
		t.Fatalf("the record landed through the outage (%v): the test proves nothing", err)
	}
	proxy.SetRules()
	back := time.Now()
	if _, err := c.WaitForPod(ctx, "default", "lost", 30*time.Second, "recorded within 30 s of the API server answering again",
		func(p *corev1.Pod) bool { return p.Annotations[gpushare.AnnotationAssigned] == "true" }); err != nil {
		t.Fatal(err)
	}
	t.Logf("recorded %v after the API server answered again (%d PATCHes reset before)", time.Since(back), proxy.Count(cluster.Reset))
	checkEnvs(t, c.Client(), kubelet, pods, devUnits)
}
