package cache

import (
	"encoding/json"
	"fmt"
	"reflect"
	"testing"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

// fullNode is a GPU node as the API server returns it: labels, managed
// fields, other annotations, CPU and memory resources, conditions,
// addresses, system info and 40 cached images.
func fullNode(name string) *corev1.Node {
	n := Node(name, 640, 8, &gpushare.NodeGPUs{Unit: gpushare.GiB, GPUs: []gpushare.GPUInfo{
		{Index: 0, Units: 80, Healthy: true, Isolation: gpushare.IsolationMPS},
		{Index: 1, Units: 80, Isolation: gpushare.IsolationNone, IsolationReason: "MPS control daemon not answering"},
	}})
	now := metav1.Now()
	n.UID, n.ResourceVersion, n.CreationTimestamp = "uid-node", "777", now
	n.Labels = map[string]string{"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "node.kubernetes.io/instance-type": "p4d.24xlarge", "gpushare": "true"}
	n.Annotations["node.alpha.kubernetes.io/ttl"] = "0"
	n.Annotations["volumes.kubernetes.io/controller-managed-attach-detach"] = "true"
	n.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", Time: &now,
		FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:status":{"f:conditions":{".":{}},"f:images":{}}}`)}}}
	n.Spec.PodCIDR = "10.244.1.0/24"
	n.Spec.Taints = []corev1.Taint{{Key: "nvidia.com/gpu", Effect: corev1.TaintEffectNoSchedule}}
	for _, l := range []corev1.ResourceList{n.Status.Capacity, n.Status.Allocatable} {
		l[corev1.ResourceCPU] = resource.MustParse("96")
		l[corev1.ResourceMemory] = resource.MustParse("1152Gi")
		l[corev1.ResourcePods] = resource.MustParse("110")
		l[corev1.ResourceEphemeralStorage] = resource.MustParse("7Ti")
	}
	for _, c := range []corev1.NodeConditionType{corev1.NodeReady, corev1.NodeMemoryPressure, corev1.NodeDiskPressure, corev1.NodePIDPressure} {
		n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: c, Status: corev1.ConditionFalse,
			LastHeartbeatTime: now, LastTransitionTime: now, Reason: "KubeletHasSufficient" + string(c), Message: "kubelet has sufficient " + string(c)})
	}
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.1.7"}, {Type: corev1.NodeHostName, Address: name}}
	n.Status.NodeInfo = corev1.NodeSystemInfo{MachineID: "0123456789abcdef", KernelVersion: "6.8.0", OSImage: "Ubuntu 24.04", ContainerRuntimeVersion: "containerd://2.0.0", KubeletVersion: "v1.37.2"}
	for i := range 40 {
		n.Status.Images = append(n.Status.Images, corev1.ContainerImage{SizeBytes: 1 << 30, Names: []string{
			fmt.Sprintf("registry.example.com/team/image-%02d@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", i),
			fmt.Sprintf("registry.example.com/team/image-%02d:v1.2.3", i),
		}})
	}
	return n
}

func TestTrimNode(t *testing.T) {
	full := fullNode("n1")
	obj, err := trimNode(full.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	got := obj.(*corev1.Node)
	log := zap.NewNop()
	wantGPUs, wantTiers, wantReasons, _, wantShare := layout(full, log)
	if len(wantReasons) != 1 || len(wantTiers) != 2 || wantTiers[0] != allocator.TierMPS {
		t.Fatalf("the test node's tiers read as %v, %v", wantTiers, wantReasons)
	}
	if gotGPUs, gotTiers, gotReasons, _, gotShare := layout(got, log); len(wantGPUs) != 2 || !wantShare || !reflect.DeepEqual(gotGPUs, wantGPUs) ||
		!reflect.DeepEqual(gotTiers, wantTiers) || !reflect.DeepEqual(gotReasons, wantReasons) || gotShare != wantShare {
		t.Fatalf("layout of the trimmed node %+v %v, want %+v %v", gotGPUs, gotShare, wantGPUs, wantShare)
	}
	gpu := corev1.ResourceList{gpushare.ResourceName: resource.MustParse("640"), gpushare.ResourceCount: resource.MustParse("8")}
	want := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: full.UID, ResourceVersion: "777",
			Annotations: map[string]string{gpushare.AnnotationNodeGPUs: full.Annotations[gpushare.AnnotationNodeGPUs]}},
		Status: corev1.NodeStatus{Allocatable: gpu},
	}
	if !equalNodes(got, want) {
		t.Fatalf("trimmed node\n%+v\nwant\n%+v", got, want)
	}
	// Capacity is kept where allocatable lacks an amount, and read then.
	partial := full.DeepCopy()
	delete(partial.Status.Allocatable, gpushare.ResourceCount)
	delete(partial.Annotations, gpushare.AnnotationNodeGPUs)
	obj, _ = trimNode(partial)
	if n := obj.(*corev1.Node); len(n.Status.Capacity) != 1 || len(n.Status.Allocatable) != 1 {
		t.Fatalf("capacity %v, allocatable %v: want the count from capacity, the memory from allocatable", n.Status.Capacity, n.Status.Allocatable)
	}
	if g, _, _, _, s := layout(obj.(*corev1.Node), log); !s || len(g) != 8 || g[7].Units != 80 {
		t.Fatalf("layout from allocatable memory and capacity count: %+v %v", g, s)
	}
	// The count fallback (no annotation) reads the same too.
	bare := Node("n2", 64, 4, nil)
	obj, _ = trimNode(bare.DeepCopy())
	if g, _, _, _, s := layout(obj.(*corev1.Node), log); !s || len(g) != 4 || g[3].Units != 16 || obj.(*corev1.Node).Annotations != nil {
		t.Fatalf("fallback layout %+v %v of %+v", g, s, obj)
	}
	// A node without GPUs keeps nothing of its resources.
	obj, _ = trimNode(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cpu"}, Status: corev1.NodeStatus{Capacity: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4")}}})
	if n := obj.(*corev1.Node); n.Status.Capacity != nil || n.Status.Allocatable != nil || n.Name != "cpu" {
		t.Fatalf("CPU node trimmed to %+v", n)
	}
	// Idempotent; anything else passes untouched.
	if again, _ := trimNode(got.DeepCopy()); !equalNodes(again.(*corev1.Node), got) {
		t.Errorf("trimming twice differs: %+v", again)
	}
	tomb := toolscache.DeletedFinalStateUnknown{Key: "n1", Obj: full}
	if out, err := trimNode(tomb); err != nil || !reflect.DeepEqual(out, tomb) {
		t.Errorf("tombstone changed: %+v, %v", out, err)
	}
}

// equalNodes compares nodes by their JSON: quantities parsed and built
// differ in their cached strings, not in what they say.
func equalNodes(a, b *corev1.Node) bool {
	ja, erra := json.Marshal(a)
	jb, errb := json.Marshal(b)
	return erra == nil && errb == nil && string(ja) == string(jb)
}

// The informer's store holds trimmed nodes, and the view is read from them.
func TestInformerTrimsNodes(t *testing.T) {
	f := start(t, fullNode("n1"))
	f.waitUsed("n1", 0, 0)
	obj, ok, err := f.cache.nodeInformer.GetStore().GetByKey("n1")
	if err != nil || !ok {
		t.Fatalf("node not in the store: %v", err)
	}
	if n := obj.(*corev1.Node); n.Status.Images != nil || n.Labels != nil || len(n.Status.Allocatable) != 2 {
		t.Fatalf("stored node not trimmed: %+v", n)
	}
}

// BenchmarkNodeStoreMemory reports the live heap of 5,000 GPU nodes
// (fullNode) as decoded from the API server's JSON, kept whole or trimmed as
// the node informer keeps them; in MiB-live and bytes/node.
// go test -run '^$' -bench NodeStoreMemory -benchtime=1x ./extender/cache
func BenchmarkNodeStoreMemory(b *testing.B) {
	const nodes = 5000
	raw, err := json.Marshal(fullNode("node-00000"))
	if err != nil {
		b.Fatal(err)
	}
	for _, trim := range []bool{false, true} {
		b.Run(fmt.Sprintf("trim=%v", trim), func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				before := heapInUse()
				store := make([]*corev1.Node, 0, nodes)
				b.StartTimer()
				for range nodes {
					n := &corev1.Node{}
					if err := json.Unmarshal(raw, n); err != nil {
						b.Fatal(err)
					}
					if trim {
						if _, err := trimNode(n); err != nil {
							b.Fatal(err)
						}
					}
					store = append(store, n)
				}
				b.StopTimer()
				live := heapInUse() - before
				b.ReportMetric(float64(live)/(1<<20), "MiB-live")
				b.ReportMetric(float64(live)/nodes, "bytes/node")
				b.ReportMetric(float64(len(raw)), "json-bytes/node")
				b.StartTimer()
				_ = store[len(store)-1]
			}
		})
	}
}
