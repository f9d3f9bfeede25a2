//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/test/cluster"
)

// saturateNodes hollow kubelets of 8 × 80 GiB run each saturating burst: 2,560 GiB.
const saturateNodes = 4

// saturateMixes fill 62% of the nodes with pods of one or two sizes: ten 8 GiB pods fill a GPU,
// so equal sizes overflow onto the next GPU of a node while the last pod on the full one is still
// in flight, which is when the hold-back rule (docs/design.md, rule 2) makes a pod wait.
var saturateMixes = []struct {
	name  string
	sizes map[int64]int // units per pod: pods
}{
	{"8GiB", map[int64]int{8: 200}},
	{"8+12GiB", map[int64]int{8: 120, 12: 53}},
}

// BenchmarkSaturatingBurst measures what the hold-back rule costs when GPUs fill up: 4 hollow
// kubelets running our device plugin and the real kubelet device manager, each burst created at
// once (16 writers), through our extender and through gpushare-scheduler; and the same bursts in
// DRA mode (mode=dra: our DRA driver and the kubelet's DRA manager, each pod with a claim from a
// template of its size, allocated by kube-scheduler itself; kube-controller-manager runs, as it
// must there to make the claims; no record, so bound→assigned is 0 and assigned→Running holds
// Prepare; every round ends with an audit of the claims against the GPUs' memory). It reports pods per
// second to bound and to Running, create→Running p50 and p99, the p99 of each stage (create→bound:
// the scheduler and the hold-back; bound→assigned: kubelet admission, Allocate and the plugin's
// record; assigned→Running: the kubelet starting the containers), and how many filter refusals were
// hold-backs. The DRA mode runs in the four configurations of draBurstModes. Each configuration is
// one round on a fresh cluster. Run:
//
//	go test -tags e2e -run '^$' -bench SaturatingBurst -benchtime 1x -timeout 30m ./test/e2e/
func BenchmarkSaturatingBurst(b *testing.B) {
	klog.SetLogger(logr.Discard())
	b.Cleanup(klog.ClearLogger)
	for _, mode := range []struct {
		name  string
		start func(testing.TB) *systemBed
	}{{"extender", startSystem}, {"plugin", startPluginSystem}} {
		b.Run("mode="+mode.name, func(b *testing.B) {
			for _, mix := range saturateMixes {
				b.Run("pods="+mix.name, func(b *testing.B) {
					bed := mode.start(b)
					// No controller-manager, as when docs/benchmarks.md's figures were measured.
					bed.c.StopControllerManager()
					bed.kubeletAPILimits = true // measured as a real kubelet runs
					for i := range saturateNodes {
						bed.addNode(b, fmt.Sprintf("sat-%d", i), "simulated:dgxh100")
					}
					for round := range b.N {
						bed.saturate(b, fmt.Sprintf("r%d", round), mix.sizes).report(b)
					}
				})
			}
		})
	}
	for _, mode := range draBurstModes {
		b.Run("mode="+mode.name, func(b *testing.B) {
			for _, mix := range saturateMixes {
				b.Run("pods="+mix.name, func(b *testing.B) {
					bed := startDRABurstBed(b, mode.scored, mode.kcmAtSchedulerQPS)
					for i := range saturateNodes {
						bed.addNode(b, fmt.Sprintf("sat-%d", i), "simulated:dgxh100", nil)
					}
					burst := bed.saturate
					if mode.webhook {
						burst = bed.webhookBurst(b)
					}
					for round := range b.N {
						burst(b, fmt.Sprintf("r%d", round), mix.sizes).report(b)
					}
				})
			}
		})
	}
}

// draBurstModes are the saturating burst's DRA configurations, each with kube-scheduler at the
// device-plugin modes' client limits (QPS 500, burst 1000): pods naming a claim template of their
// size (dra); gpu-mem pods as written for device-plugin mode, translated by gpushare-webhook
// (dra-webhook); template pods with kube-controller-manager at the scheduler's client limits
// instead of its default 20 queries a second (dra-kcm-qps); and those with gpushare-scheduler,
// whose DRA score rates the nodes for each claim (dra-scored).
var draBurstModes = []struct {
	name              string
	webhook, scored   bool
	kcmAtSchedulerQPS bool
}{
	{name: "dra"},
	{name: "dra-webhook", webhook: true},
	{name: "dra-kcm-qps", kcmAtSchedulerQPS: true},
	{name: "dra-scored", scored: true, kcmAtSchedulerQPS: true},
}

// startDRABurstBed starts a DRA bed whose kubelets run at the real kubelet's API limits, with
// kube-scheduler (gpushare-scheduler when scored) at client QPS 500 and kube-controller-manager at
// its default limits or, with kcmAtSchedulerQPS, at the scheduler's.
func startDRABurstBed(b *testing.B, scored, kcmAtSchedulerQPS bool) *draBed {
	b.Helper()
	sched := cluster.SchedulerConfig{ClientQPS: 500, ClientBurst: 1000}
	var dir string
	if scored {
		sched, dir = pluginScheduler(b)
	}
	c := cluster.StartT(b, cluster.Config{NoScheduler: true, NoControllerManager: kcmAtSchedulerQPS})
	bed := &draBed{c: c, client: c.Client(), nodes: map[string]*draNode{}, claimNS: "default", kubeletAPILimits: true}
	applyDRAObjects(b, c)
	if scored {
		grantPluginRole(b, c, dir)
	}
	if kcmAtSchedulerQPS {
		limits := []string{fmt.Sprintf("--kube-api-qps=%g", sched.ClientQPS), fmt.Sprintf("--kube-api-burst=%d", sched.ClientBurst)}
		if err := c.StartControllerManager(b.Context(), limits...); err != nil {
			b.Fatal(err)
		}
	}
	if err := c.StartScheduler(b.Context(), sched); err != nil {
		b.Fatal(err)
	}
	return bed
}

// webhookBurst opts the bed's claim namespace in to gpushare-webhook, starts the webhook with its
// shipped RBAC and configuration, and returns a burst of gpu-mem pods as written for device-plugin
// mode (units per pod: pods), which the webhook translates into claims.
func (b *draBed) webhookBurst(tb testing.TB) func(testing.TB, string, map[int64]int) *burstTimes {
	tb.Helper()
	ns, err := b.client.CoreV1().Namespaces().Get(tb.Context(), b.claimNS, metav1.GetOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	metav1.SetMetaDataLabel(&ns.ObjectMeta, gpushare.LabelNamespaceDRA, gpushare.LabelValueDRA)
	if _, err := b.client.CoreV1().Namespaces().Update(tb.Context(), ns, metav1.UpdateOptions{}); err != nil {
		tb.Fatal(err)
	}
	web := startWebhook(tb, b.c, slices.Min(slices.Collect(maps.Keys(b.nodes))))
	web.waitServing(tb, b.c, b.claimNS)
	return func(tb testing.TB, prefix string, sizes map[int64]int) *burstTimes {
		return b.burst(tb, gpuMemBurst(prefix, sizes))
	}
}

// burstTimes is when each pod of a burst was created, bound, assigned by the plugin and Running.
type burstTimes struct {
	began                               time.Time
	created, bound, assigned, runningAt map[string]time.Time
	held                                map[string]int // hold-back refusals by pod
}

// saturate creates the burst, waits for every pod to run with its record, then deletes it.
func (b *systemBed) saturate(tb testing.TB, prefix string, sizes map[int64]int) *burstTimes {
	tb.Helper()
	pods := gpuMemBurst(prefix, sizes)
	rec := watchBurst(tb, b.client, pods, false)
	times := rec.create(tb, b.client, pods)
	rec.wait(tb, systemWait)
	times.held = map[string]int{}
	for name, n := range b.heldBack(tb) {
		if _, ours := times.created[name]; ours {
			times.held[name] = n
		}
	}
	b.deleteBurst(tb, pods)
	return times
}

// gpuMemBurst is a burst of single-container gpu-mem pods as a user writes them (units per pod:
// pods), named by prefix, size and number.
func gpuMemBurst(prefix string, sizes map[int64]int) []*corev1.Pod {
	var pods []*corev1.Pod
	for _, units := range slices.Sorted(maps.Keys(sizes)) {
		for i := range sizes[units] {
			pods = append(pods, sysPod{name: fmt.Sprintf("%s-%02d-%03d", prefix, units, i), sizes: []int64{units}}.object())
		}
	}
	return pods
}

// burstRecorder notes, from a watch, the moment each pod of a burst is bound, assigned and Running.
type burstRecorder struct {
	// recordless: the pods get no gpushare record (DRA mode), so "assigned" is when they are
	// bound and a pod is done once Running.
	recordless bool
	mu         sync.Mutex
	times      *burstTimes
	left       int           // pods not yet Running with their record
	done       chan struct{} // closed when left reaches 0
	stop       context.CancelFunc
}

// watchBurst starts watching the namespace's pods for the burst's names.
func watchBurst(tb testing.TB, client kubernetes.Interface, pods []*corev1.Pod, recordless bool) *burstRecorder {
	tb.Helper()
	r := &burstRecorder{recordless: recordless,
		times: &burstTimes{created: map[string]time.Time{}, bound: map[string]time.Time{}, assigned: map[string]time.Time{}, runningAt: map[string]time.Time{}},
		left:  len(pods), done: make(chan struct{}),
	}
	for _, p := range pods {
		r.times.created[p.Name] = time.Time{}
	}
	ctx, cancel := context.WithCancel(tb.Context())
	r.stop = cancel
	tb.Cleanup(cancel)
	f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace("default"))
	inf := f.Core().V1().Pods().Informer()
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { r.see(obj) },
		UpdateFunc: func(_, obj any) { r.see(obj) },
	}); err != nil {
		tb.Fatal(err)
	}
	f.Start(ctx.Done())
	if !toolscache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		tb.Fatal("the burst's pod watch did not sync")
	}
	return r
}

// see notes the first moment pod obj is bound, assigned and Running.
func (r *burstRecorder) see(obj any) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ours := r.times.created[p.Name]; !ours {
		return
	}
	first := func(m map[string]time.Time, cond bool) {
		if _, seen := m[p.Name]; cond && !seen {
			m[p.Name] = now
		}
	}
	_, wasDone := r.times.runningAt[p.Name]
	wasDone = wasDone && !r.times.assigned[p.Name].IsZero()
	first(r.times.bound, p.Spec.NodeName != "")
	first(r.times.assigned, p.Annotations[gpushare.AnnotationAssigned] == "true" || (r.recordless && p.Spec.NodeName != ""))
	first(r.times.runningAt, p.Status.Phase == corev1.PodRunning)
	_, isRunning := r.times.runningAt[p.Name]
	if !wasDone && isRunning && !r.times.assigned[p.Name].IsZero() {
		r.left--
		if r.left == 0 {
			close(r.done)
		}
	}
}

// create creates the pods with 16 writers, noting when each was sent.
func (r *burstRecorder) create(tb testing.TB, client kubernetes.Interface, pods []*corev1.Pod) *burstTimes {
	tb.Helper()
	r.mu.Lock()
	r.times.began = time.Now()
	r.mu.Unlock()
	work := make(chan *corev1.Pod)
	errs := make(chan error, len(pods))
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for p := range work {
				sent := time.Now()
				if _, err := client.CoreV1().Pods("default").Create(tb.Context(), p, metav1.CreateOptions{}); err != nil {
					errs <- fmt.Errorf("create %s: %w", p.Name, err)
					continue
				}
				r.mu.Lock()
				r.times.created[p.Name] = sent
				r.mu.Unlock()
			}
		})
	}
	for _, p := range pods {
		work <- p
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		tb.Fatal(err)
	}
	return r.times
}

// wait returns once every pod runs with its record, failing tb after timeout.
func (r *burstRecorder) wait(tb testing.TB, timeout time.Duration) {
	tb.Helper()
	defer r.stop()
	select {
	case <-r.done:
	case <-time.After(timeout):
		r.mu.Lock()
		defer r.mu.Unlock()
		tb.Fatalf("after %v, %d of %d pods are not Running with their record", timeout, r.left, len(r.times.created))
	}
}

// deleteBurst deletes the pods at once and waits until the API server has none of them, so the
// next round starts on empty GPUs.
func (b *systemBed) deleteBurst(tb testing.TB, pods []*corev1.Pod) {
	tb.Helper()
	zero := int64(0)
	for _, p := range pods {
		err := b.client.CoreV1().Pods("default").Delete(tb.Context(), p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		if err != nil && !apierrors.IsNotFound(err) {
			tb.Fatal(err)
		}
	}
	err := cluster.Poll(tb.Context(), waitLong, "the burst's pods are gone", func(ctx context.Context) (bool, error) {
		l, err := b.client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		return len(l.Items) == 0, nil
	})
	if err != nil {
		tb.Fatal(err)
	}
}

// report turns the round's times into the benchmark's metrics.
func (t *burstTimes) report(b *testing.B) {
	var toRun, toBind, toAssign, toStart, bindHeld, bindOther []time.Duration
	refusals := 0
	var lastBound, lastRunning time.Time
	for name, created := range t.created {
		bound, assigned, running := t.bound[name], t.assigned[name], t.runningAt[name]
		toRun = append(toRun, running.Sub(created))
		toBind = append(toBind, bound.Sub(created))
		if n := t.held[name]; n > 0 {
			bindHeld, refusals = append(bindHeld, bound.Sub(created)), refusals+n
		} else {
			bindOther = append(bindOther, bound.Sub(created))
		}
		toAssign = append(toAssign, assigned.Sub(bound))
		toStart = append(toStart, running.Sub(assigned))
		lastBound, lastRunning = latest(lastBound, bound), latest(lastRunning, running)
	}
	n := float64(len(t.created))
	b.ReportMetric(n/lastBound.Sub(t.began).Seconds(), "pods/s-bound")
	b.ReportMetric(n/lastRunning.Sub(t.began).Seconds(), "pods/s-running")
	b.ReportMetric(quantile(toRun, 0.5).Seconds(), "p50-s")
	b.ReportMetric(quantile(toRun, 0.99).Seconds(), "p99-s")
	b.ReportMetric(quantile(toBind, 0.99).Seconds(), "p99-bind-s")
	b.ReportMetric(quantile(toAssign, 0.99).Seconds(), "p99-assign-s")
	b.ReportMetric(quantile(toStart, 0.99).Seconds(), "p99-start-s")
	b.ReportMetric(quantile(bindHeld, 0.99).Seconds(), "p99-bind-held-s")
	b.ReportMetric(quantile(bindOther, 0.99).Seconds(), "p99-bind-other-s")
	b.ReportMetric(float64(len(bindHeld)), "pods-held")
	b.ReportMetric(float64(refusals), "holdbacks")
	b.ReportMetric(0, "ns/op") // the figures above are the result; wall time per round is not
}

func latest(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// quantile is the q-quantile of ds by the nearest rank.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(ds))
	return s[min(len(s)-1, int(q*float64(len(s))))]
}
