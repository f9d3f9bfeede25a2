package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpushare/gpushare/extender/binder"
	"github.com/gpushare/gpushare/extender/cache"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

// benchEnv is a synced cache over nodes × 8 GPUs of 80 units, two bound pods per node.
type benchEnv struct {
	client *fake.Clientset
	cache  *cache.Cache
	server *Server
	names  []string
}

func newBenchEnv(b *testing.B, nodes int) *benchEnv {
	b.Helper()
	objs := make([]runtime.Object, 0, nodes*3)
	names := make([]string, nodes)
	for i := range nodes {
		names[i] = fmt.Sprintf("node-%05d", i)
		objs = append(objs, gpuNode(names[i], 640, 8))
		for j := range 2 {
			p := gpuPod(fmt.Sprintf("bound-%05d-%d", i, j), int64(10+j*20))
			p.Spec.NodeName = names[i]
			a, err := gpushare.PodAssignment{GPUIndex: (i + j) % 8, PodUnits: uint64(10 + j*20), DevUnits: 80, Assigned: true, AssumeTime: 1}.Encode()
			if err != nil {
				b.Fatal(err)
			}
			p.Annotations = a
			objs = append(objs, p)
		}
	}
	e := &benchEnv{client: fake.NewClientset(objs...), names: names}
	e.client.PrependReactor("create", "pods", bindReactor(e.client))
	c, err := cache.New(cache.Config{Client: e.client, Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	runCache(b, c, time.Minute)
	e.cache = c
	s, err := New(Config{Cache: c, Binder: binder.New(binder.Config{Client: e.client, Cache: c}), Registry: prometheus.NewRegistry()})
	if err != nil {
		b.Fatal(err)
	}
	e.server = s
	return e
}

// runTimed runs op b.N times and reports the 50th and 99th percentile latency.
func runTimed(b *testing.B, prepare, op func()) {
	b.Helper()
	lat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if prepare != nil {
			// Outside both the benchmark's time and the latency sample.
			b.StopTimer()
			prepare()
			b.StartTimer()
		}
		start := time.Now()
		op()
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(lat)
	if len(lat) > 0 {
		b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
		b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
	}
}

// BenchmarkFilter measures the filter verb through the HTTP handler (JSON
// decode of the pod and node names, placement on every node, JSON encode).
func BenchmarkFilter(b *testing.B) { benchVerb(b, "filter") }

// BenchmarkFilterCore measures the filter decision alone, without JSON.
func BenchmarkFilterCore(b *testing.B) {
	for _, nodes := range []int{1000, 5000} {
		b.Run(fmt.Sprintf("nodes=%d", nodes), func(b *testing.B) {
			e := newBenchEnv(b, nodes)
			args := &extenderv1.ExtenderArgs{Pod: gpuPod("p", 24), NodeNames: &e.names}
			runTimed(b, nil, func() {
				if res := Filter(e.cache, 0, args, e.names); len(*res.NodeNames) != nodes {
					b.Fatalf("%d nodes passed", len(*res.NodeNames))
				}
			})
		})
	}
}

// BenchmarkPrioritize measures the prioritize verb through the HTTP handler.
func BenchmarkPrioritize(b *testing.B) { benchVerb(b, "prioritize") }

// benchVerb measures a verb through the HTTP handler at 1,000 and 5,000 nodes.
func benchVerb(b *testing.B, verb string) {
	for _, nodes := range []int{1000, 5000} {
		b.Run(fmt.Sprintf("nodes=%d", nodes), func(b *testing.B) {
			e := newBenchEnv(b, nodes)
			body, err := json.Marshal(extenderv1.ExtenderArgs{Pod: gpuPod("p", 24), NodeNames: &e.names})
			if err != nil {
				b.Fatal(err)
			}
			h := e.server.Handler()
			runTimed(b, nil, func() {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest("POST", gpushare.ExtenderURLPrefix+"/"+verb, bytes.NewReader(body)))
				if rec.Code != http.StatusOK {
					b.Fatalf("%s: %d %s", verb, rec.Code, rec.Body)
				}
			})
		})
	}
}

// BenchmarkBind measures the bind verb in process: UID check, assume under
// the cache lock, and the annotated Binding against the fake clientset (so the
// API server's own cost is not in the figure; creating each pod is not timed).
func BenchmarkBind(b *testing.B) {
	for _, nodes := range []int{1000, 5000} {
		b.Run(fmt.Sprintf("nodes=%d", nodes), func(b *testing.B) {
			e := newBenchEnv(b, nodes)
			bd := binder.New(binder.Config{Client: e.client, Cache: e.cache})
			ctx := context.Background()
			i := 0
			var p *corev1.Pod
			var node string
			runTimed(b, func() {
				p = gpuPod(fmt.Sprintf("new-%d", i), int64(1+i%4))
				if _, err := e.client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
					b.Fatal(err)
				}
				node = e.names[i%nodes]
				i++
			}, func() {
				if err := bd.Bind(ctx, extenderv1.ExtenderBindingArgs{PodName: p.Name, PodNamespace: p.Namespace, PodUID: p.UID, Node: node}); err != nil {
					b.Fatal(err)
				}
			})
		})
	}
}
