package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/ledgerworks/ledger/internal/platform/config"
	"github.com/ledgerworks/ledger/internal/testing/bench/seed"
)

// The many-accounts phases (issue 27): the load phase's clients over
// Config.ManyAccounts accounts opened for them in the event store, none of
// them in the ledger's cache when the phases start (an account per customer,
// each touched now and then), then the same at half that rate, open loop.
const (
	PhaseMany         = "many accounts"
	PhaseManyHalfLoad = "many half-load"
)

// ManyReport is what the many-accounts phases measured besides their rates.
type ManyReport struct {
	Accounts int `json:"accounts"`
	// AccountPrefix starts each of their IDs (the rest is 0..Accounts-1).
	AccountPrefix string `json:"account_prefix"`
	// OpenSeconds is the time to open them (batches decided by a
	// ledger.Service of the bench's own; on PostgreSQL loaded with COPY:
	// seed.OpenAccounts).
	OpenSeconds float64 `json:"open_seconds"`
	// WarmSeconds is the time the ledger took to warm them once opened
	// (Config.ManyCold unset), Warmed how many it warmed and Residents how
	// many of those it holds as residents after the phases.
	WarmSeconds float64 `json:"warm_seconds,omitempty"`
	Warmed      int64   `json:"warmed,omitempty"`
	Residents   int     `json:"residents,omitempty"`
	// SettleSeconds is the time of the VACUUM (ANALYZE) and CHECKPOINT after
	// them (settle; 0: not run, Config.ManyUnsettled or not on PostgreSQL,
	// or refused: SettleError).
	SettleSeconds float64 `json:"settle_seconds,omitempty"`
	SettleError   string  `json:"settle_error,omitempty"`
	// LedgerHeapMB is the ledger's live heap after a collection at the end of
	// each many-accounts phase (the larger of the two): the bytes of the heap
	// profile whose allocation stacks run through the ledger's code (its
	// service, store, domain, NATS intake) and not through the bench's
	// clients, scaled as pprof scales a sample. NATSHeapMB is the embedded
	// NATS servers' part, OtherHeapMB the rest (the clients, connection
	// buffers, the runtime).
	LedgerHeapMB float64 `json:"ledger_heap_mib"`
	NATSHeapMB   float64 `json:"nats_heap_mib"`
	OtherHeapMB  float64 `json:"other_heap_mib"`
	// ProcessPeakHeapMB is the largest heap of the whole process (live and
	// not yet collected objects) sampled through the two phases.
	ProcessPeakHeapMB float64 `json:"process_peak_heap_mib"`
}

// many opens Config.ManyAccounts accounts in the event store and runs the
// many-accounts phases on them with the load phase's clients; the load
// phase's workload names the run.
func (pr *phaseRunner) many(load *workload) error {
	cfg := pr.cfg
	w := newWorkload(load.runID+"m", cfg.ManyAccounts, cfg.Skew, cfg.TransactionRatio)
	mr := &ManyReport{Accounts: cfg.ManyAccounts, AccountPrefix: w.prefix()}
	pr.manyRep = mr
	took, err := openMany(pr.ctx, cfg.eventStoreURL, w, cfg.Logger, cfg.Progress)
	if err != nil {
		return err
	}
	mr.OpenSeconds = took.Seconds()
	cfg.Progress.Info("bench: many accounts open", "accounts", cfg.ManyAccounts, "took", took.Round(time.Millisecond), "per_sec", int(float64(cfg.ManyAccounts)/took.Seconds()))
	cached := "none of them cached at the start"
	if !cfg.ManyCold && cfg.ledger != nil {
		if err := mr.warm(pr.ctx, cfg); err != nil {
			return err
		}
		cached = fmt.Sprintf("warmed once opened (%d, %.1fs)", mr.Warmed, mr.WarmSeconds)
	}
	defer func() {
		if cfg.ledger != nil {
			mr.Residents = cfg.ledger.Residents()
		}
	}()
	if !cfg.ManyUnsettled && cfg.ledgerPool != nil {
		mr.settle(pr.ctx, cfg)
	}
	gens := func(phase string) []*clientGen { return newGens(w, pr.sys[:1]+phase, cfg.Clients) }
	if cfg.Warmup > 0 {
		if _, err := drive(pr.ctx, pr.t, gens("mwarm"), loadSpec{system: pr.sys, phase: "many warm-up", duration: cfg.Warmup, dupRatio: cfg.DuplicateRatio}, pr.prog); err != nil {
			return err
		}
	}
	peak := sampleHeapPeak()
	defer func() { mr.ProcessPeakHeapMB = mib(peak()) }()
	r, err := pr.run(PhaseMany, gens("many"), loadSpec{duration: cfg.Duration, dupRatio: cfg.DuplicateRatio})
	if err != nil {
		return err
	}
	r.Mode = fmt.Sprintf("closed loop, %d clients, over %d accounts %s", cfg.Clients, cfg.ManyAccounts, cached)
	rate := r.CommandsPerSec
	mr.sampleHeap()
	if rate > 0 {
		if err := pr.openLoop(PhaseManyHalfLoad, gens("mhalf"), rate, 0.5, "the many-accounts phase"); err != nil {
			return err
		}
		mr.sampleHeap()
	}
	return nil
}

// warm has the ledger under test warm the accounts just opened, as a
// restart over them would, and waits for it, with progress.
func (mr *ManyReport) warm(ctx context.Context, cfg Config) error {
	start, last := time.Now(), time.Now()
	cfg.ledger.Warm(mr.Accounts)
	for {
		n, done := cfg.ledger.Warming()
		if done {
			mr.Warmed, mr.WarmSeconds = n, time.Since(start).Seconds()
			cfg.Progress.Info("bench: many accounts warmed", "warmed", n, "residents", cfg.ledger.Residents(), "took", time.Since(start).Round(time.Millisecond))
			return nil
		}
		if time.Since(last) >= cfg.ProgressInterval {
			last = time.Now()
			cfg.Progress.Info("bench: warming many accounts", "warmed", n, "of", mr.Accounts)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// settle does what an operator does after a bulk load, on the ledger's
// PostgreSQL (the bench's settle: VACUUM (ANALYZE), which sets the hint bits
// the warming's reads would otherwise leave to the commands' backends, then
// CHECKPOINT), so that the checkpoint of the rows just copied in, with its
// fsync of the data files, is not taken by the phases' commits
// (BENCHMARKS.md: a checkpoint was in its writes through both phases of an
// unsettled run). The ledger's own checkpoints still come as they come. A
// failure is reported, not fatal.
func (mr *ManyReport) settle(ctx context.Context, cfg Config) {
	start := time.Now()
	if err := settle(ctx, []string{cfg.eventStoreURL}, cfg.eventStoreURL, cfg.Progress); err != nil {
		mr.SettleError = err.Error()
		return
	}
	mr.SettleSeconds = time.Since(start).Seconds()
}

// sampleHeap records the heap by source now, keeping the larger ledger part.
func (mr *ManyReport) sampleHeap() {
	h := liveHeapBySource()
	if l := mib(h.ledger); l >= mr.LedgerHeapMB {
		mr.LedgerHeapMB, mr.NATSHeapMB, mr.OtherHeapMB = l, mib(h.nats), mib(h.other)
	}
}

// openMany opens every account of w in the event store at storeURL (a
// duplicate answer is fine: a data dir reused) and returns how long it took.
func openMany(ctx context.Context, storeURL string, w *workload, components, log *slog.Logger) (time.Duration, error) {
	store, err := config.OpenEventStore(ctx, storeURL, components)
	if err != nil {
		return 0, err
	}
	defer store.Close()
	return seed.Timed(func() error {
		return seed.OpenAccounts(ctx, store, len(w.accounts), seed.OpenOptions{
			Body: func(i int) []byte { acc := w.accounts[i]; return openBody("open-"+acc, acc, w.currency) },
			Progress: func(opened, total int) {
				log.Info("bench: opening many accounts", "opened", opened, "of", total)
			},
			Logger: components,
		})
	})
}

func (m *ManyReport) line() string {
	settled := "not settled"
	switch {
	case m.SettleError != "":
		settled = "not settled (" + m.SettleError + ")"
	case m.SettleSeconds > 0:
		settled = fmt.Sprintf("settled by VACUUM (ANALYZE) and CHECKPOINT in %.1fs", m.SettleSeconds)
	}
	return fmt.Sprintf("%d accounts opened in %.1fs (%.0f/s, batches of %d decided by a ledger.Service of the bench's own, on PostgreSQL loaded with COPY), %d warmed by the ledger in %.1fs, %s, %d resident after the phases; the ledger's live heap %.1f MiB at most at the end of a many-accounts phase (NATS %.1f MiB, the rest %.1f MiB: clients, buffers, runtime); the process's heap peaked at %.1f MiB",
		m.Accounts, m.OpenSeconds, float64(m.Accounts)/max(m.OpenSeconds, 1e-9), seed.OpenBatch, m.Warmed, m.WarmSeconds, settled, m.Residents, m.LedgerHeapMB, m.NATSHeapMB, m.OtherHeapMB, m.ProcessPeakHeapMB)
}

// print writes the many-accounts line of the text report (nothing for nil).
func (m *ManyReport) print(w io.Writer) {
	if m != nil {
		fmt.Fprintf(w, "\nmany accounts: %s\n", m.line())
	}
}

// markdown writes it for BENCHMARKS.md.
func (m *ManyReport) markdown(w io.Writer) {
	if m != nil {
		fmt.Fprintf(w, "\nMany accounts: %s.\n", m.line())
	}
}
