//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/extender/app"
	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/test/cluster"
)

const (
	throughputNodes = 100
	throughputBurst = 500
)

// BenchmarkSchedulingThroughput measures pods bound per second through the real kube-scheduler
// on 100 GPU nodes (8 × 80 GiB), with the scheduler alone and with our extender (filter,
// prioritize, bind) in its loop, at the scheduler's default client QPS (50) and at 500. Both
// configurations run alternately on the same cluster and nodes in one benchmark, so the reported
// ratio compares like with like. Each round creates 500 pods of 4 GiB at once (16 writers) and
// stops the clock when the last one is bound. Run:
//
//	go test -tags e2e -run '^$' -bench SchedulingThroughput -benchtime 3x ./test/e2e/
func BenchmarkSchedulingThroughput(b *testing.B) {
	for _, qps := range []float32{50, 500} {
		b.Run(fmt.Sprintf("qps=%v", qps), func(b *testing.B) {
			ctx := context.Background()
			c := cluster.StartT(b, cluster.Config{NoScheduler: true})
			nodes := make([]cluster.NodeSpec, throughputNodes)
			for i := range nodes {
				nodes[i] = cluster.NodeSpec{
					Name:      fmt.Sprintf("gpu-%03d", i),
					Labels:    map[string]string{gpushare.LabelGPUShare: gpushare.LabelValueTrue},
					Resources: map[corev1.ResourceName]int64{gpushare.ResourceName: 8 * 80, gpushare.ResourceCount: 8},
				}
			}
			if err := c.CreateNodes(ctx, nodes); err != nil {
				b.Fatal(err)
			}
			extenderURL := serveExtender(b, c)
			alone := cluster.SchedulerConfig{ClientQPS: qps, ClientBurst: int32(2 * qps), Verbosity: 1}
			withExtender := alone
			withExtender.Extenders = []cluster.Extender{{
				URLPrefix: extenderURL, FilterVerb: "filter", PrioritizeVerb: "prioritize", Weight: 1,
				BindVerb: "bind", NodeCacheCapable: true, HTTPTimeout: 30 * time.Second,
				ManagedResources: []cluster.ManagedResource{{Name: string(gpushare.ResourceName)}},
			}}
			var aloneRate, extenderRate []float64
			for i := 0; i < b.N; i++ {
				aloneRate = append(aloneRate, burstRate(b, c, alone, fmt.Sprintf("alone-%d", i)))
				extenderRate = append(extenderRate, burstRate(b, c, withExtender, fmt.Sprintf("ext-%d", i)))
			}
			a, e := median(aloneRate), median(extenderRate)
			b.ReportMetric(a, "pods/s-scheduler")
			b.ReportMetric(e, "pods/s-extender")
			b.ReportMetric(e/a, "ratio")
			b.ReportMetric(0, "ns/op") // the rates are the result; wall time per round is not
		})
	}
}

// serveExtender runs our extender in process on a loopback port with the shipped client limits
// and returns its URL prefix once it is ready.
func serveExtender(b *testing.B, c *cluster.Cluster) string {
	cfg := c.RESTConfig()
	cfg.QPS, cfg.Burst = 500, 1000 // the extender's flag defaults
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- app.Run(ctx, ln, app.Config{Client: client, Logger: zap.NewNop(), Policy: allocator.BestFit, Version: "bench"})
	}()
	b.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			b.Errorf("extender: %v", err)
		}
	})
	base := "http://" + ln.Addr().String()
	if err := cluster.Poll(ctx, 30*time.Second, "extender ready", func(ctx context.Context) (bool, error) {
		resp, err := http.Get(base + "/readyz")
		if err != nil {
			return false, err
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	}); err != nil {
		b.Fatal(err)
	}
	return base + gpushare.ExtenderURLPrefix
}

// burstRate (re)starts the scheduler with cfg, creates a burst of pods at once and returns pods
// bound per second, measured from the first create to the last binding. The pods are then
// removed (grace period 0: no kubelet will confirm) and their removal awaited.
func burstRate(b *testing.B, c *cluster.Cluster, cfg cluster.SchedulerConfig, prefix string) float64 {
	ctx := context.Background()
	b.StopTimer()
	if err := c.StartScheduler(ctx, cfg); err != nil {
		b.Fatal(err)
	}
	pods := c.Client().CoreV1().Pods("default")
	allBound := watchBound(b, c.Client(), prefix, throughputBurst)
	b.StartTimer()
	start := time.Now()
	work := make(chan int)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for i := range work {
				if _, err := pods.Create(ctx, throughputPod(fmt.Sprintf("%s-%03d", prefix, i)), metav1.CreateOptions{}); err != nil {
					b.Error(err)
				}
			}
		})
	}
	for i := range throughputBurst {
		work <- i
	}
	close(work)
	wg.Wait()
	select {
	case <-allBound:
	case <-time.After(5 * time.Minute):
		b.Fatalf("not all %d pods bound after 5 minutes", throughputBurst)
	}
	rate := float64(throughputBurst) / time.Since(start).Seconds()
	b.StopTimer()
	zero := int64(0)
	if err := pods.DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{}); err != nil {
		b.Fatal(err)
	}
	if err := cluster.Poll(ctx, time.Minute, "burst pods deleted", func(ctx context.Context) (bool, error) {
		list, err := pods.List(ctx, metav1.ListOptions{})
		return err == nil && len(list.Items) == 0, err
	}); err != nil {
		b.Fatal(err)
	}
	b.StartTimer()
	return rate
}

// watchBound returns a channel closed once n pods whose names start with prefix are bound. An
// informer, not a bare watch: it survives the apiserver ending a watch under load.
func watchBound(b *testing.B, client kubernetes.Interface, prefix string, n int) <-chan struct{} {
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace("default"))
	informer := factory.Core().V1().Pods().Informer()
	done := make(chan struct{})
	var mu sync.Mutex
	bound := map[string]bool{}
	record := func(obj any) {
		p, ok := obj.(*corev1.Pod)
		if !ok || p.Spec.NodeName == "" || !strings.HasPrefix(p.Name, prefix+"-") {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if !bound[p.Name] {
			bound[p.Name] = true
			if len(bound) == n {
				close(done)
			}
		}
	}
	if _, err := informer.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    record,
		UpdateFunc: func(_, obj any) { record(obj) },
	}); err != nil {
		b.Fatal(err)
	}
	factory.Start(ctx.Done())
	if !toolscache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
		b.Fatal("pod informer did not sync")
	}
	return done
}

func throughputPod(name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "main", Image: "registry.k8s.io/pause:3.10",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
				gpushare.ResourceName: *resource.NewQuantity(4, resource.DecimalSI),
			}},
		}}},
	}
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}
