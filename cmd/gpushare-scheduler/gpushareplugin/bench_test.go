package gpushareplugin

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/extender/cache"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

// benchPlugin is the plugin over a synced cache of nodes × 8 GPUs of 80 units with two bound pods
// each, and the scheduler's NodeInfo of every node.
func benchPlugin(b testing.TB, nodes int) (*Plugin, []fwk.NodeInfo) {
	b.Helper()
	objs := make([]runtime.Object, 0, nodes*3)
	infos := make([]fwk.NodeInfo, nodes)
	for i := range nodes {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%05d", i), Labels: map[string]string{gpushare.LabelGPUShare: gpushare.LabelValueTrue}}}
		n.Status.Allocatable = corev1.ResourceList{gpushare.ResourceName: *resource.NewQuantity(640, resource.DecimalSI), gpushare.ResourceCount: *resource.NewQuantity(8, resource.DecimalSI)}
		n.Status.Capacity = n.Status.Allocatable
		objs = append(objs, n)
		info := framework.NewNodeInfo()
		info.SetNode(n)
		for j := range 2 {
			p := benchPod(fmt.Sprintf("bound-%05d-%d", i, j), uint64(10+j*20))
			p.Spec.NodeName = n.Name
			a, err := gpushare.PodAssignment{GPUIndex: (i + j) % 8, PodUnits: uint64(10 + j*20), DevUnits: 80, Assigned: true, AssumeTime: 1}.Encode()
			if err != nil {
				b.Fatal(err)
			}
			p.Annotations = a
			objs = append(objs, p)
			info.AddPod(p)
		}
		infos[i] = info
	}
	c := syncedCache(b, cache.Config{Client: fake.NewClientset(objs...)})
	return &Plugin{cache: c, policy: allocator.BestFit, log: zap.NewNop(), held: &heldPods{activate: func(map[string]*corev1.Pod) {}}}, infos
}

func benchPod(name string, units uint64) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID(name)},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{gpushare.ResourceName: *resource.NewQuantity(int64(units), resource.DecimalSI)},
		}}}},
	}
}

// BenchmarkFilterScore is the plugin's cost per node of one pod's scheduling cycle: Filter and
// Score on each node in turn, as the scheduler calls them (its own goroutines and snapshot aside),
// after a PreFilter per cycle (in ns/op, not in ns/node). pods=alike schedules replicas, one
// request: after the first cycle every node answers with the fit remembered on its published view.
// pods=mixed alternates two requests, so no node ever has the fit remembered for the next pod and
// each places it. ns/node is the median over every node of every iteration; p99-ns/node the 99th
// percentile.
func BenchmarkFilterScore(b *testing.B) {
	for _, nodes := range []int{1000, 5000} {
		for _, mix := range []struct {
			name string
			pods []*corev1.Pod
		}{
			{"alike", []*corev1.Pod{benchPod("p", 24)}},
			{"mixed", []*corev1.Pod{benchPod("p", 24), benchPod("q", 25)}},
		} {
			b.Run(fmt.Sprintf("nodes=%d/pods=%s", nodes, mix.name), func(b *testing.B) {
				p, infos := benchPlugin(b, nodes)
				lat := make([]time.Duration, 0, nodes)
				var all []time.Duration
				b.ResetTimer()
				for i := 0; b.Loop(); i++ {
					pod := mix.pods[i%len(mix.pods)]
					// A cycle's state each time, as the scheduler's.
					cs := framework.NewCycleState()
					if _, st := p.PreFilter(context.Background(), cs, pod, infos); !st.IsSuccess() {
						b.Fatal(st.AsError())
					}
					lat = lat[:0]
					for _, info := range infos {
						start := time.Now()
						if st := p.Filter(context.Background(), cs, pod, info); !st.IsSuccess() {
							b.Fatal(st.AsError())
						}
						if _, st := p.Score(context.Background(), cs, pod, info); !st.IsSuccess() {
							b.Fatal(st.AsError())
						}
						lat = append(lat, time.Since(start))
					}
					all = append(all, lat...)
				}
				b.StopTimer()
				slices.Sort(all)
				b.ReportMetric(float64(all[len(all)/2].Nanoseconds()), "ns/node")
				b.ReportMetric(float64(all[len(all)*99/100].Nanoseconds()), "p99-ns/node")
			})
		}
	}
}
