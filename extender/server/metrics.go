package server

import (
	"fmt"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/extender/binder"
	"github.com/gpushare/gpushare/extender/cache"
)

// metrics are the extender's Prometheus series.
type metrics struct {
	latency     *prometheus.HistogramVec
	binds       *prometheus.CounterVec
	preemptions *prometheus.CounterVec
}

// Bind outcomes, the values of the outcome label.
const (
	outcomeBound = "bound"
	outcomeUnfit = "unfit"
	outcomeError = "error"
)

// GPUMetrics is how finely the extender reports GPU memory beside the cluster
// totals, which it always reports: per GPU (three series per GPU, about
// 120,000 at 5,000 nodes of 8), per node (three per node), or not at all.
// It is a flag.Value.
type GPUMetrics int

const (
	GPUMetricsPerGPU GPUMetrics = iota
	GPUMetricsPerNode
	GPUMetricsNone
)

var gpuMetricsNames = []string{GPUMetricsPerGPU: "gpu", GPUMetricsPerNode: "node", GPUMetricsNone: "none"}

func (g GPUMetrics) String() string {
	if g >= 0 && int(g) < len(gpuMetricsNames) {
		return gpuMetricsNames[g]
	}
	return strconv.Itoa(int(g))
}

// Set implements flag.Value.
func (g *GPUMetrics) Set(s string) error {
	for i, name := range gpuMetricsNames {
		if s == name {
			*g = GPUMetrics(i)
			return nil
		}
	}
	return fmt.Errorf("unknown GPU metrics level %q: want gpu, node or none", s)
}

func newMetrics(reg prometheus.Registerer, nodes func() []*allocator.Node, level GPUMetrics) (*metrics, error) {
	if level < GPUMetricsPerGPU || level > GPUMetricsNone {
		return nil, fmt.Errorf("unknown GPU metrics level %d", level)
	}
	m := &metrics{
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "gpushare_extender_request_duration_seconds",
			Help: "Time to answer one extender request, by verb.",
			// Filter answers in microseconds, bind waits on an API call.
			Buckets: prometheus.ExponentialBuckets(50e-6, 2.5, 14),
		}, []string{"verb"}),
		binds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpushare_extender_binds_total",
			Help: "Bind requests by outcome: bound, unfit (no longer fits the node), error.",
		}, []string{"outcome"}),
		preemptions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpushare_extender_preempt_nodes_total",
			Help: "Candidate nodes of preempt requests by answer: chosen (victims on the GPUs the pod needs), " +
				"unchanged (the scheduler's victims: GPU memory is not what keeps the pod off), dropped (no eviction makes it fit).",
		}, []string{"outcome"}),
	}
	gpus := &gpuCollector{
		nodes: nodes,
		level: level,
		clusterAllocated: prometheus.NewDesc("gpushare_extender_cluster_allocated_units",
			"Units charged on the GPUs of every gpushare node (bound and assumed pods).", nil, nil),
		clusterTotal: prometheus.NewDesc("gpushare_extender_cluster_total_units",
			"Memory of every GPU of the gpushare nodes, in units.", nil, nil),
		clusterGPUs: prometheus.NewDesc("gpushare_extender_cluster_gpus",
			"GPUs of the gpushare nodes by health: healthy ones may be chosen.", []string{"health"}, nil),
		clusterInUse: prometheus.NewDesc("gpushare_extender_cluster_gpus_in_use",
			"GPUs with at least one unit charged: the cards binpacking keeps few.", nil, nil),
		allocated: prometheus.NewDesc("gpushare_extender_gpu_allocated_units",
			"Units charged on a GPU (bound and assumed pods).", []string{"node", "gpu"}, nil),
		total: prometheus.NewDesc("gpushare_extender_gpu_total_units",
			"A GPU's memory in units.", []string{"node", "gpu"}, nil),
		healthy: prometheus.NewDesc("gpushare_extender_gpu_healthy",
			"1 when the GPU may be chosen, 0 when unhealthy.", []string{"node", "gpu"}, nil),
		nodeAllocated: prometheus.NewDesc("gpushare_extender_node_allocated_units",
			"Units charged on a node's GPUs (bound and assumed pods).", []string{"node"}, nil),
		nodeTotal: prometheus.NewDesc("gpushare_extender_node_total_units",
			"Memory of a node's GPUs, in units.", []string{"node"}, nil),
		nodeHealthy: prometheus.NewDesc("gpushare_extender_node_healthy_gpus",
			"A node's GPUs that may be chosen.", []string{"node"}, nil),
	}
	for _, c := range []prometheus.Collector{m.latency, m.binds, m.preemptions, gpus} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	for _, o := range []string{outcomeBound, outcomeUnfit, outcomeError} {
		m.binds.WithLabelValues(o)
	}
	return m, nil
}

// ConsistencyMetrics count what the binder and the cache did about charges
// whose truth they could not see at once: Bindings without a definite answer,
// and GETs for charges the informer had not confirmed in time. Both should
// stay near zero; a rising rate means a struggling API server or a lagging
// informer. Build them with NewConsistencyMetrics and hand their methods to
// binder.Config.OnAmbiguous and cache.Config.OnVerify.
type ConsistencyMetrics struct {
	ambiguous     *prometheus.CounterVec
	verifications *prometheus.CounterVec
	foreign       prometheus.Counter
}

// NewConsistencyMetrics registers the series on reg, every label value at zero.
func NewConsistencyMetrics(reg prometheus.Registerer) (*ConsistencyMetrics, error) {
	m := &ConsistencyMetrics{
		ambiguous: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpushare_extender_binds_ambiguous_total",
			Help: "Bindings that got no definite answer (timeout, lost connection, 5xx), by what reading the pod back showed: " +
				"bound (charge kept, bind succeeded), released (gone, replaced or bound elsewhere: charge dropped), " +
				"pending (not bound yet, but the Binding may still be committed: charge kept until the write horizon), unknown (read failed: charge kept until verified).",
		}, []string{"resolution"}),
		verifications: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpushare_extender_charge_verifications_total",
			Help: "GETs of pods whose charge the informer had not confirmed within -assume-ttl, by result: " +
				"bound (charge kept), released (pod gone, finished, unbound or elsewhere: charge dropped), " +
				"pending (unbound, but a Binding of it may still be committed: charge kept), error (charge kept).",
		}, []string{"result"}),
		foreign: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gpushare_extender_foreign_binds_total",
			Help: "Pods bound with gpushare annotations by another binder (gpushare-scheduler, another extender, by hand): " +
				"two binders with two caches on the same nodes can over-commit a GPU. Should stay 0.",
		}),
	}
	for _, c := range []prometheus.Collector{m.ambiguous, m.verifications, m.foreign} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	for _, r := range []string{binder.AmbiguousBound, binder.AmbiguousReleased, binder.AmbiguousPending, binder.AmbiguousUnknown} {
		m.ambiguous.WithLabelValues(r)
	}
	for _, r := range []string{cache.VerifyBound, cache.VerifyReleased, cache.VerifyPending, cache.VerifyError} {
		m.verifications.WithLabelValues(r)
	}
	return m, nil
}

// AmbiguousBind counts one Binding without a definite answer, by resolution.
func (m *ConsistencyMetrics) AmbiguousBind(resolution string) {
	m.ambiguous.WithLabelValues(resolution).Inc()
}

// ForeignBind counts one pod bound by another binder.
func (m *ConsistencyMetrics) ForeignBind() { m.foreign.Inc() }

// Verification counts one verification GET, by result.
func (m *ConsistencyMetrics) Verification(result string) {
	m.verifications.WithLabelValues(result).Inc()
}

// gpuCollector reports GPU units from the cache at scrape time, so the
// series never lag the view the extender schedules with.
type gpuCollector struct {
	nodes func() []*allocator.Node
	level GPUMetrics

	clusterAllocated, clusterTotal, clusterGPUs, clusterInUse *prometheus.Desc
	allocated, total, healthy                                 *prometheus.Desc
	nodeAllocated, nodeTotal, nodeHealthy                     *prometheus.Desc
}

// Describe implements prometheus.Collector.
func (g *gpuCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{g.clusterAllocated, g.clusterTotal, g.clusterGPUs, g.clusterInUse} {
		ch <- d
	}
	switch g.level {
	case GPUMetricsPerGPU:
		ch <- g.allocated
		ch <- g.total
		ch <- g.healthy
	case GPUMetricsPerNode:
		ch <- g.nodeAllocated
		ch <- g.nodeTotal
		ch <- g.nodeHealthy
	}
}

// Collect implements prometheus.Collector.
func (g *gpuCollector) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		if m, err := prometheus.NewConstMetric(d, prometheus.GaugeValue, v, labels...); err == nil {
			ch <- m
		}
	}
	var allocated, total, healthyGPUs, unhealthyGPUs, inUse float64
	for _, n := range g.nodes() {
		if !n.GPUShare {
			continue
		}
		var nodeAllocated, nodeTotal, nodeHealthy float64
		for _, gpu := range n.GPUs {
			healthy := 0.0
			if gpu.Healthy {
				healthy = 1
			}
			if gpu.Used > 0 {
				inUse++
			}
			nodeAllocated += float64(gpu.Used)
			nodeTotal += float64(gpu.Units)
			nodeHealthy += healthy
			if g.level == GPUMetricsPerGPU {
				idx := strconv.Itoa(gpu.Index)
				gauge(g.allocated, float64(gpu.Used), n.Name, idx)
				gauge(g.total, float64(gpu.Units), n.Name, idx)
				gauge(g.healthy, healthy, n.Name, idx)
			}
		}
		if g.level == GPUMetricsPerNode {
			gauge(g.nodeAllocated, nodeAllocated, n.Name)
			gauge(g.nodeTotal, nodeTotal, n.Name)
			gauge(g.nodeHealthy, nodeHealthy, n.Name)
		}
		allocated += nodeAllocated
		total += nodeTotal
		healthyGPUs += nodeHealthy
		unhealthyGPUs += float64(len(n.GPUs)) - nodeHealthy
	}
	gauge(g.clusterAllocated, allocated)
	gauge(g.clusterTotal, total)
	gauge(g.clusterGPUs, healthyGPUs, "healthy")
	gauge(g.clusterGPUs, unhealthyGPUs, "unhealthy")
	gauge(g.clusterInUse, inUse)
}
