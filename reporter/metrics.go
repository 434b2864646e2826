package reporter

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the reporter's Prometheus metrics. A nil *Metrics records
// nothing.
type Metrics struct {
	periods *prometheus.CounterVec
	passes  prometheus.Counter
	open    prometheus.Gauge
}

// NewMetrics registers the reporter's metrics on reg:
//
//	aurora_reporter_periods_total{outcome=staged|advanced|open|recording|drift|failed}
//	aurora_reporter_passes_total
//	aurora_reporter_open_windows   windows still unresolved at the end of the last pass
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		periods: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "aurora_reporter_periods_total", Help: "Periods handled by the buffered reporter, by outcome.",
		}, []string{"outcome"}),
		passes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "aurora_reporter_passes_total", Help: "Buffered reporter passes completed.",
		}),
		open: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "aurora_reporter_open_windows", Help: "Staged windows still unresolved at the end of the last pass.",
		}),
	}
	reg.MustRegister(m.periods, m.passes, m.open)
	return m
}

func (m *Metrics) observe(r PassResult) {
	if m == nil {
		return
	}
	m.passes.Inc()
	for outcome, n := range map[string]int{"staged": r.Staged, "advanced": r.Advanced, "open": r.Open,
		"recording": r.Recording, "drift": r.Drift, "failed": r.Failed} {
		m.periods.WithLabelValues(outcome).Add(float64(n))
	}
	m.open.Set(float64(r.Open))
}
