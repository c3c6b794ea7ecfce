package ledger

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the command service's Prometheus metrics, registered with
// Options.Metrics when it is set; unregistered otherwise (still counted, for
// tests, never exposed), so that several services in one process do not
// collide.
type metrics struct {
	snapshotsTaken   prometheus.Counter
	snapshotsIgnored prometheus.Counter
	keysRecalled     prometheus.Counter
	holdsRecalled    prometheus.Counter
	refundsRecalled  prometheus.Counter
	residentLoads    *prometheus.CounterVec // by origin (residentOrigin)
	residentsMade    *prometheus.CounterVec // of evictions, by head (headLabel)
	appendsRefused   prometheus.Counter
	refusalWaits     prometheus.Counter
	cachedBytes      prometheus.Gauge
	lookupBatch      prometheus.Histogram
	coldBatch        prometheus.Histogram
	batchSize        prometheus.Histogram
	compaction       prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) *metrics {
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	}
	histogram := func(name, help string, buckets []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets})
	}
	m := &metrics{
		snapshotsTaken:   counter("ledger_snapshots_taken_total", "Account snapshots written."),
		snapshotsIgnored: counter("ledger_snapshots_ignored_total", "Account snapshots found not to match their stream (version, hash or chain) and ignored."),
		keysRecalled:     counter("ledger_keys_recalled_total", "Key records an aggregate had forgotten, rebuilt from the key's events."),
		holdsRecalled:    counter("ledger_holds_recalled_total", "Closed holds an aggregate had forgotten, rebuilt from the hold's events (found by their subject)."),
		refundsRecalled:  counter("ledger_refunds_recalled_total", "Refunded sums of originals an aggregate had forgotten, summed from the refunds' events (found by their subject)."),
		residentLoads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ledger_resident_loads_total",
			Help: "Account aggregates made from their compact resident state, without a read of the store (residents.go), by where the resident came from: origin eviction (the cache dropped the account) or warm (warmed after a start)."},
			[]string{"origin"}),
		residentsMade: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ledger_residents_made_total",
			Help: "Residents made of aggregates the cache dropped (residents.go), by head: decided (the aggregate's last event is one this process wrote, confirmed) or read (folded from the store)."},
			[]string{"head"}),
		refusalWaits:   counter("ledger_batch_refusal_waits_total", "Times a command of a batch, loaded on durable state, waited for an earlier command of its batch whose append was refused to be decided again (batches.go: refusedBefore)."),
		appendsRefused: counter("ledger_appends_refused_total", "Appends of an account command's decision the store refused for a wrong expected revision (another instance wrote, or an append the decision was on top of failed): the command is decided again on the store's head."),
		cachedBytes:    prometheus.NewGauge(prometheus.GaugeOpts{Name: "ledger_account_cache_bytes", Help: "Estimated heap held by the cached account aggregates."}),
		lookupBatch: histogram("ledger_key_lookup_batch", "Keys looked up in the store per request, while resends of forgotten keys arrive.",
			prometheus.ExponentialBuckets(1, 2, 10)),
		coldBatch: histogram("ledger_cold_load_batch_streams", "Account streams read in one request by the cold loads of concurrent commands (aggregates not in the cache).",
			prometheus.ExponentialBuckets(1, 2, 10)),
		batchSize: histogram("ledger_group_commit_batch_commands", "Commands carried by one group-commit transaction.",
			[]float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512}),
		compaction: histogram("ledger_resident_compaction_seconds", "How long each compaction of the residents' arena held the residents' table lock (residents.compact): every command's resident lookup and every eviction waits for it.",
			prometheus.ExponentialBuckets(0.0005, 2, 14)),
	}
	for _, o := range []residentOrigin{fromEviction, fromWarm} {
		m.residentLoads.WithLabelValues(string(o)) // both series shown from the start
	}
	for _, h := range []bool{true, false} {
		m.residentsMade.WithLabelValues(headLabel(h))
	}
	if reg != nil {
		reg.MustRegister(m.snapshotsTaken, m.snapshotsIgnored, m.keysRecalled, m.holdsRecalled, m.refundsRecalled, m.residentLoads, m.residentsMade, m.appendsRefused, m.refusalWaits, m.cachedBytes, m.lookupBatch, m.coldBatch, m.batchSize, m.compaction)
	}
	return m
}

// headLabel is the label head of ledger_residents_made_total: whether the
// aggregate's last event is one this process decided (Account.DecidedHead).
func headLabel(decided bool) string {
	if decided {
		return "decided"
	}
	return "read"
}
