package server

import (
	"flag"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/extender/binder"
	"github.com/gpushare/gpushare/extender/cache"
)

// metricsNodes: two gpushare nodes, one of them with an unhealthy GPU, and a
// node without the label, which no series counts.
func metricsNodes() []*allocator.Node {
	return []*allocator.Node{
		{Name: "a", GPUShare: true, GPUs: []allocator.GPU{
			{Index: 0, Units: 80, Used: 30, Healthy: true}, {Index: 1, Units: 80, Used: 0, Healthy: true},
		}},
		{Name: "b", GPUShare: true, GPUs: []allocator.GPU{
			{Index: 0, Units: 24, Used: 24, Healthy: true}, {Index: 1, Units: 24, Used: 4, Healthy: false},
		}},
		{Name: "cpu", GPUShare: false, GPUs: []allocator.GPU{{Index: 0, Units: 99, Used: 9, Healthy: true}}},
	}
}

const clusterSeries = `
# HELP gpushare_extender_cluster_allocated_units Units charged on the GPUs of every gpushare node (bound and assumed pods).
# TYPE gpushare_extender_cluster_allocated_units gauge
gpushare_extender_cluster_allocated_units 58
# HELP gpushare_extender_cluster_gpus GPUs of the gpushare nodes by health: healthy ones may be chosen.
# TYPE gpushare_extender_cluster_gpus gauge
gpushare_extender_cluster_gpus{health="healthy"} 3
gpushare_extender_cluster_gpus{health="unhealthy"} 1
# HELP gpushare_extender_cluster_gpus_in_use GPUs with at least one unit charged: the cards binpacking keeps few.
# TYPE gpushare_extender_cluster_gpus_in_use gauge
gpushare_extender_cluster_gpus_in_use 3
# HELP gpushare_extender_cluster_total_units Memory of every GPU of the gpushare nodes, in units.
# TYPE gpushare_extender_cluster_total_units gauge
gpushare_extender_cluster_total_units 208
`

var gpuSeriesNames = []string{
	"gpushare_extender_cluster_allocated_units", "gpushare_extender_cluster_total_units",
	"gpushare_extender_cluster_gpus", "gpushare_extender_cluster_gpus_in_use",
	"gpushare_extender_gpu_allocated_units", "gpushare_extender_gpu_total_units", "gpushare_extender_gpu_healthy",
	"gpushare_extender_node_allocated_units", "gpushare_extender_node_total_units", "gpushare_extender_node_healthy_gpus",
}

func TestGPUMetricsLevels(t *testing.T) {
	for _, tc := range []struct {
		level GPUMetrics
		want  string
	}{
		{GPUMetricsPerGPU, clusterSeries + `
# HELP gpushare_extender_gpu_allocated_units Units charged on a GPU (bound and assumed pods).
# TYPE gpushare_extender_gpu_allocated_units gauge
gpushare_extender_gpu_allocated_units{gpu="0",node="a"} 30
gpushare_extender_gpu_allocated_units{gpu="0",node="b"} 24
gpushare_extender_gpu_allocated_units{gpu="1",node="a"} 0
gpushare_extender_gpu_allocated_units{gpu="1",node="b"} 4
# HELP gpushare_extender_gpu_healthy 1 when the GPU may be chosen, 0 when unhealthy.
# TYPE gpushare_extender_gpu_healthy gauge
gpushare_extender_gpu_healthy{gpu="0",node="a"} 1
gpushare_extender_gpu_healthy{gpu="0",node="b"} 1
gpushare_extender_gpu_healthy{gpu="1",node="a"} 1
gpushare_extender_gpu_healthy{gpu="1",node="b"} 0
# HELP gpushare_extender_gpu_total_units A GPU's memory in units.
# TYPE gpushare_extender_gpu_total_units gauge
gpushare_extender_gpu_total_units{gpu="0",node="a"} 80
gpushare_extender_gpu_total_units{gpu="0",node="b"} 24
gpushare_extender_gpu_total_units{gpu="1",node="a"} 80
gpushare_extender_gpu_total_units{gpu="1",node="b"} 24
`},
		{GPUMetricsPerNode, clusterSeries + `
# HELP gpushare_extender_node_allocated_units Units charged on a node's GPUs (bound and assumed pods).
# TYPE gpushare_extender_node_allocated_units gauge
gpushare_extender_node_allocated_units{node="a"} 30
gpushare_extender_node_allocated_units{node="b"} 28
# HELP gpushare_extender_node_healthy_gpus A node's GPUs that may be chosen.
# TYPE gpushare_extender_node_healthy_gpus gauge
gpushare_extender_node_healthy_gpus{node="a"} 2
gpushare_extender_node_healthy_gpus{node="b"} 1
# HELP gpushare_extender_node_total_units Memory of a node's GPUs, in units.
# TYPE gpushare_extender_node_total_units gauge
gpushare_extender_node_total_units{node="a"} 160
gpushare_extender_node_total_units{node="b"} 48
`},
		{GPUMetricsNone, clusterSeries},
	} {
		t.Run(tc.level.String(), func(t *testing.T) {
			reg := prometheus.NewRegistry()
			if _, err := newMetrics(reg, metricsNodes, tc.level); err != nil {
				t.Fatal(err)
			}
			if err := testutil.GatherAndCompare(reg, strings.NewReader(tc.want), gpuSeriesNames...); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestGPUMetricsFlag(t *testing.T) {
	var level GPUMetrics
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.Var(&level, "gpu-metrics", "")
	for _, tc := range []struct {
		arg  string
		want GPUMetrics
	}{{"node", GPUMetricsPerNode}, {"none", GPUMetricsNone}, {"gpu", GPUMetricsPerGPU}} {
		if err := fs.Set("gpu-metrics", tc.arg); err != nil || level != tc.want || level.String() != tc.arg {
			t.Errorf("-gpu-metrics=%s: level %v, error %v", tc.arg, level, err)
		}
	}
	if err := fs.Set("gpu-metrics", "per-gpu"); err == nil || !strings.Contains(err.Error(), "want gpu, node or none") {
		t.Errorf("an unknown level: %v", err)
	}
	if _, err := newMetrics(prometheus.NewRegistry(), metricsNodes, GPUMetrics(7)); err == nil {
		t.Error("newMetrics took an unknown level")
	}
}

func TestConsistencyMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewConsistencyMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	m.AmbiguousBind(binder.AmbiguousBound)
	m.AmbiguousBind(binder.AmbiguousUnknown)
	m.AmbiguousBind(binder.AmbiguousUnknown)
	m.Verification(cache.VerifyReleased)
	m.AmbiguousBind(binder.AmbiguousPending)
	m.Verification(cache.VerifyPending)
	m.ForeignBind()
	// Every label value is there from the start, at zero until counted.
	want := `
# HELP gpushare_extender_binds_ambiguous_total Bindings that got no definite answer (timeout, lost connection, 5xx), by what reading the pod back showed: bound (charge kept, bind succeeded), released (gone, replaced or bound elsewhere: charge dropped), pending (not bound yet, but the Binding may still be committed: charge kept until the write horizon), unknown (read failed: charge kept until verified).
# TYPE gpushare_extender_binds_ambiguous_total counter
gpushare_extender_binds_ambiguous_total{resolution="bound"} 1
gpushare_extender_binds_ambiguous_total{resolution="pending"} 1
gpushare_extender_binds_ambiguous_total{resolution="released"} 0
gpushare_extender_binds_ambiguous_total{resolution="unknown"} 2
# HELP gpushare_extender_charge_verifications_total GETs of pods whose charge the informer had not confirmed within -assume-ttl, by result: bound (charge kept), released (pod gone, finished, unbound or elsewhere: charge dropped), pending (unbound, but a Binding of it may still be committed: charge kept), error (charge kept).
# TYPE gpushare_extender_charge_verifications_total counter
gpushare_extender_charge_verifications_total{result="bound"} 0
gpushare_extender_charge_verifications_total{result="error"} 0
gpushare_extender_charge_verifications_total{result="pending"} 1
gpushare_extender_charge_verifications_total{result="released"} 1
# HELP gpushare_extender_foreign_binds_total Pods bound with gpushare annotations by another binder (gpushare-scheduler, another extender, by hand): two binders with two caches on the same nodes can over-commit a GPU. Should stay 0.
# TYPE gpushare_extender_foreign_binds_total counter
gpushare_extender_foreign_binds_total 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
	if _, err := NewConsistencyMetrics(reg); err == nil {
		t.Error("registering the series twice succeeded")
	}
}
