package bench

import (
	"context"
	"fmt"
	"time"
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
	a0, r0 := pr.calls.count()
	hook(cfg, sys, name, true)
	res, err := f()
	hook(cfg, sys, name, false)
	if err != nil {
		return nil, err
	}
	res.System, res.Phase = sys, name
	pr.calls.since(&res, a0, r0)
	res.CPU = cpuBetween(before, sampleCPU(pr.pm), cpuCount())
	if tx1, cmds1 := batchTotals(cfg.ledgerMetrics); sys == SystemLedger && tx1 > tx0 {
		res.Transactions = int64(tx1 - tx0)
		res.MeanBatch = (cmds1 - cmds0) / (tx1 - tx0)
	}
	pr.out = append(pr.out, res)
	cfg.Progress.Info("bench: phase done", "system", sys, "phase", name, "commands_per_sec", int(res.CommandsPerSec), "p99_ms", res.P99Ms, "errors", res.Errors)
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
