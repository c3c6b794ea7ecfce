package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// phaseRunner runs one system's measured phases and collects their results.
type phaseRunner struct {
	ctx   context.Context
	cfg   Config
	sys   string
	t     *target
	pm    int // the postmaster's PID (CPU sampling), 0 when unknown
	prog  *progress
	calls *storeCalls // nil unless the ledger is on the KurrentDB test server
	out   []PhaseResult
	// manyRep is what the many-accounts phases measured (many.go), nil
	// without them.
	manyRep *ManyReport
}

func newGens(w *workload, phase string, clients int) []*clientGen {
	g := make([]*clientGen, clients)
	for i := range g {
		g[i] = newClientGen(w, phase, i)
	}
	return g
}

// run drives one recorded phase with the generators g and returns its result,
// which stays valid until the next phase is run.
func (pr *phaseRunner) run(name string, g []*clientGen, spec loadSpec) (*PhaseResult, error) {
	spec.system, spec.phase, spec.record = pr.sys, name, true
	return pr.measure(name, func() (PhaseResult, error) {
		run, err := drive(pr.ctx, pr.t, g, spec, pr.prog)
		if err != nil {
			return PhaseResult{}, err
		}
		return resultOf(run), nil
	})
}

// measure runs one phase (f), bracketed by the phase hooks, and adds to its
// result the CPU it took, the ledger's group commits and the event store's
// calls; it returns the result as kept in pr.out (valid until the next phase).
func (pr *phaseRunner) measure(name string, f func() (PhaseResult, error)) (*PhaseResult, error) {
	cfg, sys := pr.cfg, pr.sys
	before := sampleCPU(pr.pm)
	tx0, cmds0 := batchTotals(cfg.ledgerMetrics)
	cr0, cs0 := coldTotals(cfg.ledgerMetrics)
	p0 := pr.poolStat()
	a0, r0 := pr.calls.count()
	k0, ks0 := histogramTotals(cfg.ledgerMetrics, compactionMetric)
	var pg *pgWatch
	if p0 != nil {
		pg = watchPG(pr.ctx, cfg.eventStoreURL, pr.pm, cfg.Progress.Warn)
	}
	hook(cfg, sys, name, true)
	res, err := f()
	hook(cfg, sys, name, false)
	if pg != nil {
		res.PG = pg.end(pr.ctx, res.Timeline)
	}
	if err != nil {
		return nil, err
	}
	res.System, res.Phase = sys, name
	if k1, ks1 := histogramTotals(cfg.ledgerMetrics, compactionMetric); sys == SystemLedger {
		res.ResidentCompactions, res.ResidentCompactionMs = int64(k1-k0), (ks1-ks0)*1000
	}
	pr.calls.since(&res, a0, r0)
	res.CPU = cpuBetween(before, sampleCPU(pr.pm), cpuCount())
	if tx1, cmds1 := batchTotals(cfg.ledgerMetrics); sys == SystemLedger && tx1 > tx0 {
		res.Transactions = int64(tx1 - tx0)
		res.MeanBatch = (cmds1 - cmds0) / (tx1 - tx0)
	}
	if cr1, cs1 := coldTotals(cfg.ledgerMetrics); sys == SystemLedger && res.Commands > 0 {
		res.ColdLoadsPerCommand = (cs1 - cs0) / float64(res.Commands)
		if cr1 > cr0 {
			res.ColdLoadsPerRound = (cs1 - cs0) / (cr1 - cr0)
		}
	}
	if p0 != nil && res.Commands > 0 {
		p1 := pr.poolStat()
		n := p1.AcquireCount() - p0.AcquireCount()
		res.PoolAcquiresPerCommand = float64(n) / float64(res.Commands)
		res.PoolWaitsPerCommand = float64(p1.EmptyAcquireCount()-p0.EmptyAcquireCount()) / float64(res.Commands)
		if n > 0 {
			res.PoolMeanWaitMs = float64((p1.AcquireDuration() - p0.AcquireDuration()).Microseconds()) / 1000 / float64(n)
		}
	}
	pr.out = append(pr.out, res)
	cfg.Progress.Info("bench: phase done", "system", sys, "phase", name, "commands_per_sec", int(res.CommandsPerSec), "p99_ms", res.P99Ms, "errors", res.Errors)
	if res.PG != nil {
		cfg.Progress.Info("bench: postgres in the phase", "system", sys, "phase", name, "pg", res.PG.String(),
			"resident_compactions", res.ResidentCompactions, "resident_compaction_ms", res.ResidentCompactionMs)
	}
	return &pr.out[len(pr.out)-1], nil
}

// openLoop runs the open-loop phase name at fraction f of rate (the commands
// per second of the closed-loop phase named of), after a second at that rate unrecorded: the
// switch from the previous (closed-loop) phase leaves a transient of its own.
func (pr *phaseRunner) openLoop(name string, g []*clientGen, rate, f float64, of string) error {
	cfg := pr.cfg
	at := rate * f
	wr, err := drive(pr.ctx, pr.t, g, loadSpec{system: pr.sys, phase: name + " warm-up", duration: min(time.Second, cfg.Duration/4), dupRatio: cfg.DuplicateRatio, rate: at}, pr.prog)
	if err != nil {
		return err
	}
	hr, err := pr.run(name, g, loadSpec{duration: cfg.Duration / 2, dupRatio: cfg.DuplicateRatio, rate: at})
	if err != nil {
		return err
	}
	hr.TargetRate = at
	hr.WarmupNewAnswered = wr.c.newAnswered.Load()
	hr.Mode = fmt.Sprintf("open loop at %.0f/s (%g%% of %s), %d clients, after 1s unrecorded", at, 100*f, of, cfg.Clients)
	return nil
}

// poolStat is the ledger's store pool's statistics now (nil: not the
// ledger, or not on PostgreSQL).
func (pr *phaseRunner) poolStat() *pgxpool.Stat {
	if pr.sys != SystemLedger || pr.cfg.ledgerPool == nil {
		return nil
	}
	return pr.cfg.ledgerPool()
}
