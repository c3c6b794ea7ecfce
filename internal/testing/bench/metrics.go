package bench

import (
	"github.com/prometheus/client_golang/prometheus"
)

// groupCommitMetric is the ledger's histogram of commands per group-commit
// transaction (internal/ledger/batch.go), in the default registry.
const groupCommitMetric = "ledger_group_commit_batch_commands"

// batchTotals reads that histogram: transactions and commands so far.
func batchTotals() (transactions, commands float64) {
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		return 0, 0
	}
	for _, mf := range mfs {
		if mf.GetName() != groupCommitMetric {
			continue
		}
		for _, m := range mf.GetMetric() {
			if h := m.GetHistogram(); h != nil {
				transactions += float64(h.GetSampleCount())
				commands += h.GetSampleSum()
			}
		}
	}
	return transactions, commands
}
