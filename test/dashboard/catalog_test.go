package dashboard

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/extender/app"
	"github.com/gpushare/gpushare/extender/cache"
	"github.com/gpushare/gpushare/extender/preempt"
	"github.com/gpushare/gpushare/extender/server"
	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/manager"
	"github.com/gpushare/gpushare/plugin/nvml"
	"github.com/gpushare/gpushare/plugin/usage"
	"github.com/gpushare/gpushare/plugin/usage/cgroup"
)

// catalog maps every series name a program exports (histograms' _bucket,
// _sum and _count, not their bare name, which no series carries) to the
// program that exports it.
type catalog map[string]string

// exported builds the catalog once per test binary: starting the extender
// is the slow part, and every test reads the same registries.
var exported = sync.OnceValues(buildCatalog)

func buildCatalog() (catalog, error) {
	c := catalog{}
	run, err := extenderRunFamilies()
	if err != nil {
		return nil, fmt.Errorf("extender (app.Run): %w", err)
	}
	c.add("extender", run)
	// app.Run serves the default -gpu-metrics=gpu with an empty cache; the
	// per-GPU and per-node gauges need a node, and the node level its own run.
	for _, level := range []server.GPUMetrics{server.GPUMetricsPerGPU, server.GPUMetricsPerNode} {
		fams, err := extenderServerFamilies(level)
		if err != nil {
			return nil, fmt.Errorf("extender server (-gpu-metrics=%s): %w", level, err)
		}
		c.add("extender", fams)
	}
	fams, err := devicePluginFamilies()
	if err != nil {
		return nil, fmt.Errorf("device plugin: %w", err)
	}
	c.add("device plugin", fams)
	return c, nil
}

// add records the series names of fams, as a PromQL query must spell them.
func (c catalog) add(program string, fams []*dto.MetricFamily) {
	for _, f := range fams {
		name := f.GetName()
		switch f.GetType() {
		case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				c[name+s] = program
			}
		case dto.MetricType_SUMMARY:
			for _, s := range []string{"", "_sum", "_count"} {
				c[name+s] = program
			}
		default:
			c[name] = program
		}
	}
}

// extenderRunFamilies runs the extender as its main does, app.Run on a
// loopback listener, and reads its /metrics once: the only way to see the
// series app.Run registers itself (the leader gauge, the Go and process
// collectors) besides the server's. The listener accepts before Run serves,
// so the GET waits for the server without any polling.
func extenderRunFamilies() ([]*dto.MetricFamily, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- app.Run(ctx, ln, app.Config{Client: fake.NewClientset()}) }()
	fams, scrapeErr := scrape("http://" + ln.Addr().String() + "/metrics")
	cancel()
	if runErr := <-done; runErr != nil && scrapeErr != nil {
		return nil, fmt.Errorf("%w (app.Run: %v)", scrapeErr, runErr)
	}
	return fams, scrapeErr
}

// scrape reads the text exposition at url into metric families.
func scrape(url string) ([]*dto.MetricFamily, error) {
	client := &http.Client{Timeout: time.Minute}
	resp, err := client.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	byName, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, err
	}
	fams := make([]*dto.MetricFamily, 0, len(byName))
	for _, f := range byName {
		fams = append(fams, f)
	}
	return fams, nil
}

// extenderServerFamilies builds the extender's server on a fresh registry,
// as app.Run does, over a cache holding one node with a healthy and an
// unhealthy GPU, and gathers it after the requests that create the series
// no label value exists for up front.
func extenderServerFamilies(level server.GPUMetrics) ([]*dto.MetricFamily, error) {
	reg := prometheus.NewRegistry()
	s, err := server.New(server.Config{Cache: oneNodeCache{}, Binder: noBinder{}, Registry: reg, GPUMetrics: level})
	if err != nil {
		return nil, err
	}
	if _, err := server.NewConsistencyMetrics(reg); err != nil {
		return nil, err
	}
	// The latency histogram has a series only once a verb was timed, and the
	// preempt counter only once a preempt answer counted a candidate node.
	preemptArgs := extenderv1.ExtenderPreemptionArgs{
		Pod:                   &corev1.Pod{},
		NodeNameToMetaVictims: map[string]*extenderv1.MetaVictims{"n1": {}},
	}
	if err := serve(s.Handler(), http.MethodPost, gpushare.ExtenderURLPrefix+"/preempt", preemptArgs); err != nil {
		return nil, err
	}
	return reg.Gather()
}

// serve sends one request with a JSON body to h in-process and wants a 200.
func serve(h http.Handler, method, path string, body any) error {
	data, err := json.Marshal(body)
	if err != nil {
		return err
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, bytes.NewReader(data)))
	if rec.Code != http.StatusOK {
		return fmt.Errorf("%s %s: %d %s", method, path, rec.Code, rec.Body.String())
	}
	return nil
}

// devicePluginFamilies registers the device plugin's series on a fresh
// registry with the constructor its main calls; every label value of them
// exists from the start.
func devicePluginFamilies() ([]*dto.MetricFamily, error) {
	reg := prometheus.NewRegistry()
	if _, err := manager.NewMetrics(reg); err != nil {
		return nil, err
	}
	if err := usageSeries(reg); err != nil {
		return nil, err
	}
	return reg.Gather()
}

// usageSeries registers the usage loop's series and fills them with two
// readings of a container above its slice, a grace apart, so every series
// exists, the over-use counter included.
func usageSeries(reg *prometheus.Registry) error {
	metrics, err := usage.NewMetrics(reg)
	if err != nil {
		return err
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "11111111-2222-3333-4444-555555555555",
		Annotations: map[string]string{gpushare.AnnotationContainerEnv: `{"main":{"gpu":0,"pod":1,"container":1,"dev":16}}`}},
		Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{Name: "main", ContainerID: "containerd://" + strings.Repeat("a", 64)}}}}
	loop, err := usage.New(usage.Config{
		GPUs: fixedUsage{{Index: 0, UUID: "GPU-0", UsedBytes: 2 << 30, TotalBytes: 16 << 30, UtilizationPercent: 50,
			Processes: []nvml.Process{{PID: 1, UsedBytes: 2 << 30, UsedKnown: true}}}},
		Pods: func() []*corev1.Pod { return []*corev1.Pod{pod} },
		Owner: func(uint32) (cgroup.Owner, bool, error) {
			return cgroup.Owner{PodUID: string(pod.UID), ContainerID: strings.Repeat("a", 64)}, true, nil
		},
		Unit: gpushare.GiB, Grace: time.Second, Metrics: metrics,
	})
	if err != nil {
		return err
	}
	now := time.Now()
	loop.Step(context.Background(), now)
	loop.Step(context.Background(), now.Add(time.Second))
	return nil
}

// fixedUsage is a GPU reading that never changes.
type fixedUsage []nvml.Usage

func (f fixedUsage) Usage() ([]nvml.Usage, error) { return f, nil }

// oneNodeCache is a synced cache of one gpushare node, n1, with GPU 0
// healthy and half charged and GPU 1 unhealthy.
type oneNodeCache struct{}

func (oneNodeCache) HasSynced() bool { return true }

func (c oneNodeCache) Nodes([]string) []*allocator.Node { return c.All() }

func (oneNodeCache) All() []*allocator.Node {
	return []*allocator.Node{{Name: "n1", GPUShare: true, GPUs: []allocator.GPU{
		{Index: 0, Units: 16, Used: 8, Healthy: true},
		{Index: 1, Units: 16},
	}}}
}

func (oneNodeCache) Inspect(string) (cache.Inspect, bool) { return cache.Inspect{}, false }

func (oneNodeCache) Holders(string) (*allocator.Node, []preempt.Holder, bool) { return nil, nil, false }

func (oneNodeCache) Pod(string, string) (*cache.PodRecord, bool) { return nil, false }

// noBinder binds nothing; no request here reaches it.
type noBinder struct{}

func (noBinder) Bind(context.Context, extenderv1.ExtenderBindingArgs) error { return nil }
