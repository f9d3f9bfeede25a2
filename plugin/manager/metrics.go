package manager

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Allocate outcomes, the values of the outcome label.
const (
	outcomeAllocated  = "allocated"
	outcomeNoMatch    = "nomatch"
	outcomeOvercommit = "overcommit"
	outcomeInvalid    = "invalid"
	outcomeIsolation  = "isolation"
)

// Metrics are the device plugin's Prometheus series: what Allocate answered
// and what the reconciler repaired. A nil *Metrics records nothing.
type Metrics struct {
	allocate *prometheus.CounterVec
	repaired prometheus.Counter
}

// NewMetrics registers the plugin's series with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		allocate: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpushare_plugin_allocate_total",
			Help: "Containers the kubelet asked Allocate for, by outcome: allocated, or refused as nomatch (no pod waits for one of that size), overcommit (its GPU would hold more than it has), invalid (a malformed request) or isolation (the node's isolation tier is down).",
		}, []string{"outcome"}),
		repaired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gpushare_plugin_records_repaired_total",
			Help: "Pods whose record (gpushare.io/container-env, ASSIGNED=true) the reconciler wrote because the first write was lost.",
		}),
	}
	for _, c := range []prometheus.Collector{m.allocate, m.repaired} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	// Every outcome is a series from the start, so a rate over a refusal that never happened is 0, not absent.
	for _, o := range []string{outcomeAllocated, outcomeNoMatch, outcomeOvercommit, outcomeInvalid, outcomeIsolation} {
		m.allocate.WithLabelValues(o)
	}
	return m, nil
}

// count adds n containers of outcome.
func (m *Metrics) count(outcome string, n int) {
	if m != nil {
		m.allocate.WithLabelValues(outcome).Add(float64(n))
	}
}

// repair counts one repaired pod.
func (m *Metrics) repair() {
	if m != nil {
		m.repaired.Inc()
	}
}
