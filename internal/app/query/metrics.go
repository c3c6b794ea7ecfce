package query

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the query side's Prometheus metrics. A nil *Metrics records nothing.
type Metrics struct {
	queries *prometheus.CounterVec
	seconds *prometheus.HistogramVec
}

// NewMetrics registers the query metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		queries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ledger_read_queries_total", Help: "Read-model queries answered, by query and code.",
		}, []string{"query", "code"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "ledger_read_query_seconds", Help: "Time to answer a read-model query (min_position waits included).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 15),
		}, []string{"query"}),
	}
	reg.MustRegister(m.queries, m.seconds)
	return m
}

func (m *Metrics) observe(query, code string, d time.Duration) {
	if m == nil {
		return
	}
	m.queries.WithLabelValues(query, code).Inc()
	m.seconds.WithLabelValues(query).Observe(d.Seconds())
}
