//go:build e2e

package e2e

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/test/cluster"
	"github.com/gpushare/gpushare/test/localcluster/manifests"
)

const throughputBurst = 500

// throughputNodes is how many GPU nodes BenchmarkSchedulingThroughput runs on: 100 in make bench,
// 1,000 on request (-args -throughput-nodes 1000).
var throughputNodes = flag.Int("throughput-nodes", 100, "GPU nodes of BenchmarkSchedulingThroughput")

// throughputProfile, when set, is a folder where BenchmarkSchedulingThroughput writes a CPU profile
// of kube-scheduler over each round (-args -throughput-profile DIR; go tool pprof reads them): what
// the scheduler spends its time on with and without the GPUShare plugin.
var throughputProfile = flag.String("throughput-profile", "", "folder for kube-scheduler CPU profiles of each BenchmarkSchedulingThroughput round")

// BenchmarkSchedulingThroughput measures pods bound per second through the real kube-scheduler
// on 100 GPU nodes (8 × 80 GiB; -throughput-nodes changes it), with the scheduler alone, with our
// extender (filter, prioritize, bind) in its loop, with the extender but no prioritize verb
// (manifests.MostAllocatedConfig: nodes ranked by NodeResourcesFit MostAllocated), and as
// gpushare-scheduler (the GPUShare plugin compiled in, configured as manifests/scheduler-plugin
// ships it), at the scheduler's default client QPS (50) and at 500. The configurations run in turn
// on the same cluster and nodes in one benchmark, so the reported ratios compare like with like:
// the scheduler alone, the plugin, the scheduler alone again, the extender, the extender without
// prioritize, then the DRA mode twice (the same nodes with our driver's slices, 4 GiB claims made
// by kube-controller-manager, which runs for these rounds only): pods naming the webhook's
// template themselves (dra), gpu-mem pods translated by gpushare-webhook (dra-webhook), and the
// first again with kube-controller-manager at the scheduler's client limits (dra-kcm-qps: at its
// default 20 queries per second its ResourceClaim controller, two writes per pod, is the limit),
// and that once more with gpushare-scheduler, whose DRA score rates the nodes for each claim
// (dra-scored);
// ratio-plugin is to the mean of the two rounds alone around it, ratio (the extender),
// ratio-mostallocated and the DRA ratios to the second. The extender is our shipped binary, a process of its own,
// and runs only for the rounds that use it: alone, the cluster does not carry its watch. Each round
// creates 500 pods of 4 GiB at once (16 writers) and stops the clock when the last one is bound.
// It also reports the CPU time each process spent per pod bound in each round, which on a small
// machine, where they share the cores, is what the extender's cost comes down to. Run:
//
//	go test -tags e2e -run '^$' -bench SchedulingThroughput -benchtime 3x ./test/e2e/
func BenchmarkSchedulingThroughput(b *testing.B) {
	// client-go's reflectors in this process log to stderr, which go test interleaves with the
	// result lines that benchstat and make bench parse.
	klog.SetLogger(logr.Discard())
	b.Cleanup(klog.ClearLogger)
	bin, err := cluster.OwnBinaries(b.TempDir(), false)
	if err != nil {
		b.Fatal(err)
	}
	pluginBin, err := cluster.BuildGPUShareScheduler(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	dir, err := manifests.Dir()
	if err != nil {
		b.Fatal(err)
	}
	profiles, err := manifests.PluginSchedulerProfiles(dir, corev1.DefaultSchedulerName)
	if err != nil {
		b.Fatal(err)
	}
	mostAllocated, err := manifests.MostAllocatedConfig()
	if err != nil {
		b.Fatal(err)
	}
	mostAllocatedProfiles, err := manifests.Profiles(mostAllocated, corev1.DefaultSchedulerName)
	if err != nil {
		b.Fatal(err)
	}
	for _, qps := range []float32{50, 500} {
		b.Run(fmt.Sprintf("qps=%v", qps), func(b *testing.B) {
			ctx := context.Background()
			// No controller-manager, as when docs/benchmarks.md's figures were measured.
			c := cluster.StartT(b, cluster.Config{NoScheduler: true, NoControllerManager: true})
			nodes := make([]cluster.NodeSpec, *throughputNodes)
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
			ext := startBenchExtender(b, c, bin)
			alone := cluster.SchedulerConfig{ClientQPS: qps, ClientBurst: int32(2 * qps), Verbosity: 1}
			withExtender := alone
			withExtender.Extenders = []cluster.Extender{{
				URLPrefix: ext.url, FilterVerb: "filter", PrioritizeVerb: "prioritize", Weight: 1,
				BindVerb: "bind", NodeCacheCapable: true, HTTPTimeout: 30 * time.Second,
				ManagedResources: []cluster.ManagedResource{{Name: string(gpushare.ResourceName)}},
			}}
			// The profile without prioritize (manifests.MostAllocatedConfig, measured, not shipped):
			// the extender filters and binds, kube-scheduler ranks nodes by MostAllocated on gpu-mem.
			withMostAllocated := withExtender
			withMostAllocated.Extenders = slices.Clone(withExtender.Extenders)
			withMostAllocated.Extenders[0].PrioritizeVerb, withMostAllocated.Extenders[0].Weight = "", 0
			withMostAllocated.Profiles = mostAllocatedProfiles
			grantPluginRole(b, c, dir)
			withPlugin := alone
			withPlugin.Binary, withPlugin.Profiles = pluginBin, profiles
			dra := setupDRAThroughput(b, c, nodes)
			rates := map[string][]float64{} // configuration → pods/s of each round
			cpu := map[string][]float64{}   // metric → ms per pod of each round
			record := func(config string, rate float64, perPod map[string]float64) {
				rates[config] = append(rates[config], rate)
				for proc, ms := range perPod {
					cpu["cpu-ms/pod-"+proc+"-"+config] = append(cpu["cpu-ms/pod-"+proc+"-"+config], ms)
				}
			}
			round := func(config string, cfg cluster.SchedulerConfig, name string) {
				rate, perPod := burstRate(b, c, cfg, name)
				record(config, rate, perPod)
			}
			// The scheduler alone runs before and after the plugin, and the plugin's ratio is to
			// the mean of the two: a round on a cluster that has just created its nodes runs
			// slower than the next, which alone first made ratios above 1.
			for i := 0; i < b.N; i++ {
				ext.stop()
				round("alone", alone, fmt.Sprintf("alone-%d", i))
				before := rates["alone"][len(rates["alone"])-1]
				round("plugin", withPlugin, fmt.Sprintf("plugin-%d", i))
				round("alone", alone, fmt.Sprintf("alone-after-%d", i))
				after := rates["alone"][len(rates["alone"])-1]
				rates["plugin-ratio"] = append(rates["plugin-ratio"], rates["plugin"][i]/((before+after)/2))
				ext.start(b)
				round("extender", withExtender, fmt.Sprintf("ext-%d", i))
				round("mostallocated", withMostAllocated, fmt.Sprintf("mostalloc-%d", i))
				rates["extender-ratio"] = append(rates["extender-ratio"], rates["extender"][i]/after)
				rates["mostallocated-ratio"] = append(rates["mostallocated-ratio"], rates["mostallocated"][i]/after)
				ext.stop()
				dra.rounds(b, alone, withPlugin, i, record)
				rates["dra-ratio"] = append(rates["dra-ratio"], rates["dra"][i]/after)
				rates["dra-webhook-ratio"] = append(rates["dra-webhook-ratio"], rates["dra-webhook"][i]/after)
				rates["dra-kcm-qps-ratio"] = append(rates["dra-kcm-qps-ratio"], rates["dra-kcm-qps"][i]/after)
				rates["dra-scored-ratio"] = append(rates["dra-scored-ratio"], rates["dra-scored"][i]/after)
			}
			b.ReportMetric(median(rates["alone"]), "pods/s-scheduler")
			b.ReportMetric(median(rates["extender"]), "pods/s-extender")
			b.ReportMetric(median(rates["extender-ratio"]), "ratio")
			b.ReportMetric(median(rates["mostallocated"]), "pods/s-mostallocated")
			b.ReportMetric(median(rates["mostallocated-ratio"]), "ratio-mostallocated")
			b.ReportMetric(median(rates["plugin"]), "pods/s-plugin")
			b.ReportMetric(median(rates["plugin-ratio"]), "ratio-plugin")
			b.ReportMetric(median(rates["dra"]), "pods/s-dra")
			b.ReportMetric(median(rates["dra-ratio"]), "ratio-dra")
			b.ReportMetric(median(rates["dra-webhook"]), "pods/s-dra-webhook")
			b.ReportMetric(median(rates["dra-webhook-ratio"]), "ratio-dra-webhook")
			b.ReportMetric(median(rates["dra-kcm-qps"]), "pods/s-dra-kcm-qps")
			b.ReportMetric(median(rates["dra-kcm-qps-ratio"]), "ratio-dra-kcm-qps")
			b.ReportMetric(median(rates["dra-scored"]), "pods/s-dra-scored")
			b.ReportMetric(median(rates["dra-scored-ratio"]), "ratio-dra-scored")
			for metric, ms := range cpu {
				b.ReportMetric(median(ms), metric)
			}
			b.ReportMetric(0, "ns/op") // the rates are the result; wall time per round is not
		})
	}
}

// benchExtender is our extender binary on the bed, started and stopped between rounds.
type benchExtender struct {
	prog *cluster.Program
	base string // http://127.0.0.1:port
	url  string // the URL prefix the scheduler calls
}

// startBenchExtender runs the extender binary with its default flags (client QPS 500, burst
// 1000, bestfit) as the cluster's admin, and waits until it is ready.
func startBenchExtender(b *testing.B, c *cluster.Cluster, bin string) *benchExtender {
	port := freeLoopbackPort(b)
	prog, err := c.StartProgram(extenderProcess, filepath.Join(bin, "gpushare-scheduler-extender"),
		[]string{"-listen", "127.0.0.1:" + port, "-kubeconfig", c.AdminKubeconfig()})
	if err != nil {
		b.Fatal(err)
	}
	e := &benchExtender{prog: prog, base: "http://127.0.0.1:" + port}
	e.url = e.base + gpushare.ExtenderURLPrefix
	e.waitReady(b)
	return e
}

// extenderProcess names the extender's process, and so its CPU metrics.
const extenderProcess = "extender"

func (e *benchExtender) stop() { e.prog.Stop(10 * time.Second) }

func (e *benchExtender) start(b *testing.B) {
	if !e.prog.Running() {
		if err := e.prog.Start(); err != nil {
			b.Fatal(err)
		}
	}
	e.waitReady(b)
}

func (e *benchExtender) waitReady(b *testing.B) {
	if err := cluster.Poll(context.Background(), time.Minute, "extender ready", func(ctx context.Context) (bool, error) {
		if !e.prog.Running() {
			return false, fmt.Errorf("the extender exited:\n%s", e.prog.LogTail(20))
		}
		resp, err := http.Get(e.base + "/readyz")
		if err != nil {
			return false, nil // not listening yet
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	}); err != nil {
		b.Fatal(err)
	}
}

// burstRate (re)starts the scheduler with cfg, creates a burst of pods at once and returns pods
// bound per second, measured from the first create to the last binding, and the CPU time each
// running process of the bed spent per pod bound (ms) over the same span. The pods are then
// removed (grace period 0: no kubelet will confirm) and their removal awaited.
func burstRate(b *testing.B, c *cluster.Cluster, cfg cluster.SchedulerConfig, prefix string) (float64, map[string]float64) {
	return burstRateOf(b, c, cfg, prefix, throughputPod, 3*time.Second)
}

// burstRateOf is burstRate with the round's pods made by mk (each in its own namespace).
func burstRateOf(b *testing.B, c *cluster.Cluster, cfg cluster.SchedulerConfig, prefix string, mk func(name string) *corev1.Pod, profile time.Duration) (float64, map[string]float64) {
	ctx := context.Background()
	b.StopTimer()
	if err := c.StartScheduler(ctx, cfg); err != nil {
		b.Fatal(err)
	}
	ns := mk("probe").Namespace
	pods := c.Client().CoreV1().Pods(ns)
	// The round's watch ends with the round: left running, each round's watch
	// decoded every later round's events beside it, on the same two cores,
	// and the configurations measured last paid for most of them.
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	allBound := watchBound(watchCtx, b, c.Client(), ns, prefix, throughputBurst)
	cpuBefore, err := c.ComponentCPU()
	if err != nil {
		b.Fatal(err)
	}
	profiled := profileRound(b, c, prefix, profile)
	b.StartTimer()
	start := time.Now()
	work := make(chan int)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for i := range work {
				if _, err := pods.Create(ctx, mk(fmt.Sprintf("%s-%03d", prefix, i)), metav1.CreateOptions{}); err != nil {
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
	<-profiled
	cpuAfter, err := c.ComponentCPU()
	if err != nil {
		b.Fatal(err)
	}
	perPod := map[string]float64{}
	for proc, before := range cpuBefore {
		if after, ok := cpuAfter[proc]; ok {
			perPod[proc] = float64(after-before) / float64(time.Millisecond) / throughputBurst
		}
	}
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
	return rate, perPod
}

// profileRound, with -throughput-profile, reads a CPU profile of kube-scheduler over the first
// window of the round about to start (3 s for a device-plugin round: one at 1,000 nodes takes
// about 2 s; 6 s for a DRA round, which takes 7 s or more at 100 nodes) into DIR/prefix.pprof. The
// channel is closed once it is written, at once without the flag.
func profileRound(b *testing.B, c *cluster.Cluster, prefix string, window time.Duration) <-chan struct{} {
	done := make(chan struct{})
	if *throughputProfile == "" {
		close(done)
		return done
	}
	go func() {
		defer close(done)
		data, err := c.SchedulerCPUProfile(context.Background(), window)
		if err == nil {
			err = os.WriteFile(filepath.Join(*throughputProfile, prefix+".pprof"), data, 0o644)
		}
		if err != nil {
			b.Errorf("profile of %s: %v", prefix, err)
		}
	}()
	return done
}

// watchBound returns a channel closed once n pods whose names start with prefix are bound, and
// watches until ctx ends. An informer, not a bare watch: it survives the apiserver ending a watch
// under load.
func watchBound(ctx context.Context, b *testing.B, client kubernetes.Interface, ns, prefix string, n int) <-chan struct{} {
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(ns))
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
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[len(s)/2]
}
