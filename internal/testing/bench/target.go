package bench

import (
	"context"
	"fmt"
	"time"
)

// runTarget drives a ledger this process did not start (cfg.TargetNATSURL:
// `ledger dev` or `serve` in another process, issue 27): it opens the
// workload's accounts through it, then runs the warm-up and the load phase,
// and adds that phase to rep. Nothing of the ledger's own is read (its
// metrics, its CPU, its heap): the caller samples its process from outside.
func runTarget(ctx context.Context, cfg Config, w *workload, rep *Report) error {
	t, err := dialTarget(SystemLedger, cfg.TargetNATSURL, cfg.Clients)
	if err != nil {
		return err
	}
	defer t.close()
	prog := &progress{log: cfg.Progress, interval: cfg.ProgressInterval}
	cfg.Progress.Info("bench: driving an external ledger", "nats", cfg.TargetNATSURL)
	warmNew, err := openAndWarm(ctx, cfg, SystemLedger, t, w, prog)
	if err != nil {
		return err
	}
	pr := &phaseRunner{ctx: ctx, cfg: cfg, sys: SystemLedger, t: t, prog: prog}
	lr, err := pr.run(PhaseLoad, newGens(w, "tload", cfg.Clients), loadSpec{duration: cfg.Duration, dupRatio: cfg.DuplicateRatio})
	if err == nil {
		lr.Mode = fmt.Sprintf("closed loop, %d clients, a ledger in another process", cfg.Clients)
		lr.WarmupNewAnswered = warmNew
	}
	rep.Phases = append(rep.Phases, pr.out...)
	return err
}

// openAndWarm opens the workload's accounts through t, then runs the
// unrecorded warm-up; it returns the new commands the warm-up had answered.
func openAndWarm(ctx context.Context, cfg Config, sys string, t *target, w *workload, prog *progress) (int64, error) {
	start := time.Now()
	if err := openAccounts(ctx, t, w, cfg.Clients); err != nil {
		return 0, err
	}
	cfg.Progress.Info("bench: accounts open", "system", sys, "accounts", len(w.accounts), "took", time.Since(start).Round(time.Millisecond))
	if cfg.Warmup <= 0 {
		return 0, nil
	}
	wr, err := drive(ctx, t, newGens(w, sys[:1]+"warm", cfg.Clients), loadSpec{system: sys, phase: "warm-up", duration: cfg.Warmup, dupRatio: cfg.DuplicateRatio}, prog)
	if err != nil {
		return 0, err
	}
	return wr.c.newAnswered.Load(), nil
}
