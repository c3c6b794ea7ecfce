package bench

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"runtime/debug"
	"time"

	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/internal/platform/config"
	"github.com/ledgerworks/ledger/internal/testing/bench/seed"
	"github.com/ledgerworks/ledger/projections"
)

// HistoryReport is what the history phase measured: a history seeded in the
// ledger's event store, then every projection rebuilt (checked) and the whole
// ledger audited on it, each timed with its peak heap.
type HistoryReport struct {
	Seeded int64 `json:"seeded_events"`
	// Accounts is the history's accounts: its own, opened by it, IDs
	// FirstAccount to LastAccount (seed.HistoryAccount).
	Accounts     int    `json:"accounts"`
	FirstAccount string `json:"first_account"`
	LastAccount  string `json:"last_account"`
	// OtherAccounts is the accounts the systems' phases opened in the same
	// event store before it (the ledger's load phase's and many-accounts
	// phase's; 0 with --systems none): the rebuild and the audit read them
	// too.
	OtherAccounts int     `json:"other_accounts"`
	SeedSeconds   float64 `json:"seed_seconds"`
	Rebuild       ToolRun `json:"rebuild"`
	Audit         ToolRun `json:"audit"`
	// Snapshots is the account snapshots the audit checked (the seeding
	// ledger's, HistorySnapshotEvery).
	Snapshots int `json:"audit_snapshots_checked"`
}

// ToolRun is one timed run of a read-side tool over the whole store.
type ToolRun struct {
	Events       int64   `json:"events"`
	Seconds      float64 `json:"seconds"`
	EventsPerSec float64 `json:"events_per_sec"`
	PeakHeapMB   float64 `json:"peak_heap_mib"` // above the heap in use before it started
	// MemoryLimitMB is the runtime's soft memory limit it ran under (0: none).
	MemoryLimitMB float64 `json:"memory_limit_mib,omitempty"`
	Error         string  `json:"error,omitempty"`
}

// historyPhase seeds about n events over accounts accounts of its own in the
// ledger's event store (storeURL), beside the other accounts the systems'
// phases opened there, then rebuilds every projection in the read-model
// database (url) and audits the ledger, timing both, each under cfg's
// HistoryMemoryLimit.
func historyPhase(ctx context.Context, url, storeURL, runID string, other int, cfg Config, log *slog.Logger) (*HistoryReport, error) {
	n, accounts, components := cfg.HistoryEvents, cfg.Accounts, cfg.Logger
	store, err := config.OpenEventStore(ctx, storeURL, components)
	if err != nil {
		return nil, err
	}
	defer store.Close()
	pool, err := projections.NewPool(ctx, url)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	auditPool, err := projections.NewAuditPool(ctx, url) // as `ledger audit` opens it
	if err != nil {
		return nil, err
	}
	defer auditPool.Close()
	prefix := "hist" + runID
	rep := &HistoryReport{Accounts: accounts, OtherAccounts: other,
		FirstAccount: seed.HistoryAccount(prefix, 0), LastAccount: seed.HistoryAccount(prefix, int64(accounts-1))}
	start := time.Now()
	res, err := seed.History(ctx, store, n, seed.HistoryOptions{Accounts: accounts, KeyPrefix: prefix, SnapshotEvery: cfg.HistorySnapshotEvery,
		Progress: func(done, total int64) { log.Info("bench: seeding history", "events", done, "of", total) }})
	rep.Seeded, rep.SeedSeconds = res.Events, time.Since(start).Seconds()
	if err != nil {
		return rep, err
	}
	log.Info("bench: seeded history", "events", res.Events, "commands", res.Commands, "rejected", res.Rejected, "took", time.Since(start).Round(time.Millisecond))

	limit := func() (restore func(), err error) {
		return config.SetMemoryLimit(cmp.Or(cfg.HistoryMemoryLimit, config.ReadToolMemoryLimit), cfg.HistoryMemoryLimitSet)
	}
	rep.Rebuild = timeTool(limit, func(progress func(done, carried int64)) (int64, error) {
		results, err := projections.Rebuild(ctx, pool, store, projections.RebuildOptions{
			Check: audit.VerifyGeneration(pool, store), Logger: components, Progress: progress})
		if len(results) == 0 {
			return 0, err
		}
		return results[0].Events, err
	}, log, "rebuild")
	rep.Audit = timeTool(limit, func(progress func(done, carried int64)) (int64, error) {
		r, err := audit.Run(ctx, store, audit.Options{ReadModels: auditPool, Progress: progress})
		if err != nil {
			return 0, err
		}
		rep.Snapshots = r.Snapshots
		if !r.OK() {
			return r.Events, fmt.Errorf("audit found %d violations: %s", r.ViolationCount, r.Violations[0])
		}
		return r.Events, nil
	}, log, "audit")
	return rep, ctx.Err()
}

// timeTool runs a tool under the memory limit limit sets (put back after),
// logging its progress, and measures its time and peak heap.
func timeTool(limit func() (func(), error), run func(progress func(done, carried int64)) (int64, error), log *slog.Logger, name string) ToolRun {
	restore, err := limit()
	if err != nil {
		return ToolRun{Error: err.Error()}
	}
	defer restore()
	base := heapInUse(true)
	peak := sampleHeapPeak()
	last := time.Now()
	start := time.Now()
	events, err := run(func(done, _ int64) {
		if time.Since(last) > 2*time.Second {
			last = time.Now()
			log.Info("bench: "+name, "events", done, "rate", int(float64(done)/time.Since(start).Seconds()))
		}
	})
	r := ToolRun{Events: events, Seconds: time.Since(start).Seconds(), PeakHeapMB: mib(peak() - base)}
	if l := debug.SetMemoryLimit(-1); l != math.MaxInt64 { // -1 reads it
		r.MemoryLimitMB = mib(l)
	}
	if r.Seconds > 0 {
		r.EventsPerSec = float64(events) / r.Seconds
	}
	if err != nil {
		r.Error = err.Error()
	}
	log.Info("bench: "+name+" done", "events", r.Events, "seconds", r.Seconds, "peak_heap_mib", r.PeakHeapMB, "error", r.Error)
	return r
}

// print writes the phase's lines; the last two are the rates the issue asks for.
func (h *HistoryReport) print(w io.Writer) {
	fmt.Fprintf(w, "\nhistory: %d events seeded over %d accounts in %.1fs (its own, %s to %s; ", h.Seeded, h.Accounts, h.SeedSeconds, h.FirstAccount, h.LastAccount)
	if h.OtherAccounts > 0 {
		fmt.Fprintf(w, "the store also holds the %d accounts this run's other phases opened, which the tools read too)\n", h.OtherAccounts)
	} else {
		fmt.Fprintln(w, "no other account opened by this run)")
	}
	tools := []struct {
		name, rate string
		run        ToolRun
	}{{"rebuild (every projection, checked)", "rebuild", h.Rebuild}, {"audit (read models compared)", "audit", h.Audit}}
	for _, t := range tools {
		if !t.run.ran() {
			fmt.Fprintf(w, "  %s: not run (the run ended before it)\n", t.name)
			continue
		}
		fmt.Fprintf(w, "  %s: %d events in %.1fs, peak heap %.0f MiB", t.name, t.run.Events, t.run.Seconds, t.run.PeakHeapMB)
		if t.run.Error != "" {
			fmt.Fprintf(w, "  error: %s", t.run.Error)
		}
		fmt.Fprintln(w)
	}
	for _, t := range tools {
		if t.run.ran() {
			fmt.Fprintf(w, "%s events/s: %.0f\n", t.rate, t.run.EventsPerSec)
		}
	}
}

// ran reports whether the tool was run: a run takes time or fails; one the
// bench never started (interrupted before it) is the zero ToolRun.
func (r ToolRun) ran() bool { return r.Seconds > 0 || r.Error != "" }
