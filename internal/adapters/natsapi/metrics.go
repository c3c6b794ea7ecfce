package natsapi

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/app/reply"
)

// Sources of a command, the "source" label of the metrics.
const (
	SourceRequest   = "request"   // NATS request-reply
	SourceJetStream = "jetstream" // the LEDGER_COMMANDS pull consumer
)

// Metrics are the intake's Prometheus metrics. A nil *Metrics records nothing.
type Metrics struct {
	commands *prometheus.CounterVec
	duration *prometheus.HistogramVec
	inFlight *prometheus.GaugeVec
	acks     *prometheus.CounterVec
	dlq      *prometheus.CounterVec
	queries  *prometheus.CounterVec
}

// NewMetrics registers the intake's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		commands: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ledger_commands_total",
			Help: "Commands answered, by type, status, code, duplicate and source (request or jetstream).",
		}, []string{"type", "status", "code", "duplicate", "source"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ledger_command_duration_seconds",
			Help:    "Time from receiving a command to its outcome, by type and source.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"type", "source"}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ledger_commands_in_flight",
			Help: "Commands being handled now, by source.",
		}, []string{"source"}),
		acks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ledger_jetstream_acks_total",
			Help: "JetStream command messages settled, by kind (ack, nak, term).",
		}, []string{"kind"}),
		dlq: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ledger_dlq_messages_total",
			Help: "Commands copied to the dead-letter subject, by reason.",
		}, []string{"reason"}),
		queries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ledger_queries_total",
			Help: "Queries answered by the intake, by query and code.",
		}, []string{"query", "code"}),
	}
	reg.MustRegister(m.commands, m.duration, m.inFlight, m.acks, m.dlq, m.queries)
	return m
}

// typeLabel keeps the label set bounded: a subject with an unknown type is "unknown".
func typeLabel(typ string) string {
	if domain.CommandType(typ).IsClient() {
		return typ
	}
	return "unknown"
}

func (m *Metrics) command(typ, source string, r reply.Reply, took time.Duration) {
	if m == nil {
		return
	}
	t := typeLabel(typ)
	dup := "false"
	if r.Duplicate {
		dup = "true"
	}
	m.commands.WithLabelValues(t, string(r.Status), string(r.Code), dup, source).Inc()
	m.duration.WithLabelValues(t, source).Observe(took.Seconds())
}

func (m *Metrics) inFlightAdd(source string, d float64) {
	if m != nil {
		m.inFlight.WithLabelValues(source).Add(d)
	}
}

func (m *Metrics) settled(kind string) {
	if m != nil {
		m.acks.WithLabelValues(kind).Inc()
	}
}

func (m *Metrics) deadLetter(reason string) {
	if m != nil {
		m.dlq.WithLabelValues(reason).Inc()
	}
}

func (m *Metrics) query(name, code string) {
	if m != nil {
		m.queries.WithLabelValues(name, code).Inc()
	}
}
