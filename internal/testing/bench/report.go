package bench

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// PhaseResult is one driven phase of one system.
type PhaseResult struct {
	System string `json:"system"`
	Phase  string `json:"phase"`
	Mode   string `json:"mode"`
	// Seconds is the measured wall time.
	Seconds float64 `json:"seconds"`
	// Commands answered (applied or rejected, duplicates included).
	Commands       int64   `json:"commands"`
	CommandsPerSec float64 `json:"commands_per_sec"`
	// Duplicates answered with duplicate: true.
	Duplicates       int64   `json:"duplicates"`
	DuplicatesPerSec float64 `json:"duplicates_per_sec"`
	NewApplied       int64   `json:"new_applied"`
	// NewAnswered counts new keys that got an outcome (applied or rejected, by
	// this path or, when EarlyDuplicates, by the JetStream consumer first).
	NewAnswered int64 `json:"new_answered"`
	// EarlyDuplicates: new keys answered as duplicates because the JetStream
	// consumer decided the captured copy first (a grace shorter than the reply).
	EarlyDuplicates int64 `json:"early_duplicates"`
	Rejected        int64 `json:"rejected"`
	Errors          int64 `json:"errors"`
	// Anomalies: resends not answered as duplicates (an idempotency failure).
	Anomalies int64 `json:"anomalies"`
	// TargetRate is the offered rate of an open-loop phase.
	TargetRate   float64  `json:"target_rate,omitempty"`
	P50Ms        float64  `json:"p50_ms"`
	P99Ms        float64  `json:"p99_ms"`
	P999Ms       float64  `json:"p999_ms"`
	MaxMs        float64  `json:"max_ms"`
	CPU          *CPUUse  `json:"cpu,omitempty"`
	ErrorSamples []string `json:"error_samples,omitempty"`
	// Transactions and MeanBatch: the ledger's group-commit transactions in the
	// phase and the commands each carried on average (0 for the baseline).
	Transactions int64   `json:"transactions,omitempty"`
	MeanBatch    float64 `json:"mean_batch,omitempty"`
	// StoreAppendsPerCommand and StoreReadsPerCommand: the calls the in-process
	// KurrentDB test server received in the phase (appends; stream reads and
	// subscriptions), per answered command (0 on another event store).
	StoreAppendsPerCommand float64 `json:"store_appends_per_command,omitempty"`
	StoreReadsPerCommand   float64 `json:"store_reads_per_command,omitempty"`
	// PoolAcquiresPerCommand is the connections the ledger took from its
	// PostgreSQL event store's pool in the phase (one per statement or
	// transaction: its round trips) per answered command;
	// PoolWaitsPerCommand those that waited for a free one, PoolMeanWaitMs
	// the mean wait of an acquire. ColdLoadsPerCommand is the aggregates the
	// ledger loaded cold per answered command, ColdLoadsPerRound the mean
	// streams of one grouped cold-load request.
	PoolAcquiresPerCommand float64 `json:"pool_acquires_per_command,omitempty"`
	PoolWaitsPerCommand    float64 `json:"pool_waits_per_command,omitempty"`
	PoolMeanWaitMs         float64 `json:"pool_mean_wait_ms,omitempty"`
	ColdLoadsPerCommand    float64 `json:"cold_loads_per_command,omitempty"`
	ColdLoadsPerRound      float64 `json:"cold_loads_per_round,omitempty"`
	// WarmupNewAnswered counts the new commands answered by the unrecorded
	// warm-up that preceded the phase (they were applied all the same).
	WarmupNewAnswered int64 `json:"warmup_new_answered,omitempty"`
	// SyncStandbyNames is the primary's synchronous_standby_names during a
	// phase of the pair/lone comparison, and SyncRepWaits the backends seen
	// waiting for the standby (wait event SyncRep) by SyncRepSamples samples
	// of pg_stat_activity every 10 ms through it (pairload.go).
	SyncStandbyNames *string `json:"synchronous_standby_names,omitempty"`
	SyncRepWaits     int64   `json:"syncrep_waits,omitempty"`
	SyncRepSamples   int64   `json:"syncrep_samples,omitempty"`
	// PG is PostgreSQL's checkpoints and WAL through a ledger phase on
	// PostgreSQL (pgstate.go).
	PG *PGPhase `json:"pg,omitempty"`
	// ResidentCompactions are the compactions of the residents' arena in
	// the phase, ResidentCompactionMs the time they held its lock in all
	// (ledger_resident_compaction_seconds).
	ResidentCompactions  int64   `json:"resident_compactions,omitempty"`
	ResidentCompactionMs float64 `json:"resident_compaction_ms,omitempty"`
	// Timeline is the phase second by second (request-reply phases).
	Timeline []SecondStat `json:"timeline,omitempty"`
}

func (p PhaseResult) batch() string {
	if p.Transactions == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", p.MeanBatch)
}

// Phases of each system.
const (
	PhaseLoad = "load"
	// PhaseHot is the load phase with every client on one account.
	PhaseHot        = "hot"
	PhaseDuplicates = "duplicates"
	PhaseHalfLoad   = "half-load"
	PhaseCapture    = "capture"
	PhaseJSPublish  = "js-publish"
	PhaseJSConsume  = "js-consume"
	// PhaseBatch is the load phase's clients sending their commands in
	// batches (ledger.v1.cmd.batch, BatchSize commands a request); PhaseHotBatch
	// the same with every command on one account.
	PhaseBatch    = "batch"
	PhaseHotBatch = "hot batch"
)

// Machine describes where the run happened.
type Machine struct {
	Cores       int      `json:"cores"`
	MemoryMB    int64    `json:"memory_mb"`
	GoVersion   string   `json:"go_version"`
	LoadBefore  string   `json:"loadavg_before"`
	LoadAfter   string   `json:"loadavg_after"`
	Fsync       bool     `json:"fsync"`
	PostgresVer string   `json:"postgres_version,omitempty"`
	Notes       []string `json:"notes,omitempty"`
}

// Report is the outcome of Run.
type Report struct {
	Started    time.Time         `json:"started"`
	Seconds    float64           `json:"seconds"`
	Config     ReportConfig      `json:"config"`
	Machine    Machine           `json:"machine"`
	Phases     []PhaseResult     `json:"phases"`
	KeyCheck   *KeyCheckReport   `json:"key_check,omitempty"`
	Projection *ProjectionReport `json:"projection,omitempty"`
	History    *HistoryReport    `json:"history,omitempty"`
	Many       *ManyReport       `json:"many_accounts,omitempty"`
	// Ratio is ledger/baseline commands per second in the load phase (0 when
	// either was not driven).
	Ratio float64 `json:"ratio_ledger_baseline"`
	// HotRatio is the ledger's commands per second in the hot phase over its
	// load phase's (0 when either was not driven): what a hot account costs.
	HotRatio float64 `json:"ratio_hot_uniform"`
	// BatchRatio is the ledger's commands per second in the batch phase over
	// its load phase's (one command a request); HotBatchRatio its hot batch
	// phase's over its batch phase's (0 when either was not driven).
	BatchRatio    float64 `json:"ratio_batch_single"`
	HotBatchRatio float64 `json:"ratio_hot_batch_batch"`
	// PairRatio is the ledger's commands per second in its load phases on the
	// pair with the synchronous standby required over those with it cleared,
	// alternated in the same run (0 without --standby).
	PairRatio float64 `json:"ratio_pair_lone,omitempty"`
	// ManyRatio is the ledger's commands per second in its many-accounts
	// phase over its load phase's (0 without it): what the number of
	// accounts costs.
	ManyRatio float64 `json:"ratio_many_few,omitempty"`
}

// ReportConfig is the part of Config a reader needs to reproduce a run.
type ReportConfig struct {
	Clients        int     `json:"clients"`
	Accounts       int     `json:"accounts"`
	DuplicateRatio float64 `json:"duplicate_ratio"`
	Skew           float64 `json:"skew"`
	// TransactionRatio is the share of new commands that are transactions.
	TransactionRatio float64 `json:"transaction_ratio,omitempty"`
	HottestShare     float64 `json:"hottest_account_share"`
	Duration         string  `json:"duration"`
	Capture          bool    `json:"capture"`
	Grace            string  `json:"grace"`
	// NATSSync is how JetStream fsyncs: "always" or an interval.
	NATSSync         string `json:"nats_sync"`
	MaxInFlight      int    `json:"max_in_flight"`
	GroupCommit      bool   `json:"group_commit"`
	BatchMax         int    `json:"batch_max,omitempty"`
	BatchWait        string `json:"batch_wait,omitempty"`
	Committers       int    `json:"committers,omitempty"`
	BaselinePoolSize int    `json:"baseline_pool_size"`
	// BaselineLockedRead: the baseline reads an existing key with SELECT … FOR UPDATE.
	BaselineLockedRead bool `json:"baseline_select_for_update"`
	JetStreamMessages  int  `json:"jetstream_messages"`
	KeyCheckEvents     int  `json:"key_check_events"`
	// EventStore is the ledger's event store: postgres, kurrenttest, or a
	// KurrentDB URL without its secrets (Config.EventStore).
	EventStore string `json:"event_store"`
	// Target is Config.TargetNATSURL: the NATS URL of a ledger in another
	// process, the only system driven; empty when the bench started its own.
	Target string `json:"target,omitempty"`
}

// Phase returns the result of a system's phase, or nil.
func (r *Report) Phase(system, phase string) *PhaseResult {
	for i := range r.Phases {
		if r.Phases[i].System == system && r.Phases[i].Phase == phase {
			return &r.Phases[i]
		}
	}
	return nil
}

// RatioLine is the last line of the printed report.
func (r *Report) RatioLine() string {
	return fmt.Sprintf("ratio ledger/baseline commands/s: %.2f", r.Ratio)
}

// PairRatioLine comes before HotRatioLine in a run on the pair.
func (r *Report) PairRatioLine() string {
	return fmt.Sprintf("ratio pair/lone commands/s: %.2f", r.PairRatio)
}

// ManyRatioLine comes just before RatioLine in a run with the many-accounts
// phases.
func (r *Report) ManyRatioLine() string {
	return fmt.Sprintf("ratio many/few accounts commands/s: %.2f", r.ManyRatio)
}

// HotRatioLine is the third line from the end.
func (r *Report) HotRatioLine() string {
	return fmt.Sprintf("ratio hot/uniform commands/s: %.2f", r.HotRatio)
}

// BatchRatioLine is the line before the last one: what batches bring.
func (r *Report) BatchRatioLine() string {
	return fmt.Sprintf("ratio batch/single commands/s: %.2f", r.BatchRatio)
}

func fmtCPU(c *CPUUse) string {
	if c == nil {
		return "-"
	}
	return fmt.Sprintf("%.2f/%.2f/%.2f", c.Bench, c.Postgres, c.Other)
}

// Print writes the report as text: the table of phases, the key check, the
// projection, the targets of issue 7, and last the ratio line.
func (r *Report) Print(w io.Writer) {
	r.printHeader(w)
	r.printPhases(w)
	if k := r.KeyCheck; k != nil {
		k.print(w)
	}
	if p := r.Projection; p != nil {
		p.print(w)
	}
	r.Many.print(w)
	r.printTargets(w)
	if r.History != nil {
		r.History.print(w)
	}
	r.printRatios(w)
}

// Measured reports whether r holds anything measured: a phase, or what a
// phase after the systems' measured (a --systems none run has no phase, and
// one interrupted in its history has the history's figures so far). A nil r
// measured nothing.
func (r *Report) Measured() bool {
	return r != nil && (len(r.Phases) > 0 || r.KeyCheck != nil || r.Projection != nil || r.History != nil || r.Many != nil)
}

// printHeader writes the workload, the machine and the settings (or the
// target's address).
func (r *Report) printHeader(w io.Writer) {
	c := r.Config
	fmt.Fprintf(w, "\nledger bench: %d clients, %d accounts (skew %.2f, hottest account %.2f%% of commands), duplicate ratio %.2f, transaction ratio %.2f, %s per load phase\n",
		c.Clients, c.Accounts, c.Skew, 100*c.HottestShare, c.DuplicateRatio, c.TransactionRatio, c.Duration)
	fsync := onOff(r.Machine.Fsync)
	if c.Target != "" {
		fsync = "the target's"
	}
	fmt.Fprintf(w, "machine: %d cores, %d MiB, %s, fsync %v; load average before %s, after %s\n",
		r.Machine.Cores, r.Machine.MemoryMB, r.Machine.GoVersion, fsync, r.Machine.LoadBefore, r.Machine.LoadAfter)
	if c.Target != "" {
		fmt.Fprintf(w, "%s\n\n", targetLine(c))
	} else {
		r.printSettings(w)
	}
}

// printPhases writes the table of phases, the store's calls and the pool's
// lines, and the phases' error samples; without a phase (--systems none), a
// line that says so.
func (r *Report) printPhases(w io.Writer) {
	if len(r.Phases) == 0 {
		fmt.Fprintln(w, "no system driven: no phase of the systems")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "system\tphase\tcommands/s\tp50 ms\tp99 ms\tp99.9 ms\tduplicates/s\tapplied\terrors\tanomalies\tearly dups\tbatch\tcpu bench/pg/other\tmode\t")
	for _, p := range r.Phases {
		lat := func(v float64) string {
			if p.P50Ms == 0 && p.P99Ms == 0 {
				return "-"
			}
			return fmt.Sprintf("%.2f", v)
		}
		fmt.Fprintf(tw, "%s\t%s\t%.0f\t%s\t%s\t%s\t%.0f\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t\n",
			p.System, p.Phase, p.CommandsPerSec, lat(p.P50Ms), lat(p.P99Ms), lat(p.P999Ms), p.DuplicatesPerSec,
			p.NewApplied, p.Errors, p.Anomalies, p.EarlyDuplicates, p.batch(), fmtCPU(p.CPU), p.Mode)
	}
	tw.Flush()
	if l := r.storeCallsLine(); l != "" {
		fmt.Fprintln(w, l)
	}
	if l := r.poolLine(); l != "" {
		fmt.Fprintln(w, l)
	}
	for _, p := range r.Phases {
		for _, e := range p.ErrorSamples {
			fmt.Fprintf(w, "  %s/%s error: %s\n", p.System, p.Phase, e)
		}
	}
}

// print writes the key check's table and its long/short ratios.
func (k *KeyCheckReport) print(w io.Writer) {
	fmt.Fprintf(w, "\nkey check (ledger.Service on the %s store; duplicates and decide-only: best of %d rounds; decide+append and p99: %d timed commands):\n", storeName(k.EventStore), keyCheckRounds, k.Samples)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "events\tcold load ms\tcold load peak heap MiB\theld heap MiB\tduplicate ns (10 keys)\tduplicate ns (spread)\tduplicate p99 µs\tdecide+append p50 µs\tdecide+append p99 µs\tdecide only ns (latest 10)\tdecide only ns (latest)\tseeded in s\t")
	for _, s := range []KeyCheckStream{k.Short, k.Long} {
		fmt.Fprintf(tw, "%d\t%.1f\t%.1f\t%.1f\t%.0f\t%.0f\t%.1f\t%.0f\t%.0f\t%.0f\t%.0f\t%.1f\t\n", s.Events, s.ColdLoadMs, s.PeakHeapMB, s.HeldHeapMB, s.Duplicate10Ns, s.DuplicateSpreadNs,
			s.DuplicateP99Us, s.DecideP50Us, s.DecideP99Us, s.DecideOnly10Ns, s.DecideOnlySpreadNs, s.SeedSeconds)
	}
	tw.Flush()
	fmt.Fprintf(w, "long/short: duplicate %.2fx (10 keys), %.2fx (spread over %d keys); decide+append p50 %.2fx; decide only %.2fx (10 keys), %.2fx (spread)\n",
		k.Duplicate10Ratio, k.DuplicateSpreadRatio, k.Long.SpreadKeys, k.DecideRatio, k.DecideOnly10Ratio, k.DecideOnlySpreadRatio)
	fmt.Fprintln(w, k.FirstResendLine())
}

// print writes the projection's rate and its error sample.
func (p *ProjectionReport) print(w io.Writer) {
	state := "caught up"
	if !p.CaughtUp {
		state = "stopped by its time bound before catching up"
	}
	fmt.Fprintf(w, "\nprojection: %d events in %.1fs = %.0f events/s (%d projections, %s; cpu bench/pg/other %s)\n",
		p.Events, p.Seconds, p.EventsPerSec, p.Projections, state, fmtCPU(p.CPU))
	if p.ErrorSample != "" {
		fmt.Fprintf(w, "  projection error: %s\n", p.ErrorSample)
	}
}

// printRatios writes the ratio lines, the main one last.
func (r *Report) printRatios(w io.Writer) {
	fmt.Fprintln(w)
	if r.PairRatio > 0 {
		fmt.Fprintln(w, r.PairRatioLine())
	}
	fmt.Fprintf(w, "%s\n%s\n", r.HotRatioLine(), r.BatchRatioLine())
	if r.ManyRatio > 0 {
		fmt.Fprintln(w, r.ManyRatioLine())
	}
	fmt.Fprintln(w, r.RatioLine())
}

// storeCallsLine gives the test server's calls per command of each phase that
// counted them, or "".
func (r *Report) storeCallsLine() string {
	var parts []string
	for _, p := range r.Phases {
		if p.StoreAppendsPerCommand > 0 || p.StoreReadsPerCommand > 0 {
			parts = append(parts, fmt.Sprintf("%s/%s %.2f appends, %.2f reads", p.System, p.Phase, p.StoreAppendsPerCommand, p.StoreReadsPerCommand))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return "calls to the KurrentDB test server per answered command: " + strings.Join(parts, "; ")
}

// poolLine gives, for each of the ledger's phases that measured them, its
// store pool's acquires and waits and its cold loads per command, or "".
func (r *Report) poolLine() string {
	var parts []string
	for _, p := range r.Phases {
		if p.PoolAcquiresPerCommand > 0 {
			parts = append(parts, fmt.Sprintf("%s %.2f acquires (%.2f waited, mean wait %.2f ms), %.2f cold loads (%.1f a request)",
				p.Phase, p.PoolAcquiresPerCommand, p.PoolWaitsPerCommand, p.PoolMeanWaitMs, p.ColdLoadsPerCommand, p.ColdLoadsPerRound))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return "the ledger's PostgreSQL pool per answered command (a connection per statement or transaction): " + strings.Join(parts, "; ")
}

func baselineRead(c ReportConfig) string {
	if c.BaselineLockedRead {
		return fmt.Sprintf("an existing key is read with SELECT ... FOR UPDATE (seed 000), %d connections", c.BaselinePoolSize)
	}
	return fmt.Sprintf("an existing key is read with a plain SELECT (seed 002), %d connections", c.BaselinePoolSize)
}

func groupCommit(c ReportConfig) string {
	if isKurrent(c.EventStore) {
		return "none (KurrentDB appends to one stream at a time: a command's key claim key-<K>, then its account's events)"
	}
	if !c.GroupCommit {
		return "off"
	}
	s := "on"
	if c.BatchMax > 0 || c.BatchWait != "" || c.Committers > 0 {
		s += fmt.Sprintf(" (max batch %d, wait %s, committers %d; 0: default)", c.BatchMax, c.BatchWait, c.Committers)
	}
	return s
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// printTargets compares the run with the targets of issues 7 and 12.
func (r *Report) printTargets(w io.Writer) {
	type target struct {
		name     string
		want     string
		got      float64
		ok       bool
		measured bool
		unit     string
	}
	var ts []target
	if p := r.Phase(SystemLedger, PhaseLoad); p != nil {
		ts = append(ts, target{"commands/s over NATS", ">= 15000", p.CommandsPerSec, p.CommandsPerSec >= 15000, true, "/s"})
	}
	if r.Ratio > 0 {
		ts = append(ts, target{"ledger/baseline commands/s", ">= 5", r.Ratio, r.Ratio >= 5, true, "x"})
	}
	if r.HotRatio > 0 {
		ts = append(ts, target{"hot/uniform commands/s (one account / the load phase's)", ">= 0.8", r.HotRatio, r.HotRatio >= 0.8, true, "x"})
	}
	if r.BatchRatio > 0 {
		ts = append(ts, target{"batch/single commands/s (batches of the load phase's commands / one a request)", ">= 5", r.BatchRatio, r.BatchRatio >= 5, true, "x"})
	}
	if r.HotBatchRatio > 0 {
		ts = append(ts, target{"hot batch/batch commands/s (one account / spread)", ">= 0.8", r.HotBatchRatio, r.HotBatchRatio >= 0.8, true, "x"})
	}
	if r.ManyRatio > 0 {
		ts = append(ts, target{"many/few accounts commands/s (the load phase over many accounts / over --accounts)", ">= 0.8", r.ManyRatio, r.ManyRatio >= 0.8, true, "x"})
	}
	if p := r.Phase(SystemLedger, PhaseManyHalfLoad); p != nil {
		ts = append(ts, target{"p99 at half load over many accounts (ms)", "<= 20", p.P99Ms, p.P99Ms <= 20, true, "ms"})
	}
	if m := r.Many; m != nil && m.LedgerHeapMB > 0 {
		ts = append(ts, target{"the ledger's heap over many accounts (MiB)", "<= 1024", m.LedgerHeapMB, m.LedgerHeapMB <= 1024, true, "MiB"})
	}
	if p := r.Phase(SystemLedger, PhaseDuplicates); p != nil {
		ts = append(ts, target{"duplicates/s", ">= 30000", p.DuplicatesPerSec, p.DuplicatesPerSec >= 30000, true, "/s"})
	}
	if p := r.Phase(SystemLedger, PhaseHalfLoad); p != nil {
		ts = append(ts, target{"p99 at half of max load (ms)", "<= 10", p.P99Ms, p.P99Ms <= 10, true, "ms"})
	}
	if k := r.KeyCheck; k != nil {
		ts = append(ts, target{fmt.Sprintf("key check %d/%d events, same 10 keys (worst ratio)", k.Long.Events, k.Short.Events), "<= 1.2", k.LikeForLike(), k.LikeForLike() <= 1.2, true, "x"})
		ts = append(ts, target{fmt.Sprintf("key check %d/%d events, keys spread (worst ratio)", k.Long.Events, k.Short.Events), "<= 1.2", k.Spread(), k.Spread() <= 1.2, true, "x"})
		if p99, ok := k.OldKeyP99Ms(); ok {
			ts = append(ts, target{fmt.Sprintf("p99 of a duplicate of an old key, %d events (ms)", k.Long.Events), "<= 2", p99, p99 <= 2, true, "ms"})
		}
	}
	if len(ts) == 0 {
		return
	}
	fmt.Fprintf(w, "\ntargets (issues 7, 12 and 27):\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, t := range ts {
		verdict := "met"
		if !t.ok {
			verdict = "MISSED"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", t.name, t.want, strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.2f", t.got), "0"), "."), verdict)
	}
	tw.Flush()
}

// targetLine says, for a run that drove a ledger in another process
// (Config.Target), that none of the settings of this process's systems
// describes it.
func targetLine(c ReportConfig) string {
	return fmt.Sprintf("target: a ledger in another process at %s (its event store, capture and group commit are its own)", c.Target)
}

// Markdown writes the report as Markdown tables (for BENCHMARKS.md).
func (r *Report) Markdown(w io.Writer) {
	c := r.Config
	settings, machine := targetLine(c), fmt.Sprintf("%d cores, %d MiB, %s", r.Machine.Cores, r.Machine.MemoryMB, r.Machine.GoVersion)
	if c.Target == "" {
		settings = fmt.Sprintf("JetStream capture %s (grace %s, fsync %s); baseline: %s; ledger event store: %s; ledger group commit %s",
			onOff(c.Capture), c.Grace, c.NATSSync, baselineRead(c), eventStoreLine(c.EventStore), groupCommit(c))
		machine += fmt.Sprintf(", PostgreSQL %s with fsync %s", r.Machine.PostgresVer, onOff(r.Machine.Fsync))
	}
	fmt.Fprintf(w, "%d clients, %d accounts (skew %.2f: the hottest account gets %.2f%% of the commands), duplicate ratio %.2f, transaction ratio %.2f, load phase %s; "+
		"%s. Machine: %s; load average before %s, after %s. Run took %.0fs, started %s.\n\n",
		c.Clients, c.Accounts, c.Skew, 100*c.HottestShare, c.DuplicateRatio, c.TransactionRatio, c.Duration, settings,
		machine, r.Machine.LoadBefore, r.Machine.LoadAfter, r.Seconds, r.Started.UTC().Format(time.RFC3339))
	fmt.Fprintln(w, "| system | phase | commands/s | p50 ms | p99 ms | p99.9 ms | duplicates/s | new applied | errors | anomalies | early dups | commands per transaction | cores: bench / postgres / other | mode |")
	fmt.Fprintln(w, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|---|")
	for _, p := range r.Phases {
		lat := func(v float64) string {
			if p.P50Ms == 0 && p.P99Ms == 0 {
				return "-"
			}
			return fmt.Sprintf("%.2f", v)
		}
		fmt.Fprintf(w, "| %s | %s | %.0f | %s | %s | %s | %.0f | %d | %d | %d | %d | %s | %s | %s |\n", p.System, p.Phase, p.CommandsPerSec,
			lat(p.P50Ms), lat(p.P99Ms), lat(p.P999Ms), p.DuplicatesPerSec, p.NewApplied, p.Errors, p.Anomalies, p.EarlyDuplicates, p.batch(), fmtCPU(p.CPU), p.Mode)
	}
	if l := r.storeCallsLine(); l != "" {
		fmt.Fprintf(w, "\n%s%s.\n", strings.ToUpper(l[:1]), l[1:])
	}
	if l := r.poolLine(); l != "" {
		fmt.Fprintf(w, "\n%s%s.\n", strings.ToUpper(l[:1]), l[1:])
	}
	if k := r.KeyCheck; k != nil {
		fmt.Fprintf(w, "\nKey check (ledger.Service on the %s store; duplicates and decide-only: best of %d rounds; decide+append and p99: %d timed commands):\n\n", storeName(k.EventStore), keyCheckRounds, k.Samples)
		fmt.Fprintln(w, "| events | cold load ms | cold load peak heap MiB | held heap MiB | duplicate ns (10 keys) | duplicate ns (spread) | duplicate p99 µs | decide+append p50 µs | decide+append p99 µs | decide only ns (latest 10) | decide only ns (latest) | seeded in s |")
		fmt.Fprintln(w, "|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
		for _, s := range []KeyCheckStream{k.Short, k.Long} {
			fmt.Fprintf(w, "| %d | %.1f | %.1f | %.1f | %.0f | %.0f | %.1f | %.0f | %.0f | %.0f | %.0f | %.1f |\n", s.Events, s.ColdLoadMs, s.PeakHeapMB, s.HeldHeapMB, s.Duplicate10Ns, s.DuplicateSpreadNs,
				s.DuplicateP99Us, s.DecideP50Us, s.DecideP99Us, s.DecideOnly10Ns, s.DecideOnlySpreadNs, s.SeedSeconds)
		}
		fmt.Fprintf(w, "\nLong/short: duplicate %.2fx (10 keys), %.2fx (spread over %d keys); decide+append p50 %.2fx; decide only %.2fx (10 keys), %.2fx (spread).\n",
			k.Duplicate10Ratio, k.DuplicateSpreadRatio, k.Long.SpreadKeys, k.DecideRatio, k.DecideOnly10Ratio, k.DecideOnlySpreadRatio)
		fmt.Fprintf(w, "\n%s.\n", strings.ToUpper(k.FirstResendLine()[:1])+k.FirstResendLine()[1:])
	}
	if p := r.Projection; p != nil {
		state := "caught up"
		if !p.CaughtUp {
			state = "stopped by its time bound"
		}
		fmt.Fprintf(w, "\nProjection: %d events in %.1fs = **%.0f events/s** (%d projections, %s; cores bench/postgres/other %s).\n",
			p.Events, p.Seconds, p.EventsPerSec, p.Projections, state, fmtCPU(p.CPU))
	}
	if r.PairRatio > 0 {
		fmt.Fprintf(w, "\n`%s`\n", r.PairRatioLine())
	}
	r.Many.markdown(w)
	fmt.Fprintf(w, "\n`%s`\n\n`%s`\n", r.HotRatioLine(), r.BatchRatioLine())
	if r.ManyRatio > 0 {
		fmt.Fprintf(w, "\n`%s`\n", r.ManyRatioLine())
	}
	fmt.Fprintf(w, "\n`%s`\n", r.RatioLine())
}

// printSettings writes how the systems this bench started were set up.
func (r *Report) printSettings(w io.Writer) {
	c := r.Config
	capture := "off (plain request-reply)"
	if c.Capture {
		capture = "on (LEDGER_COMMANDS stores every command, fsync " + c.NATSSync + "; the consumer confirms each after " + c.Grace + ")"
	}
	fmt.Fprintf(w, "JetStream capture of request-reply: %s\n", capture)
	fmt.Fprintf(w, "ledger event store: %s\n", eventStoreLine(c.EventStore))
	fmt.Fprintf(w, "baseline: %s; ledger group commit %s\n\n", baselineRead(c), groupCommit(c))
}
