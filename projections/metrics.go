package projections

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the projector's Prometheus metrics. A nil *Metrics records nothing.
type Metrics struct {
	events       *prometheus.CounterVec
	batches      prometheus.Counter
	batchSeconds prometheus.Histogram
	lagSeconds   *prometheus.GaugeVec
	checkpoint   *prometheus.GaugeVec
	conflicts    prometheus.Counter
	failures     prometheus.Counter
}

// NewMetrics registers the projector's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ledger_projector_events_total", Help: "Events applied to a projection's live generation.",
		}, []string{"projection"}),
		batches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ledger_projector_batches_total", Help: "Batches committed.",
		}),
		batchSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "ledger_projector_batch_seconds", Help: "Time to apply and commit one batch.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}),
		lagSeconds: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ledger_projector_lag_seconds", Help: "Age of the oldest event not yet applied (0 when caught up).",
		}, []string{"projection"}),
		checkpoint: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ledger_projector_checkpoint", Help: "The projection's checkpoint position (commit and prepare parts).",
		}, []string{"projection", "part"}),
		conflicts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ledger_projector_checkpoint_conflicts_total", Help: "Batches refused because the checkpoint had moved (another runner, a switch).",
		}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ledger_projector_failures_total", Help: "Batches that failed and were retried.",
		}),
	}
	reg.MustRegister(m.events, m.batches, m.batchSeconds, m.lagSeconds, m.checkpoint, m.conflicts, m.failures)
	return m
}

func (m *Metrics) batch(slots []*slot, n int, d time.Duration, lag float64) {
	if m == nil {
		return
	}
	if n > 0 {
		m.batches.Inc()
		m.batchSeconds.Observe(d.Seconds())
	}
	for _, s := range slots {
		name := s.proj.Name()
		m.lagSeconds.WithLabelValues(name).Set(lag)
		m.checkpoint.WithLabelValues(name, "commit").Set(float64(s.pos.Commit))
		m.checkpoint.WithLabelValues(name, "prepare").Set(float64(s.pos.Prepare))
	}
}

func (m *Metrics) applied(name string, n int) {
	if m != nil && n > 0 {
		m.events.WithLabelValues(name).Add(float64(n))
	}
}

func (m *Metrics) conflict() {
	if m != nil {
		m.conflicts.Inc()
	}
}

func (m *Metrics) failure() {
	if m != nil {
		m.failures.Inc()
	}
}
