//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/test/cluster"
)

const waitLong = 60 * time.Second

// recordingExtender is a minimal scheduler extender: filter passes every node, bind posts the
// Binding. It records which pods each verb saw.
type recordingExtender struct {
	client kubernetes.Interface
	mu     sync.Mutex
	filter []string // pod names
	bind   []string // pod/node
}

func (e *recordingExtender) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /bed/filter", func(w http.ResponseWriter, r *http.Request) {
		var args extenderv1.ExtenderArgs
		if err := json.NewDecoder(r.Body).Decode(&args); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		e.mu.Lock()
		e.filter = append(e.filter, args.Pod.Name)
		e.mu.Unlock()
		json.NewEncoder(w).Encode(extenderv1.ExtenderFilterResult{NodeNames: args.NodeNames})
	})
	mux.HandleFunc("POST /bed/bind", func(w http.ResponseWriter, r *http.Request) {
		var args extenderv1.ExtenderBindingArgs
		if err := json.NewDecoder(r.Body).Decode(&args); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		err := e.client.CoreV1().Pods(args.PodNamespace).Bind(r.Context(), &corev1.Binding{
			ObjectMeta: metav1.ObjectMeta{Name: args.PodName, Namespace: args.PodNamespace, UID: args.PodUID},
			Target:     corev1.ObjectReference{Kind: "Node", Name: args.Node},
		}, metav1.CreateOptions{})
		result := extenderv1.ExtenderBindingResult{}
		if err != nil {
			result.Error = err.Error()
		}
		e.mu.Lock()
		e.bind = append(e.bind, args.PodName+"/"+args.Node)
		e.mu.Unlock()
		json.NewEncoder(w).Encode(result)
	})
	return mux
}

func (e *recordingExtender) calls() (filter, bind []string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.filter), slices.Clone(e.bind)
}

func gpuPod(name string, units int64, nodeSelector map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{
			NodeSelector: nodeSelector,
			Containers: []corev1.Container{{
				Name: "main", Image: "registry.k8s.io/pause:3.10",
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
					gpushare.ResourceName: *resource.NewQuantity(units, resource.DecimalSI),
				}},
			}},
		},
	}
}

// The scheduler sends a pod asking for gpu-mem to the extender named in its configuration, and the
// extender's bind is what binds it.
func TestBedSchedulerCallsExtender(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	ext := &recordingExtender{}
	srv := httptest.NewServer(ext.handler())
	defer srv.Close()
	c := cluster.StartT(t, cluster.Config{Scheduler: cluster.SchedulerConfig{Extenders: []cluster.Extender{{
		URLPrefix: srv.URL + "/bed", FilterVerb: "filter", BindVerb: "bind", NodeCacheCapable: true,
		ManagedResources: []cluster.ManagedResource{{Name: string(gpushare.ResourceName)}},
	}}}})
	ext.client = c.Client()

	if err := c.CreateNodes(ctx, []cluster.NodeSpec{
		{Name: "gpu-a", Resources: map[corev1.ResourceName]int64{gpushare.ResourceName: 32, gpushare.ResourceCount: 2}},
		{Name: "gpu-b", Resources: map[corev1.ResourceName]int64{gpushare.ResourceName: 32, gpushare.ResourceCount: 2}},
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client().CoreV1().Pods("default").Create(ctx, gpuPod("share-8", 8, nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod, err := c.WaitForPod(ctx, "default", "share-8", waitLong, "bound", cluster.PodBound)
	if err != nil {
		t.Fatal(err)
	}
	filter, bind := ext.calls()
	if !slices.Contains(filter, "share-8") {
		t.Errorf("extender filter saw %v, want share-8", filter)
	}
	if want := "share-8/" + pod.Spec.NodeName; !slices.Equal(bind, []string{want}) {
		t.Errorf("extender bind calls %v, want [%s]", bind, want)
	}
}

// A device plugin registered with a hollow kubelet is ListAndWatch'ed (its devices become the
// Node's capacity), a pod scheduled there gets Allocate called and runs, and a kubelet restart
// wipes plugin sockets, restores the device checkpoint and waits for the plugin to come back.
func TestBedDevicePluginAndKubeletRestart(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	c := cluster.StartT(t, cluster.Config{})
	kubelet, err := c.AddKubelet(ctx, "hollow-gpu", cluster.KubeletOptions{Labels: map[string]string{gpushare.LabelGPUShare: gpushare.LabelValueTrue}})
	if err != nil {
		t.Fatal(err)
	}
	const devices = 16
	plugin := newBedPlugin(kubelet.DevicePluginDir(), string(gpushare.ResourceName), devices)
	plugin.start(t)
	if _, err := c.WaitForNode(ctx, kubelet.Name(), waitLong, "advertises the plugin's devices",
		cluster.Allocatable(gpushare.ResourceName, devices)); err != nil {
		t.Fatal(err)
	}

	onNode := map[string]string{"kubernetes.io/hostname": kubelet.Name()}
	pods := c.Client().CoreV1().Pods("default")
	first, err := pods.Create(ctx, gpuPod("first", 4, onNode), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitForPod(ctx, "default", "first", waitLong, "running", cluster.PodRunning); err != nil {
		t.Fatal(err)
	}
	allocs := plugin.allocations()
	if len(allocs) != 1 || len(allocs[0]) != 4 {
		t.Fatalf("Allocate calls %v, want one call for 4 devices", allocs)
	}
	firstDevices := allocs[0]
	cp, err := kubelet.Checkpoint()
	if err != nil {
		t.Fatal(err)
	}
	entry := findEntry(cp, string(first.UID), "main")
	if entry == nil || !slices.Equal(entry.DeviceIDs, firstDevices) || entry.Envs["BED_DEVICES"] != strings.Join(firstDevices, ",") {
		t.Fatalf("checkpoint entry for first/main = %+v, want devices %v and their env", entry, firstDevices)
	}

	if err := kubelet.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	// The restarted kubelet removed the plugin's socket (a real kubelet wipes the directory) ...
	if _, err := os.Stat(plugin.socket()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("plugin socket after kubelet restart: stat error %v, want not-exist", err)
	}
	plugin.stop()
	// ... and advertises nothing until the plugin registers again ...
	if _, err := c.WaitForNode(ctx, kubelet.Name(), waitLong, "drops capacity until the plugin returns",
		cluster.Allocatable(gpushare.ResourceName, 0)); err != nil {
		t.Fatal(err)
	}
	// ... but restored from its checkpoint which devices the running pod holds: the pod-resources
	// API lists them as soon as the kubelet has the pod again, with no Allocate call.
	key := cluster.ContainerDevices{Namespace: "default", Pod: "first", Container: "main"}
	var held []string
	if err := cluster.Poll(ctx, waitLong, "pod-resources lists first/main", func(ctx context.Context) (bool, error) {
		all, err := kubelet.PodResources(ctx, string(gpushare.ResourceName))
		held = all[key]
		return len(held) > 0, err
	}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(held, firstDevices) {
		t.Errorf("pod-resources after restart: first/main holds %v, want %v", held, firstDevices)
	}
	if n := len(plugin.allocations()); n != 1 {
		t.Errorf("%d Allocate calls after the restart, want still 1", n)
	}

	plugin.start(t)
	if _, err := c.WaitForNode(ctx, kubelet.Name(), waitLong, "advertises the plugin's devices again",
		cluster.Allocatable(gpushare.ResourceName, devices)); err != nil {
		t.Fatal(err)
	}
	if _, err := pods.Create(ctx, gpuPod("second", 8, onNode), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitForPod(ctx, "default", "second", waitLong, "running", cluster.PodRunning); err != nil {
		t.Fatal(err)
	}
	allocs = plugin.allocations()
	if len(allocs) != 2 || len(allocs[1]) != 8 {
		t.Fatalf("Allocate calls %v, want the first pod's call and one for 8 devices", allocs)
	}
	for _, id := range allocs[1] {
		if slices.Contains(firstDevices, id) {
			t.Errorf("second pod got device %s that the first pod holds", id)
		}
	}
	if p, err := pods.Get(ctx, "first", metav1.GetOptions{}); err != nil {
		t.Error(err)
	} else if p.Status.Phase != corev1.PodRunning {
		t.Errorf("first pod after the restart is %s, want Running", p.Status.Phase)
	}
}

func findEntry(cp cluster.Checkpoint, podUID, container string) *cluster.CheckpointEntry {
	for i, e := range cp.Entries {
		if e.PodUID == podUID && e.ContainerName == container {
			return &cp.Entries[i]
		}
	}
	return nil
}
