package usage

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the usage loop's Prometheus series. Container series exist for
// each (container, GPU) pair of the latest sample, GPU series for each GPU,
// so their number is bounded by the containers on the node (the kubelet's
// max-pods times containers per pod) times the GPUs each spans. Series of a
// pair that left the sample are deleted. A nil *Metrics records nothing.
type Metrics struct {
	used, slice, ratio, overuse *prometheus.GaugeVec
	overuseTotal                *prometheus.CounterVec
	gpuUsed, gpuFree, gpuUtil   *prometheus.GaugeVec
	gpuUnattributed             *prometheus.GaugeVec
	reads                       *prometheus.CounterVec
	// shown are the label values set by the last sample, to delete the gone.
	shownContainers map[[4]string]bool
}

var containerLabels = []string{"namespace", "pod", "container", "gpu"}

// NewMetrics registers the usage series with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	gauge := func(name, help string, labels []string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
	}
	gpu := []string{"gpu", "uuid"}
	m := &Metrics{
		used: gauge("gpushare_container_memory_used_bytes",
			"GPU memory the container's processes hold on the GPU (NVML's process lists), by namespace, pod, container and GPU index.", containerLabels),
		slice: gauge("gpushare_container_memory_slice_bytes",
			"The container's gpushare slice of the GPU (its units on it times the memory unit); absent for a container using a GPU without a slice.", containerLabels),
		ratio: gauge("gpushare_container_memory_used_ratio",
			"gpushare_container_memory_used_bytes over gpushare_container_memory_slice_bytes; above 1 the container uses more than its slice.", containerLabels),
		overuse: gauge("gpushare_container_memory_over_slice",
			"1 while the container uses more than its slice of the GPU (whether reported yet or not), else 0.", containerLabels),
		overuseTotal: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gpushare_container_overuse_reports_total",
			Help: "GPUShareOverUse reports made for the container: one when it has been above its slice for the grace period, one more every repeat period while it stays there."}, containerLabels),
		gpuUsed: gauge("gpushare_gpu_memory_used_bytes", "Memory in use on the GPU, every context counted (NVML's memory info).", gpu),
		gpuFree: gauge("gpushare_gpu_memory_free_bytes", "Memory free on the GPU (NVML's memory info).", gpu),
		gpuUtil: gauge("gpushare_gpu_utilization_ratio", "Share of the last sample period in which a kernel ran on the GPU (NVML's utilization.gpu / 100).", gpu),
		gpuUnattributed: gauge("gpushare_gpu_memory_unattributed_bytes",
			"Memory of processes on the GPU that no container of a pod on the node accounts for (host processes, the MPS server, pods not seen).", gpu),
		reads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gpushare_usage_reads_total",
			Help: "Readings of the GPUs' use by outcome: ok, or error (NVML failed; the last sample stands)."}, []string{"outcome"}),
		shownContainers: map[[4]string]bool{},
	}
	for _, c := range []prometheus.Collector{m.used, m.slice, m.ratio, m.overuse, m.overuseTotal, m.gpuUsed, m.gpuFree, m.gpuUtil, m.gpuUnattributed, m.reads} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	m.reads.WithLabelValues("ok")
	m.reads.WithLabelValues("error")
	return m, nil
}

// read counts one reading by outcome.
func (m *Metrics) read(ok bool) {
	if m == nil {
		return
	}
	if ok {
		m.reads.WithLabelValues("ok").Inc()
	} else {
		m.reads.WithLabelValues("error").Inc()
	}
}

// observe sets every series from s and deletes those of containers gone.
func (m *Metrics) observe(s Sample) {
	if m == nil {
		return
	}
	for _, g := range s.GPUs {
		l := []string{strconv.Itoa(g.Index), g.UUID}
		m.gpuUsed.WithLabelValues(l...).Set(float64(g.UsedBytes))
		m.gpuFree.WithLabelValues(l...).Set(float64(g.TotalBytes - min(g.UsedBytes, g.TotalBytes)))
		m.gpuUnattributed.WithLabelValues(l...).Set(float64(g.UnattributedBytes))
		if g.UtilizationPercent >= 0 {
			m.gpuUtil.WithLabelValues(l...).Set(float64(g.UtilizationPercent) / 100)
		}
	}
	shown := make(map[[4]string]bool, len(s.Containers))
	for _, c := range s.Containers {
		l := c.labels()
		shown[l] = true
		m.used.WithLabelValues(l[:]...).Set(float64(c.UsedBytes))
		over := 0.0
		if c.Over() {
			over = 1
		}
		m.overuse.WithLabelValues(l[:]...).Set(over)
		if c.SliceBytes == 0 {
			m.slice.DeleteLabelValues(l[:]...)
			m.ratio.DeleteLabelValues(l[:]...)
			continue
		}
		m.slice.WithLabelValues(l[:]...).Set(float64(c.SliceBytes))
		m.ratio.WithLabelValues(l[:]...).Set(float64(c.UsedBytes) / float64(c.SliceBytes))
	}
	for l := range m.shownContainers {
		if !shown[l] {
			for _, v := range []*prometheus.GaugeVec{m.used, m.slice, m.ratio, m.overuse} {
				v.DeleteLabelValues(l[:]...)
			}
			m.overuseTotal.DeleteLabelValues(l[:]...)
		}
	}
	m.shownContainers = shown
}

// reported counts one over-use report.
func (m *Metrics) reported(c ContainerUse) {
	if m != nil {
		l := c.labels()
		m.overuseTotal.WithLabelValues(l[:]...).Inc()
	}
}

func (c ContainerUse) labels() [4]string {
	return [4]string{c.Namespace, c.Pod, c.Container, strconv.Itoa(c.GPU)}
}
