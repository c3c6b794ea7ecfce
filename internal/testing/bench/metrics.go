package bench

import (
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// The ledger's metrics the bench reads, from the registry its service
// registers them with (ledger.Options.Metrics).
const (
	// groupCommitMetric is the histogram of commands per group-commit
	// transaction (internal/app/ledger/batch.go).
	groupCommitMetric = "ledger_group_commit_batch_commands"
	// keysRecalledMetric counts the key records an aggregate had forgotten and
	// rebuilt from the store (internal/app/ledger/history.go).
	keysRecalledMetric = "ledger_keys_recalled_total"
	// coldLoadMetric is the histogram of streams per grouped cold-load
	// request (internal/app/ledger/coldloads.go).
	coldLoadMetric = "ledger_cold_load_batch_streams"
	// compactionMetric is the histogram of the residents' arena's
	// compactions (internal/app/ledger/residents.go).
	compactionMetric = "ledger_resident_compaction_seconds"
)

// eachMetric calls f with every series of the named metric family.
func eachMetric(g prometheus.Gatherer, name string, f func(*dto.Metric)) {
	if g == nil {
		return
	}
	mfs, err := g.Gather()
	if err != nil {
		return
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				f(m)
			}
		}
	}
}

// batchTotals reads the group-commit histogram: transactions and commands so far.
func batchTotals(g prometheus.Gatherer) (transactions, commands float64) {
	return histogramTotals(g, groupCommitMetric)
}

// coldTotals reads the cold-load histogram: requests and streams read so far.
func coldTotals(g prometheus.Gatherer) (requests, streams float64) {
	return histogramTotals(g, coldLoadMetric)
}

// histogramTotals reads a histogram's count and sum so far.
func histogramTotals(g prometheus.Gatherer, name string) (transactions, commands float64) {
	eachMetric(g, name, func(m *dto.Metric) {
		if h := m.GetHistogram(); h != nil {
			transactions += float64(h.GetSampleCount())
			commands += h.GetSampleSum()
		}
	})
	return transactions, commands
}

// keysRecalled reads the count of forgotten key records rebuilt from the store.
func keysRecalled(g prometheus.Gatherer) int {
	n := 0.0
	eachMetric(g, keysRecalledMetric, func(m *dto.Metric) { n += m.GetCounter().GetValue() })
	return int(n)
}
