package cache

import (
	"fmt"
	"runtime"
	"testing"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkMemory reports the heap the cache's own state takes for 5,000
// nodes × 8 GPUs and 50,000 bound pods (cache-MiB), and the heap of the pod
// objects themselves (pod-objects-MiB), which the pod informer's store holds.
func BenchmarkMemory(b *testing.B) {
	const nodes, pods = 5000, 50000
	for b.Loop() {
		b.StopTimer()
		objs := make([]*corev1.Pod, 0, pods)
		before := heapInUse()
		for i := range pods {
			objs = append(objs, Pod(fmt.Sprintf("p-%06d", i), fmt.Sprintf("node-%05d", i%nodes), i%8, i%3 == 0, int64(1+i%16)))
		}
		objects := heapInUse() - before
		c, err := New(Config{Client: fake.NewClientset(), Logger: zap.NewNop()})
		if err != nil {
			b.Fatal(err)
		}
		base := heapInUse()
		b.StartTimer()
		for i := range nodes {
			c.upsertNode(Node(fmt.Sprintf("node-%05d", i), 640, 8, nil))
		}
		for _, p := range objs {
			c.upsertPod(p, false)
		}
		b.StopTimer()
		// Node objects are kept by the cache; pods only as our compact state.
		state := heapInUse() - base
		runtime.KeepAlive(objs)
		runtime.KeepAlive(c)
		b.ReportMetric(float64(state)/(1<<20), "cache-MiB")
		b.ReportMetric(float64(objects)/(1<<20), "pod-objects-MiB")
		b.StartTimer()
	}
}
