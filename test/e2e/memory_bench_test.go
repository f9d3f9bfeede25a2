//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/gpushare/gpushare/extender/cache"
	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/test/cluster"
)

const (
	memoryNodes       = 5000
	memoryGPUsPerNode = 8
	memoryGPUUnits    = 80 // GiB units per GPU
	memoryPodsPerNode = 10
	memoryNamespaces  = 10
	memoryReplicas    = 50 // pods per ReplicaSet
	memoryWriters     = 32
	memoryApplier     = "bench-deployer" // the field manager of every pod
	// memoryHeapProfileEnv names a file to write the extender's heap profile to, after the RSS is
	// read. The extender then also runs with -debug-listen, which adds a listener and nothing else.
	memoryHeapProfileEnv = "GPUSHARE_BENCH_HEAP_PROFILE"
)

// BenchmarkExtenderMemory measures the resident memory of the shipped extender binary, run with
// its default flags, holding a large cluster: 5,000 GPU nodes (8 × 80 GiB, as the device plugin
// publishes them) and 50,000 pods already bound to them with our assignment annotations, 10 per
// node, in 10 namespaces. The pods are what a real cluster's pods look like to the extender's
// watch: created by server-side apply (so they carry managedFields), three containers with
// environments, probes, resources and volume mounts, three volumes (configMap, emptyDir, the
// projected service-account volume), labels, an owner ReplicaSet and annotations besides ours.
// They have no status beyond the API server's defaults: no kubelet runs for these nodes.
//
// Once the extender reports ready (every pod in its cache), the RSS is read from
// /proc/<pid>/status when it no longer moves (within 1% over 10 s): rss-MiB, and VmHWM, the peak
// of the whole run (initial LIST included), as peak-rss-MiB. heap-inuse-MiB is the Go heap in
// use, from the extender's own /metrics, and sync-s the time from start to ready. The extender's
// inspect endpoint must then show every node and every pod charged, so the figure is that of a
// correct cache. Each iteration starts the extender afresh on the same cluster. Set
// GPUSHARE_BENCH_HEAP_PROFILE=FILE to save its heap profile (go tool pprof FILE). Run:
//
//	go test -tags e2e -run '^$' -bench ExtenderMemory -benchtime 1x -count 1 -timeout 30m ./test/e2e/
func BenchmarkExtenderMemory(b *testing.B) {
	klog.SetLogger(logr.Discard())
	b.Cleanup(klog.ClearLogger)
	ctx := context.Background()
	bin, err := cluster.OwnBinaries(b.TempDir(), false)
	if err != nil {
		b.Fatal(err)
	}
	// No controller-manager: the pods name ReplicaSets that do not exist, which its garbage
	// collector would delete.
	c := cluster.StartT(b, cluster.Config{NoScheduler: true, NoControllerManager: true})

	start := time.Now()
	if err := c.CreateNodes(ctx, memoryNodeSpecs(b)); err != nil {
		b.Fatal(err)
	}
	b.Logf("created %d nodes in %s", memoryNodes, time.Since(start).Round(time.Millisecond))

	cfg := c.RESTConfig()
	cfg.QPS, cfg.Burst = 10000, 20000
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	for ns := range memoryNamespaces {
		nsObj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: memoryNamespace(ns)}}
		if _, err := client.CoreV1().Namespaces().Create(ctx, nsObj, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	start = time.Now()
	wantUnits, err := applyBoundPods(ctx, client)
	if err != nil {
		b.Fatal(err)
	}
	created := time.Since(start)
	b.Logf("applied %d bound pods (%d GiB units) in %s, %.0f pods/s, %d writers",
		memoryNodes*memoryPodsPerNode, wantUnits, created.Round(time.Millisecond),
		float64(memoryNodes*memoryPodsPerNode)/created.Seconds(), memoryWriters)
	sample, err := client.CoreV1().Pods(memoryNamespace(0)).Get(ctx, memoryPodName(0), metav1.GetOptions{})
	if err != nil {
		b.Fatal(err)
	}
	if len(sample.ManagedFields) == 0 {
		b.Fatalf("pod %s has no managedFields", sample.Name)
	}
	if raw, err := json.Marshal(sample); err == nil {
		b.Logf("one pod as the API server serves it: %d bytes of JSON, of which managedFields %d", len(raw), managedFieldsSize(sample))
	}

	var rss, peak, heap, ready []float64
	for i := 0; i < b.N; i++ {
		m := measureExtenderMemory(b, c, bin, i, wantUnits)
		rss, peak, heap, ready = append(rss, m.rssMiB), append(peak, m.peakMiB), append(heap, m.heapMiB), append(ready, m.sync.Seconds())
	}
	b.ReportMetric(median(rss), "rss-MiB")
	b.ReportMetric(median(peak), "peak-rss-MiB")
	b.ReportMetric(median(heap), "heap-inuse-MiB")
	b.ReportMetric(median(ready), "sync-s")
	b.ReportMetric(0, "ns/op") // the memory is the result; wall time per round is not
}

// extenderMemory is one start of the extender, measured.
type extenderMemory struct {
	rssMiB, peakMiB, heapMiB float64
	sync                     time.Duration
}

// measureExtenderMemory starts the extender on the populated cluster, waits for it to be ready and
// its RSS to settle, reads its memory, checks its cache against what was created and stops it.
func measureExtenderMemory(b *testing.B, c *cluster.Cluster, bin string, round int, wantUnits uint64) extenderMemory {
	port := freeLoopbackPort(b)
	base := "http://127.0.0.1:" + port
	args := []string{"-listen", "127.0.0.1:" + port, "-kubeconfig", c.AdminKubeconfig()}
	profile := os.Getenv(memoryHeapProfileEnv)
	var debugBase string
	if profile != "" {
		debugPort := freeLoopbackPort(b)
		debugBase = "http://127.0.0.1:" + debugPort
		args = append(args, "-debug-listen", "127.0.0.1:"+debugPort)
	}
	start := time.Now()
	prog, err := c.StartProgram(fmt.Sprintf("%s-%d", extenderProcess, round), filepath.Join(bin, "gpushare-scheduler-extender"), args)
	if err != nil {
		b.Fatal(err)
	}
	defer prog.Stop(10 * time.Second)
	if err := cluster.Poll(context.Background(), 5*time.Minute, "extender ready", func(ctx context.Context) (bool, error) {
		if !prog.Running() {
			return false, fmt.Errorf("the extender exited:\n%s", prog.LogTail(20))
		}
		ok, _ := httpGetOK(http.DefaultClient, base+"/readyz") // refused until it listens, 503 until synced
		return ok, nil
	}); err != nil {
		b.Fatal(err)
	}
	m := extenderMemory{sync: time.Since(start)}

	// Settled: the samples of the last 10 s lie within 1% of each other. The garbage of the
	// initial LIST is collected and its pages handed back gradually, so the RSS falls for a while
	// after ready.
	const window, tolerance = 10 * time.Second, 0.01
	type sample struct {
		at  time.Time
		rss uint64
	}
	var samples []sample
	var current, hwm uint64
	if err := cluster.Poll(context.Background(), 3*time.Minute, "extender RSS stable", func(context.Context) (bool, error) {
		cur, pk, err := prog.RSS()
		if err != nil {
			return false, err
		}
		now := time.Now()
		current, hwm = cur, pk
		samples = append(samples, sample{now, cur})
		for len(samples) > 1 && now.Sub(samples[1].at) >= window {
			samples = samples[1:]
		}
		if now.Sub(samples[0].at) < window {
			return false, nil
		}
		lo, hi := cur, cur
		for _, s := range samples {
			lo, hi = min(lo, s.rss), max(hi, s.rss)
		}
		return float64(hi-lo) <= tolerance*float64(hi), nil
	}); err != nil {
		b.Fatalf("%v; last RSS %d MiB", err, current>>20)
	}
	m.rssMiB, m.peakMiB = float64(current)/(1<<20), float64(hwm)/(1<<20)
	settled := time.Since(start) - m.sync

	// What the runtime says of itself, read after the RSS so that neither request is in it.
	stats, err := scrapeGoMemStats(base + "/metrics")
	if err != nil {
		b.Fatal(err)
	}
	m.heapMiB = stats["go_memstats_heap_inuse_bytes"] / (1 << 20)
	b.Logf("extender %d: ready after %s, RSS settled %s later: RSS %.1f MiB, peak %.1f MiB; Go heap in use %.1f MiB, "+
		"allocated %.1f MiB, next GC at %.1f MiB, heap idle %.1f MiB (released %.1f), runtime total %.1f MiB",
		round, m.sync.Round(time.Millisecond), settled.Round(time.Millisecond), m.rssMiB, m.peakMiB, m.heapMiB,
		stats["go_memstats_heap_alloc_bytes"]/(1<<20), stats["go_memstats_next_gc_bytes"]/(1<<20),
		stats["go_memstats_heap_idle_bytes"]/(1<<20), stats["go_memstats_heap_released_bytes"]/(1<<20),
		stats["go_memstats_sys_bytes"]/(1<<20))
	if profile != "" {
		if err := saveHeapProfile(debugBase+"/debug/pprof/heap", profile); err != nil {
			b.Fatal(err)
		}
		b.Logf("heap profile in %s", profile)
	}
	checkMemoryInspect(b, base, wantUnits)
	return m
}

// checkMemoryInspect asks the extender for its view of the cluster and fails unless every node
// and every pod created is in it with the units it was created with.
func checkMemoryInspect(b *testing.B, base string, wantUnits uint64) {
	resp, err := http.Get(base + gpushare.ExtenderURLPrefix + "/inspect")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b.Fatalf("inspect: %s", resp.Status)
	}
	var in cache.Inspect
	if err := json.NewDecoder(resp.Body).Decode(&in); err != nil {
		b.Fatal(err)
	}
	var pods int
	var used, total uint64
	for _, n := range in.Nodes {
		if n.UsedGPU != wantUnits/memoryNodes {
			b.Errorf("node %s: %d units used, want %d", n.Name, n.UsedGPU, wantUnits/memoryNodes)
		}
		used += n.UsedGPU
		total += n.TotalGPU
		for _, d := range n.Devs {
			pods += len(d.Pods)
		}
	}
	b.Logf("inspect: %d nodes, %d pod charges, %d of %d GiB units used", len(in.Nodes), pods, used, total)
	if len(in.Nodes) != memoryNodes || pods != memoryNodes*memoryPodsPerNode || used != wantUnits ||
		total != memoryNodes*memoryGPUsPerNode*memoryGPUUnits {
		b.Fatalf("inspect: %d nodes, %d pod charges, %d of %d units used; want %d nodes, %d pods, %d of %d units",
			len(in.Nodes), pods, used, total, memoryNodes, memoryNodes*memoryPodsPerNode, wantUnits,
			memoryNodes*memoryGPUsPerNode*memoryGPUUnits)
	}
}

// memoryNodeSpecs are the GPU nodes: capacity, GPU count and the per-GPU annotation as our device
// plugin publishes them, and the gpushare label.
func memoryNodeSpecs(b *testing.B) []cluster.NodeSpec {
	specs := make([]cluster.NodeSpec, memoryNodes)
	for i := range specs {
		gpus := gpushare.NodeGPUs{Unit: gpushare.GiB}
		for g := range memoryGPUsPerNode {
			gpus.GPUs = append(gpus.GPUs, gpushare.GPUInfo{
				Index: g, UUID: fmt.Sprintf("GPU-%08x-%04x-4%03x-8%03x-%012x", i, g, i%4096, g, i*memoryGPUsPerNode+g),
				Model: "NVIDIA H100 80GB HBM3", Units: memoryGPUUnits, Healthy: true,
			})
		}
		desc, err := gpushare.EncodeNodeGPUs(gpus)
		if err != nil {
			b.Fatal(err)
		}
		specs[i] = cluster.NodeSpec{
			Name:        memoryNodeName(i),
			Labels:      map[string]string{gpushare.LabelGPUShare: gpushare.LabelValueTrue},
			Annotations: map[string]string{gpushare.AnnotationNodeGPUs: desc},
			Resources: map[corev1.ResourceName]int64{
				gpushare.ResourceName:  memoryGPUsPerNode * memoryGPUUnits,
				gpushare.ResourceCount: memoryGPUsPerNode,
			},
		}
	}
	return specs
}

func memoryNodeName(i int) string   { return fmt.Sprintf("gpu-%04d", i) }
func memoryNamespace(i int) string  { return fmt.Sprintf("team-%d", i) }
func memoryReplicaSet(i int) string { return fmt.Sprintf("trainer-%03d-6d9f7c5b%02x", i, i%256) }

// memoryPodName is the name of pod i, one of the memoryReplicas pods of ReplicaSet i/memoryReplicas,
// which lives in namespace memoryNamespace(i/memoryReplicas % memoryNamespaces).
func memoryPodName(i int) string {
	return fmt.Sprintf("%s-%05x", memoryReplicaSet(i/memoryReplicas), i)
}

// memoryPodPlacement is where pod i goes and what it holds: pod k of a node on GPU k mod 8 with
// k mod 8 + 1 units, so pods 8 and 9 share GPUs 0 and 1 with pods 0 and 1 and no GPU is
// over-committed (at most 4 of its 80 units).
func memoryPodPlacement(i int) (node string, gpu int, units uint64) {
	k := i % memoryPodsPerNode
	gpu = k % memoryGPUsPerNode
	return memoryNodeName(i / memoryPodsPerNode), gpu, uint64(gpu + 1)
}

// applyBoundPods creates every pod by server-side apply from memoryWriters writers and returns
// the units they hold in all.
func applyBoundPods(ctx context.Context, client kubernetes.Interface) (uint64, error) {
	total := memoryNodes * memoryPodsPerNode
	assumed := time.Now().UnixNano()
	err := cluster.Parallel(ctx, memoryWriters, total, func(ctx context.Context, i int) error {
		pod, err := memoryPod(i, assumed)
		if err == nil {
			_, err = client.CoreV1().Pods(*pod.Namespace).Apply(ctx, pod, metav1.ApplyOptions{FieldManager: memoryApplier, Force: true})
		}
		if err != nil {
			return fmt.Errorf("apply pod %d: %w", i, err)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	var units uint64
	for i := range total {
		_, _, u := memoryPodPlacement(i)
		units += u
	}
	return units, nil
}

// memoryPod is pod i as a ReplicaSet of a training Deployment would have it: a trainer holding the
// GPU memory, a metrics exporter and a log shipper, the service-account volume the API server's
// admission would have injected, and our assignment annotations, bound to its node.
func memoryPod(i int, assumed int64) (*corev1ac.PodApplyConfiguration, error) {
	node, gpu, units := memoryPodPlacement(i)
	rs := i / memoryReplicas
	rsName := memoryReplicaSet(rs)
	hash := rsName[strings.LastIndexByte(rsName, '-')+1:]
	name := memoryPodName(i)
	ns := memoryNamespace(rs % memoryNamespaces)
	annotations, err := gpushare.PodAssignment{
		GPUIndex: gpu, PodUnits: units, DevUnits: memoryGPUUnits, Assigned: true, AssumeTime: assumed,
	}.Encode()
	if err != nil {
		return nil, err
	}
	annotations["prometheus.io/scrape"] = "true"
	annotations["prometheus.io/port"] = "9090"
	annotations["kubectl.kubernetes.io/default-container"] = "trainer"

	env := func(container string, extra ...*corev1ac.EnvVarApplyConfiguration) []*corev1ac.EnvVarApplyConfiguration {
		field := func(name, path string) *corev1ac.EnvVarApplyConfiguration {
			return corev1ac.EnvVar().WithName(name).WithValueFrom(corev1ac.EnvVarSource().
				WithFieldRef(corev1ac.ObjectFieldSelector().WithAPIVersion("v1").WithFieldPath(path)))
		}
		out := []*corev1ac.EnvVarApplyConfiguration{
			field("POD_NAME", "metadata.name"),
			field("POD_NAMESPACE", "metadata.namespace"),
			field("NODE_NAME", "spec.nodeName"),
			field("POD_IP", "status.podIP"),
			corev1ac.EnvVar().WithName("CONTAINER").WithValue(container),
			corev1ac.EnvVar().WithName("LOG_LEVEL").WithValue("info"),
			corev1ac.EnvVar().WithName("LOG_FORMAT").WithValue("json"),
		}
		return append(out, extra...)
	}
	mounts := func(extra ...*corev1ac.VolumeMountApplyConfiguration) []*corev1ac.VolumeMountApplyConfiguration {
		return append([]*corev1ac.VolumeMountApplyConfiguration{
			corev1ac.VolumeMount().WithName("config").WithMountPath("/etc/trainer").WithReadOnly(true),
			corev1ac.VolumeMount().WithName("kube-api-access").WithMountPath("/var/run/secrets/kubernetes.io/serviceaccount").WithReadOnly(true),
		}, extra...)
	}
	httpProbe := func(path string, port int32, delay int32) *corev1ac.ProbeApplyConfiguration {
		return corev1ac.Probe().WithHTTPGet(corev1ac.HTTPGetAction().WithPath(path).WithPort(intstr.FromInt32(port)).WithScheme(corev1.URISchemeHTTP)).
			WithInitialDelaySeconds(delay).WithPeriodSeconds(10).WithTimeoutSeconds(3).WithFailureThreshold(3).WithSuccessThreshold(1)
	}
	resources := func(cpu, mem, cpuLimit, memLimit string) *corev1ac.ResourceRequirementsApplyConfiguration {
		return corev1ac.ResourceRequirements().
			WithRequests(corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem)}).
			WithLimits(corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpuLimit), corev1.ResourceMemory: resource.MustParse(memLimit)})
	}
	trainerRes := resources("4", "16Gi", "8", "32Gi")
	(*trainerRes.Limits)[gpushare.ResourceName] = *resource.NewQuantity(int64(units), resource.DecimalSI)

	trainer := corev1ac.Container().WithName("trainer").WithImage("registry.example.com/ml/trainer:2.14.1").
		WithImagePullPolicy(corev1.PullIfNotPresent).
		WithCommand("python", "-m", "trainer.serve").
		WithArgs("--config=/etc/trainer/config.yaml", "--scratch=/scratch", "--port=8080").
		WithPorts(corev1ac.ContainerPort().WithName("http").WithContainerPort(8080).WithProtocol(corev1.ProtocolTCP)).
		WithEnv(env("trainer",
			corev1ac.EnvVar().WithName("MODEL_NAME").WithValue(fmt.Sprintf("llama-%d", rs%7)),
			corev1ac.EnvVar().WithName("BATCH_SIZE").WithValue("32"),
			corev1ac.EnvVar().WithName("OMP_NUM_THREADS").WithValue("4"))...).
		WithResources(trainerRes).
		WithVolumeMounts(mounts(corev1ac.VolumeMount().WithName("scratch").WithMountPath("/scratch"))...).
		WithLivenessProbe(httpProbe("/healthz", 8080, 30)).
		WithReadinessProbe(httpProbe("/ready", 8080, 5)).
		WithTerminationMessagePath("/dev/termination-log").WithTerminationMessagePolicy(corev1.TerminationMessageReadFile)
	exporter := corev1ac.Container().WithName("metrics-exporter").WithImage("registry.example.com/obs/exporter:0.9.3").
		WithImagePullPolicy(corev1.PullIfNotPresent).
		WithArgs("--listen=:9090", "--scrape=http://127.0.0.1:8080/metrics").
		WithPorts(corev1ac.ContainerPort().WithName("metrics").WithContainerPort(9090).WithProtocol(corev1.ProtocolTCP)).
		WithEnv(env("metrics-exporter",
			corev1ac.EnvVar().WithName("SCRAPE_INTERVAL").WithValue("15s"),
			corev1ac.EnvVar().WithName("TARGET").WithValue("http://127.0.0.1:8080/metrics"),
			corev1ac.EnvVar().WithName("GOMAXPROCS").WithValue("1"))...).
		WithResources(resources("100m", "128Mi", "500m", "256Mi")).
		WithVolumeMounts(mounts()...).
		WithLivenessProbe(httpProbe("/healthz", 9090, 10)).
		WithReadinessProbe(corev1ac.Probe().WithTCPSocket(corev1ac.TCPSocketAction().WithPort(intstr.FromInt32(9090))).WithPeriodSeconds(10)).
		WithTerminationMessagePath("/dev/termination-log").WithTerminationMessagePolicy(corev1.TerminationMessageReadFile)
	shipper := corev1ac.Container().WithName("log-shipper").WithImage("registry.example.com/obs/fluent-bit:3.2.4").
		WithImagePullPolicy(corev1.PullIfNotPresent).
		WithEnv(env("log-shipper",
			corev1ac.EnvVar().WithName("FLUENT_HOST").WithValue("logs.observability.svc"),
			corev1ac.EnvVar().WithName("FLUENT_PORT").WithValue("24224"),
			corev1ac.EnvVar().WithName("BUFFER_SIZE").WithValue("5MB"))...).
		WithResources(resources("50m", "64Mi", "200m", "128Mi")).
		WithVolumeMounts(mounts(corev1ac.VolumeMount().WithName("scratch").WithMountPath("/scratch").WithReadOnly(true))...).
		WithLivenessProbe(corev1ac.Probe().WithExec(corev1ac.ExecAction().WithCommand("/bin/sh", "-c", "pgrep fluent-bit")).WithPeriodSeconds(30)).
		WithReadinessProbe(httpProbe("/api/v1/health", 2020, 5)).
		WithTerminationMessagePath("/dev/termination-log").WithTerminationMessagePolicy(corev1.TerminationMessageReadFile)

	volumes := []*corev1ac.VolumeApplyConfiguration{
		corev1ac.Volume().WithName("config").WithConfigMap(corev1ac.ConfigMapVolumeSource().WithName("trainer-config").WithDefaultMode(0o644)),
		corev1ac.Volume().WithName("scratch").WithEmptyDir(corev1ac.EmptyDirVolumeSource().WithSizeLimit(resource.MustParse("50Gi"))),
		corev1ac.Volume().WithName("kube-api-access").WithProjected(corev1ac.ProjectedVolumeSource().WithDefaultMode(0o644).WithSources(
			corev1ac.VolumeProjection().WithServiceAccountToken(corev1ac.ServiceAccountTokenProjection().WithExpirationSeconds(3607).WithPath("token")),
			corev1ac.VolumeProjection().WithConfigMap(corev1ac.ConfigMapProjection().WithName("kube-root-ca.crt").
				WithItems(corev1ac.KeyToPath().WithKey("ca.crt").WithPath("ca.crt"))),
			corev1ac.VolumeProjection().WithDownwardAPI(corev1ac.DownwardAPIProjection().WithItems(
				corev1ac.DownwardAPIVolumeFile().WithPath("namespace").
					WithFieldRef(corev1ac.ObjectFieldSelector().WithAPIVersion("v1").WithFieldPath("metadata.namespace")))),
		)),
	}

	return corev1ac.Pod(name, ns).
		WithLabels(map[string]string{
			"app": fmt.Sprintf("trainer-%03d", rs), "version": "v2.14.1", "pod-template-hash": hash,
			"team": ns, "app.kubernetes.io/part-of": "training-platform",
		}).
		WithAnnotations(annotations).
		WithOwnerReferences(metav1ac.OwnerReference().WithAPIVersion("apps/v1").WithKind("ReplicaSet").
			WithName(rsName).WithUID(types.UID(fmt.Sprintf("5f0c6a2e-%04x-4e1b-9d3c-%012x", rs%65536, rs))).
			WithController(true).WithBlockOwnerDeletion(true)).
		WithSpec(corev1ac.PodSpec().
			WithNodeName(node).
			WithServiceAccountName("trainer").
			WithRestartPolicy(corev1.RestartPolicyAlways).
			WithTerminationGracePeriodSeconds(30).
			WithDNSPolicy(corev1.DNSClusterFirst).
			WithSecurityContext(corev1ac.PodSecurityContext().WithFSGroup(1000).WithRunAsNonRoot(true).WithRunAsUser(1000)).
			WithTolerations(
				corev1ac.Toleration().WithKey("nvidia.com/gpu").WithOperator(corev1.TolerationOpExists).WithEffect(corev1.TaintEffectNoSchedule),
				corev1ac.Toleration().WithKey("node.kubernetes.io/not-ready").WithOperator(corev1.TolerationOpExists).
					WithEffect(corev1.TaintEffectNoExecute).WithTolerationSeconds(300)).
			WithContainers(trainer, exporter, shipper).
			WithVolumes(volumes...)), nil
}

func managedFieldsSize(p *corev1.Pod) int {
	raw, err := json.Marshal(p.ManagedFields)
	if err != nil {
		return 0
	}
	return len(raw)
}

// scrapeGoMemStats reads the go_memstats_* gauges of a Prometheus text endpoint.
func scrapeGoMemStats(url string) (map[string]float64, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if !ok || !strings.HasPrefix(name, "go_memstats_") {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: %q: %w", url, sc.Text(), err)
		}
		out[name] = v
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if _, ok := out["go_memstats_heap_inuse_bytes"]; !ok {
		return nil, fmt.Errorf("%s has no go_memstats_heap_inuse_bytes", url)
	}
	return out, nil
}

func saveHeapProfile(url, path string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
