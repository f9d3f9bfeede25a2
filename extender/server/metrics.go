package server

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpushare/gpushare/extender/allocator"
)

// metrics are the extender's Prometheus series.
type metrics struct {
	latency *prometheus.HistogramVec
	binds   *prometheus.CounterVec
}

// Bind outcomes, the values of the outcome label.
const (
	outcomeBound = "bound"
	outcomeUnfit = "unfit"
	outcomeError = "error"
)

func newMetrics(reg prometheus.Registerer, nodes func() []*allocator.Node) (*metrics, error) {
	m := &metrics{
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "gpushare_extender_request_duration_seconds",
			Help: "Time to answer one extender request, by verb.",
			// Filter answers in microseconds, bind waits on two API calls.
			Buckets: prometheus.ExponentialBuckets(50e-6, 2.5, 14),
		}, []string{"verb"}),
		binds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpushare_extender_binds_total",
			Help: "Bind requests by outcome: bound, unfit (no longer fits the node), error.",
		}, []string{"outcome"}),
	}
	gpus := &gpuCollector{
		nodes: nodes,
		allocated: prometheus.NewDesc("gpushare_extender_gpu_allocated_units",
			"Units charged on a GPU (bound and assumed pods).", []string{"node", "gpu"}, nil),
		total: prometheus.NewDesc("gpushare_extender_gpu_total_units",
			"A GPU's memory in units.", []string{"node", "gpu"}, nil),
		healthy: prometheus.NewDesc("gpushare_extender_gpu_healthy",
			"1 when the GPU may be chosen, 0 when unhealthy.", []string{"node", "gpu"}, nil),
	}
	for _, c := range []prometheus.Collector{m.latency, m.binds, gpus} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	for _, o := range []string{outcomeBound, outcomeUnfit, outcomeError} {
		m.binds.WithLabelValues(o)
	}
	return m, nil
}

// gpuCollector reports per-GPU units from the cache at scrape time, so the
// series never lag the view the extender schedules with.
type gpuCollector struct {
	nodes                     func() []*allocator.Node
	allocated, total, healthy *prometheus.Desc
}

// Describe implements prometheus.Collector.
func (g *gpuCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- g.allocated
	ch <- g.total
	ch <- g.healthy
}

// Collect implements prometheus.Collector.
func (g *gpuCollector) Collect(ch chan<- prometheus.Metric) {
	for _, n := range g.nodes() {
		if !n.GPUShare {
			continue
		}
		for _, gpu := range n.GPUs {
			idx := strconv.Itoa(gpu.Index)
			healthy := 0.0
			if gpu.Healthy {
				healthy = 1
			}
			for _, v := range []struct {
				desc  *prometheus.Desc
				value float64
			}{{g.allocated, float64(gpu.Used)}, {g.total, float64(gpu.Units)}, {g.healthy, healthy}} {
				if m, err := prometheus.NewConstMetric(v.desc, prometheus.GaugeValue, v.value, n.Name, idx); err == nil {
					ch <- m
				}
			}
		}
	}
}
