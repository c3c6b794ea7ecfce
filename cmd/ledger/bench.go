package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/ledgerworks/ledger/internal/platform/config"
	"github.com/ledgerworks/ledger/internal/platform/embednats"
	"github.com/ledgerworks/ledger/internal/testing/bench"
)

const (
	flagBenchQuick        = "quick"
	flagBenchClients      = "clients"
	flagBenchAccounts     = "accounts"
	flagBenchDupRatio     = "duplicate-ratio"
	flagBenchSkew         = "skew"
	flagBenchTxRatio      = "transaction-ratio"
	flagBenchDuration     = "duration"
	flagBenchWarmup       = "warmup"
	flagBenchFractions    = "open-loop-fractions"
	flagBenchSystems      = "systems"
	flagBenchJSMessages   = "jetstream-messages"
	flagBenchKeyEvents    = "key-check-events"
	flagBenchKeySamples   = "key-check-samples"
	flagBenchProjTimeout  = "projection-timeout"
	flagBenchHistory      = "history"
	flagBenchHistoryMem   = "history-memory-limit"
	flagBenchHistorySnap  = "history-snapshot-every"
	flagBenchMany         = "many-accounts"
	flagBenchManyCold     = "many-cold"
	flagBenchManyUnsettle = "many-unsettled"
	flagBenchCapture      = "capture"
	flagBenchGrace        = "grace"
	flagBenchMaxInFlight  = "max-in-flight"
	flagBenchLanes        = "lanes"
	flagBenchBatchSize    = "batch-size"
	flagBenchBatchMax     = "batch-max"
	flagBenchBatchWait    = "batch-wait"
	flagBenchCommitters   = "committers"
	flagBenchNoGroup      = "no-group-commit"
	flagBenchPoolSize     = "baseline-pool-size"
	flagBenchNoFsync      = "no-fsync"
	flagBenchStandby      = "standby"
	flagBenchNATSSync     = "nats-sync"
	flagBenchForUpdate    = "baseline-select-for-update"
	flagBenchCPUProfile   = "cpuprofile"
	flagBenchProfPhase    = "cpuprofile-phase"
	flagBenchMemProfile   = "memprofile"
	flagBenchTrace        = "trace"
	flagBenchTracePhase   = "trace-phase"
	flagBenchJSON         = "json"
	flagBenchMarkdown     = "markdown"
	flagBenchProgress     = "progress-interval"
	flagBenchLedgerDB     = "ledger-database-url"
	flagBenchTarget       = "target-nats-url"
	flagBenchBaselineDB   = "baseline-database-url"
	flagBenchComponentLog = "component-log-level"
	flagBenchEventStore   = "event-store"
)

func withCategory(f *cli.StringFlag, category string) *cli.StringFlag {
	f.Category = category
	return f
}

func benchEnv(name string) cli.ValueSourceChain {
	return cli.EnvVars("LEDGER_BENCH_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_")))
}

// categorySUT is the help's category of the flags of the systems under
// test: each sets up a part of this process (refuseTargetIgnored).
const categorySUT = "systems under test"

// benchDescription is the help text of ledger bench.
const benchDescription = "Starts everything in this process, as `ledger dev` does (an embedded NATS server, a private\n" +
	"PostgreSQL cluster with fsync on, the migrations, the ledger with its NATS intake), opens the\n" +
	"accounts and drives the ledger over NATS request-reply with --clients clients: a load phase\n" +
	"(--duplicate-ratio of resends), a hot phase (the same with every client on one account), a\n" +
	"duplicates phase (only resends), a half-load phase (open loop at half the load phase's rate)\n" +
	"and, with the capture on (--capture), two JetStream phases (js.Publish; publish for the consumer).\n" +
	"Then the baseline, the seed documents' idempotency-key table (one transaction per command),\n" +
	"behind the same intake on its own NATS server and its own database of the same cluster, through\n" +
	"the same phases. Then the key check on streams of 10 and --key-check-events events, and the\n" +
	"projector over everything written; with --history N, a history of N events seeded over\n" +
	"--accounts accounts of its own (besides the load phase's; --systems none drives no system, so\n" +
	"that the store holds the history's accounts alone, and runs none of a system's phases: JetStream,\n" +
	"many accounts are off, refused when asked for; --standby still makes the store a pair) and rebuilt and audited (the lines\n" +
	"`rebuild events/s: <n>` and `audit events/s: <n>` come just before the ratio lines). With --standby, the ledger's load phase again, half as long, lone\n" +
	"(the standby not required) then pair (required), twice, and the line\n" +
	"`ratio pair/lone commands/s: <number>` just before the ratio lines. With --many-accounts N\n" +
	"(default 1,000,000; --quick, or a run that does not drive the ledger, such as --systems baseline:\n" +
	"none, refused when asked for), the ledger's load phase again over N accounts opened for it\n" +
	"and warmed by it (none cached with --many-cold), PostgreSQL settled after that bulk load\n" +
	"(VACUUM (ANALYZE), CHECKPOINT: its phases then hold no timed checkpoint, but may one that\n" +
	"max_wal_size forces; --many-unsettled measures them through the bulk load's), then at half that rate, and the line `ratio many/few accounts\n" +
	"commands/s: <number>` (that phase over the load phase) just before the last line. --event-store puts the\n" +
	"ledger's events on KurrentDB (the in-process test server, or a real one by URL) instead; the\n" +
	"read models and the baseline stay on PostgreSQL. Progress goes to stderr; the report to\n" +
	"stdout, whose last three lines are `ratio hot/uniform commands/s: <number>` (the ledger's hot\n" +
	"phase over its load phase), `ratio batch/single commands/s: <number>` (its batch phase over\n" +
	"its load phase) and `ratio ledger/baseline commands/s: <number>`. Ctrl-C stops the run\n" +
	"cleanly."

func benchCommand() *cli.Command {
	d := bench.Defaults()
	load, sut, out := "load", categorySUT, "output"
	flags := []cli.Flag{
		&cli.BoolFlag{Name: flagBenchQuick, Usage: "a run of under a minute: 1,000 accounts, 4s phases, a 10,000-event key-check stream, plain request-reply without the JetStream capture and phases (flags set explicitly still win)", Sources: benchEnv(flagBenchQuick)},
		&cli.IntFlag{Name: flagBenchClients, Category: load, Value: d.Clients, Usage: "concurrent clients, each with one command in flight", Sources: benchEnv(flagBenchClients)},
		&cli.IntFlag{Name: flagBenchAccounts, Category: load, Value: d.Accounts, Usage: "accounts the commands spread over", Sources: benchEnv(flagBenchAccounts)},
		&cli.FloatFlag{Name: flagBenchDupRatio, Category: load, Value: d.DuplicateRatio, Usage: "share of the load phase's commands that resend an answered key", Sources: benchEnv(flagBenchDupRatio)},
		&cli.FloatFlag{Name: flagBenchSkew, Category: load, Value: d.Skew, Usage: "account skew: the account of rank i gets weight 1/i^skew (0: uniform; 1: Zipf)", Sources: benchEnv(flagBenchSkew)},
		&cli.FloatFlag{Name: flagBenchTxRatio, Category: load, Value: d.TransactionRatio, Usage: "share of new commands that are post_transaction of one posting, from the command's account to another drawn uniformly (in the hot phase too: the transactions touch the hot account); the ledger only (--systems ledger)", Sources: benchEnv(flagBenchTxRatio)},
		&cli.DurationFlag{Name: flagBenchDuration, Category: load, Value: d.Duration, Usage: "length of the load phase (the duplicates, half-load and batch phases take half)", Sources: benchEnv(flagBenchDuration)},
		&cli.IntFlag{Name: flagBenchBatchSize, Category: load, Value: d.BatchSize, Usage: "commands per request in the batch phases (ledger.v1.cmd.batch, 1-1000; refused where no system is driven: --systems none)", Sources: benchEnv(flagBenchBatchSize)},
		&cli.DurationFlag{Name: flagBenchWarmup, Category: load, Value: d.Warmup, Usage: "unrecorded load before the load phase", Sources: benchEnv(flagBenchWarmup)},
		&cli.StringFlag{Name: flagBenchFractions, Category: load, Value: "0.5", Usage: "open-loop phases, as fractions of the load phase's rate, comma-separated (0.5 is the half-load phase; refused where no system is driven: --systems none)", Sources: benchEnv(flagBenchFractions)},
		&cli.IntFlag{Name: flagBenchJSMessages, Category: load, Value: d.JetStreamMessages, Usage: "commands of each JetStream phase (0: skip them; where they do not run, without the capture, --capture=false or --quick, or without the ledger and the baseline, --systems echo or none: 0, refused when asked for)", Sources: benchEnv(flagBenchJSMessages)},
		&cli.IntFlag{Name: flagBenchKeyEvents, Category: load, Value: d.KeyCheckEvents, Usage: "events of the long stream of the key-check phase (0: skip it)", Sources: benchEnv(flagBenchKeyEvents)},
		&cli.IntFlag{Name: flagBenchKeySamples, Category: load, Value: d.KeyCheckSamples, Usage: "timed commands per kind and stream in the key-check phase (refused where it does not run: --key-check-events 0)", Sources: benchEnv(flagBenchKeySamples)},
		&cli.DurationFlag{Name: flagBenchProjTimeout, Category: load, Value: d.ProjectionTimeout, Usage: "bound on the projection phase (0: skip it)", Sources: benchEnv(flagBenchProjTimeout)},
		&cli.Int64Flag{Name: flagBenchHistory, Category: load, Usage: "seed about this many events over --accounts accounts of its own, opened by it, besides those this run's other phases opened in the same event store (the ledger's load phase's --accounts, --many-accounts, and the key check's two unless --key-check-events 0): with --systems none and --key-check-events 0 the history's are the only accounts this run opens (a reused --data-dir keeps earlier runs' too); the report names them (a mix of deposits, withdrawals, transfers, transactions, holds and refunds, decided by a ledger.Service of the bench's own and, on PostgreSQL, loaded with COPY in chunks of 50,000 events, snapshots included; on KurrentDB sent through the command handler), then time `projector rebuild` (checked) and `ledger audit` on the whole store (0: skip it)", Sources: benchEnv(flagBenchHistory)},
		&cli.IntFlag{Name: flagBenchHistorySnap, Category: load, Value: 1000, Usage: "events between snapshots of an account in the seeded history, as ledger serve's --snapshot-every (0 takes none): a history of fewer events an account than this has no snapshot for the audit to check (refused without --history)", Sources: benchEnv(flagBenchHistorySnap)},
		withCategory(config.MemoryLimitFlag(flagBenchHistoryMem, config.ReadToolMemoryLimit, " while the history phase rebuilds and audits (the whole process's; refused without --history)", benchEnv(flagBenchHistoryMem)), load),
		&cli.IntFlag{Name: flagBenchMany, Category: load, Value: d.ManyAccounts, Usage: "after the ledger's other phases, open this many accounts in its event store (decided in batches of 1,000 by a ledger.Service of the bench's own and, on PostgreSQL, loaded with COPY, behind the ledger's back), has the ledger warm them as a restart would (unless --many-cold) and drive the load phase's clients over them, then half that rate open loop; prints the ledger's live heap and the line 'ratio many/few accounts commands/s' (0: skip it; 0 by default under --quick; a run that does not drive the ledger, --systems baseline, echo or none: 0, refused when asked for)", Sources: benchEnv(flagBenchMany)},
		&cli.BoolFlag{Name: flagBenchManyCold, Category: load, Usage: "leave the many accounts cold: the ledger does not warm them once they are opened, so that every first command on one reads it from the event store (refused where the many-accounts phases do not run: --many-accounts 0, --quick, or no ledger driven)", Sources: benchEnv(flagBenchManyCold)},
		&cli.BoolFlag{Name: flagBenchManyUnsettle, Category: load, Usage: "skip the VACUUM (ANALYZE) and CHECKPOINT the bench runs on PostgreSQL once the many accounts are opened and warmed, as an operator does after a bulk load: the many-accounts phases may then run during the checkpoint of the rows just copied in and the warming's hint bits (BENCHMARKS.md; refused where those phases do not run, as --many-cold, and on KurrentDB, --event-store, where the bench settles nothing)", Sources: benchEnv(flagBenchManyUnsettle)},
		&cli.StringFlag{Name: flagBenchSystems, Category: sut, Value: "ledger,baseline", Usage: "systems to drive, in order, comma-separated: ledger, baseline, echo (a fixed reply: the ceiling of NATS request-reply here); or none: drive no system, only the phases after them (with --history: a history over --accounts accounts alone; the phases of a driven system, --jetstream-messages and --many-accounts, are then off, and refused when asked for; --standby's lone and pair load phases do not run)", Sources: benchEnv(flagBenchSystems)},
		&cli.BoolFlag{Name: flagBenchCapture, Category: sut, Value: d.Capture, Usage: "declare LEDGER_COMMANDS so that JetStream stores every command and the consumer confirms it, as ledger dev does, for both systems (default on; --quick: off)", Sources: benchEnv(flagBenchCapture)},
		&cli.DurationFlag{Name: flagBenchGrace, Category: sut, Value: d.Grace, Usage: "the intakes' JetStream grace (default: as ledger dev)", Sources: benchEnv(flagBenchGrace)},
		&cli.IntFlag{Name: flagBenchMaxInFlight, Category: sut, Value: d.MaxInFlight, Usage: "request-reply commands each intake handles at once", Sources: benchEnv(flagBenchMaxInFlight)},
		&cli.IntFlag{Name: flagBenchLanes, Category: sut, Value: d.Lanes, Usage: "JetStream consumer workers of each intake", Sources: benchEnv(flagBenchLanes)},
		&cli.IntFlag{Name: flagBenchBatchMax, Category: sut, Usage: "ledger group commit: commands per transaction (0: the ledger's default)", Sources: benchEnv(flagBenchBatchMax)},
		&cli.DurationFlag{Name: flagBenchBatchWait, Category: sut, Usage: "ledger group commit: extra wait for a batch to fill (0: the ledger's default)", Sources: benchEnv(flagBenchBatchWait)},
		&cli.IntFlag{Name: flagBenchCommitters, Category: sut, Usage: "ledger group commit: transactions in flight (0: the ledger's default)", Sources: benchEnv(flagBenchCommitters)},
		&cli.StringFlag{Name: flagBenchNATSSync, Category: sut, Value: embednats.DefaultSyncInterval.String(), Usage: "how often the embedded NATS servers fsync JetStream: a duration, or always (every message), as ledger dev --nats-sync", Sources: benchEnv(flagBenchNATSSync)},
		&cli.BoolFlag{Name: flagBenchStandby, Category: sut, Usage: "run the private PostgreSQL as a primary and a synchronous standby, as ledger dev --standby: every commit of both systems waits for the standby (docs/operations.md); the ledger's load phase then runs again without and with the standby required (synchronous_standby_names cleared, then '*'), alternated twice on the same cluster, for the line `ratio pair/lone commands/s` (a run that drives no ledger, --systems baseline or none, runs no such load phases: the pair serves the baseline, whose commits wait for the standby as well, the key check, the projection and the history)", Sources: benchEnv(flagBenchStandby)},
		&cli.BoolFlag{Name: flagBenchNoFsync, Category: sut, Usage: "run the private PostgreSQL without fsync (an experiment: what the disk costs; never a figure to quote as the ledger's)", Sources: benchEnv(flagBenchNoFsync)},
		&cli.BoolFlag{Name: flagBenchNoGroup, Category: sut, Usage: "ledger: one transaction per command", Sources: benchEnv(flagBenchNoGroup)},
		&cli.IntFlag{Name: flagBenchPoolSize, Category: sut, Usage: "baseline: PostgreSQL connections (0: max-in-flight + lanes)", Sources: benchEnv(flagBenchPoolSize)},
		&cli.BoolFlag{Name: flagBenchForUpdate, Category: sut, Value: true, Usage: "baseline: read an existing key with SELECT ... FOR UPDATE (seed 000; default on); off: a plain SELECT (seed 002), which spares a duplicate its WAL flush", Sources: benchEnv(flagBenchForUpdate)},
		&cli.StringFlag{Name: flagBenchEventStore, Category: sut, Value: bench.EventStorePostgres, Usage: "the ledger's event store: " + bench.EventStorePostgres + " (its database); " + bench.EventStoreKurrentTest +
			" (the in-process KurrentDB test server, started in this process: its figures are the ledger's costs on the test server, not a real KurrentDB's); or a KurrentDB URL (a real node or cluster, e.g. esdb://localhost:2113?tls=false). " +
			"Read models, the projector's checkpoints and the baseline stay on PostgreSQL", Sources: benchEnv(flagBenchEventStore)},
		&cli.StringFlag{Name: config.FlagDataDir, Category: sut, Usage: "directory of the private PostgreSQL cluster and the NATS stores, kept afterwards (default: a temporary directory, removed at the end)", Sources: benchEnv(config.FlagDataDir), TakesFile: true},
		&cli.StringFlag{Name: flagBenchTarget, Category: sut, Usage: "drive a ledger already running in another process (ledger dev, or serve) at this NATS URL: open --accounts accounts through it, then the warm-up and the load phase only; start nothing, and sample that process's memory and CPU from outside (BENCHMARKS.md). Every flag of another phase (--jetstream-messages, --many-accounts, --many-cold, --many-unsettled, --key-check-events, --key-check-samples, --projection-timeout, --history, --history-snapshot-every, --history-memory-limit, --open-loop-fractions, --batch-size) is off, and refused when set to a value that asks for its phases; it drives the ledger alone: --systems, when set, must be ledger; every other flag of the systems under test (they set up this process's own) and a --trace or --cpuprofile-phase of a phase but ledger/load are refused", Sources: benchEnv(flagBenchTarget)},
		&cli.StringFlag{Name: flagBenchLedgerDB, Category: sut, Usage: "use this PostgreSQL database for the ledger instead of a private cluster", Sources: benchEnv(flagBenchLedgerDB)},
		&cli.StringFlag{Name: flagBenchBaselineDB, Category: sut, Usage: "use this PostgreSQL database for the baseline (needed with --ledger-database-url)", Sources: benchEnv(flagBenchBaselineDB)},
		&cli.StringFlag{Name: flagBenchMemProfile, Category: out, Usage: "write a heap profile (live objects, after a GC) to this file as the phase of --cpuprofile-phase ends (default: ledger/load)", Sources: benchEnv(flagBenchMemProfile), TakesFile: true},
		&cli.StringFlag{Name: flagBenchCPUProfile, Category: out, Usage: "write a CPU profile of the whole run (clients, NATS, ledger, baseline handler) to this file", Sources: benchEnv(flagBenchCPUProfile), TakesFile: true},
		&cli.StringFlag{Name: flagBenchProfPhase, Category: out, Usage: "profile only this phase, as system/phase (e.g. ledger/load) instead of the whole run", Sources: benchEnv(flagBenchProfPhase)},
		&cli.StringFlag{Name: flagBenchTrace, Category: out, Usage: "write an execution trace (runtime/trace: go tool trace FILE) of the phase of --trace-phase to this file", Sources: benchEnv(flagBenchTrace), TakesFile: true},
		&cli.StringFlag{Name: flagBenchTracePhase, Category: out, Value: bench.SystemLedger + "/" + bench.PhaseManyHalfLoad, Usage: "the phase --trace traces, as system/phase", Sources: benchEnv(flagBenchTracePhase)},
		&cli.StringFlag{Name: flagBenchJSON, Category: out, Usage: "also write the report as JSON to this file", Sources: benchEnv(flagBenchJSON), TakesFile: true},
		&cli.StringFlag{Name: flagBenchMarkdown, Category: out, Usage: "also write the report as Markdown tables to this file (for BENCHMARKS.md)", Sources: benchEnv(flagBenchMarkdown), TakesFile: true},
		&cli.DurationFlag{Name: flagBenchProgress, Category: out, Value: d.ProgressInterval, Usage: "period of the progress lines on stderr (0: none)", Sources: benchEnv(flagBenchProgress)},
		&cli.StringFlag{Name: flagBenchComponentLog, Category: out, Value: "warn", Usage: "log level of the started components (NATS, PostgreSQL, ledger node, intakes)", Sources: benchEnv(flagBenchComponentLog)},
	}
	flags = append(flags, config.LogFlags()...)
	return &cli.Command{
		Name:        "bench",
		Usage:       "measure the ledger against the idempotency-table baseline over NATS",
		Description: benchDescription,
		Flags:       flags,
		Action:      runBench,
	}
}

func runBench(ctx context.Context, cmd *cli.Command) error {
	progress, err := config.LoggerFromCommand(cmd, os.Stderr)
	if err != nil {
		return config.Exit(2, err)
	}
	components, err := config.NewLogger(os.Stderr, cmd.String(config.FlagLogFormat), cmd.String(flagBenchComponentLog))
	if err != nil {
		return config.Exit(2, err)
	}
	cfg, err := benchConfig(cmd)
	if err != nil {
		return config.Exit(2, err)
	}
	cfg.Logger, cfg.Progress = components.With("component", "bench-env"), progress

	outs, err := openBenchOutputs(cmd, progress)
	if err != nil {
		return err
	}
	defer outs.close()
	cfg.PhaseHook = outs.hook

	start := time.Now()
	rep, runErr := bench.Run(ctx, cfg)
	outs.close()
	writeBenchReports(cmd, rep, progress)
	if runErr != nil {
		return benchFailed(ctx, cmd.Root().Writer, rep, runErr, time.Since(start))
	}
	progress.Info("bench done", "took", time.Since(start).Round(time.Second))
	rep.Print(cmd.Root().Writer)
	return nil
}

// benchFailed prints what a run that ended in runErr after took measured
// (bench.Report.Measured: a --systems none run's history so far too) to w
// and returns runErr, with status ExitStopped when ctx ended (interrupted).
func benchFailed(ctx context.Context, w io.Writer, rep *bench.Report, runErr error, took time.Duration) error {
	if rep.Measured() {
		rep.Print(w)
	}
	if ctx.Err() != nil {
		return config.Exit(config.ExitStopped, fmt.Errorf("bench interrupted after %s: %w", took.Round(time.Second), runErr))
	}
	return runErr
}

// benchConfig reads the flags: the defaults, shrunk by --quick, then every
// flag set explicitly (on the command line or in the environment), then
// without the phases the run does not run but for the flags set explicitly
// (bench.Config.Undriven), which Check refuses.
func benchConfig(cmd *cli.Command) (bench.Config, error) {
	cfg := bench.Defaults()
	if cmd.Bool(flagBenchQuick) {
		cfg = cfg.Quick()
	}
	applyBenchSystems(cmd, &cfg)
	applyBenchWorkloadFlags(cmd, &cfg)
	if err := applyBenchServerFlags(cmd, &cfg); err != nil {
		return cfg, err
	}
	if err := applyBenchFractions(cmd, &cfg); err != nil {
		return cfg, err
	}
	cfg.HistoryMemoryLimit, cfg.HistoryMemoryLimitSet = cmd.String(flagBenchHistoryMem), cmd.IsSet(flagBenchHistoryMem)
	cfg = cfg.Undriven(func(flag string) bool { return cmd.IsSet(strings.TrimPrefix(flag, "--")) })
	if err := cfg.Check(); err != nil {
		return cfg, err
	}
	return cfg, refuseTargetIgnored(cmd)
}

// refuseTargetIgnored refuses, under --target-nats-url, each flag set
// explicitly that the target run would ignore: every flag of the systems
// under test but the target's own (they set up this process's PostgreSQL,
// NATS, ledger and baseline, and the target run starts none of them; --systems
// is phaseFlags'), and a profile or trace of a phase other than the one it
// runs.
func refuseTargetIgnored(cmd *cli.Command) error {
	if cmd.String(flagBenchTarget) == "" {
		return nil
	}
	for _, f := range cmd.Flags {
		c, ok := f.(cli.CategorizableFlag)
		name := f.Names()[0]
		if ok && c.GetCategory() == categorySUT && name != flagBenchTarget && name != flagBenchSystems && cmd.IsSet(name) {
			return fmt.Errorf("bench: --%s sets up a system of this process, and --target-nats-url starts nothing (the target's are its own): leave --%s out or drop --target-nats-url", name, name)
		}
	}
	runs := bench.SystemLedger + "/" + bench.PhaseLoad
	for _, o := range []struct{ out, phase string }{{flagBenchTrace, flagBenchTracePhase}, {flagBenchCPUProfile, flagBenchProfPhase}, {flagBenchMemProfile, flagBenchProfPhase}} {
		p := cmd.String(o.phase)
		if cmd.String(o.out) == "" || p == "" { // no output, or a CPU profile of the whole run, a heap profile after ledger/load
			continue
		}
		if p != runs {
			return fmt.Errorf("bench: --%s %s names a phase --target-nats-url does not run (it runs %s alone): use --%s %s or drop --target-nats-url", o.phase, p, runs, o.phase, runs)
		}
	}
	return nil
}

// applyBenchWorkloadFlags sets the workload's fields from the flags set
// explicitly, and the few that always come from their flag.
func applyBenchWorkloadFlags(cmd *cli.Command, cfg *bench.Config) {
	set := func(name string, apply func()) {
		if cmd.IsSet(name) {
			apply()
		}
	}
	set(flagBenchClients, func() { cfg.Clients = cmd.Int(flagBenchClients) })
	set(flagBenchAccounts, func() { cfg.Accounts = cmd.Int(flagBenchAccounts) })
	set(flagBenchDupRatio, func() { cfg.DuplicateRatio = cmd.Float(flagBenchDupRatio) })
	set(flagBenchSkew, func() { cfg.Skew = cmd.Float(flagBenchSkew) })
	set(flagBenchTxRatio, func() { cfg.TransactionRatio = cmd.Float(flagBenchTxRatio) })
	set(flagBenchDuration, func() { cfg.Duration = cmd.Duration(flagBenchDuration) })
	set(flagBenchWarmup, func() { cfg.Warmup = cmd.Duration(flagBenchWarmup) })
	set(flagBenchJSMessages, func() { cfg.JetStreamMessages = cmd.Int(flagBenchJSMessages) })
	set(flagBenchKeyEvents, func() { cfg.KeyCheckEvents = cmd.Int(flagBenchKeyEvents) })
	set(flagBenchKeySamples, func() { cfg.KeyCheckSamples = cmd.Int(flagBenchKeySamples) })
	set(flagBenchProjTimeout, func() { cfg.ProjectionTimeout = cmd.Duration(flagBenchProjTimeout) })
	cfg.HistoryEvents = cmd.Int64(flagBenchHistory)
	cfg.HistorySnapshotEvery = int(zeroMeansNone(int64(cmd.Int(flagBenchHistorySnap))))
	set(flagBenchMany, func() { cfg.ManyAccounts = cmd.Int(flagBenchMany) })
	cfg.ManyCold = cmd.Bool(flagBenchManyCold)
	cfg.ManyUnsettled = cmd.Bool(flagBenchManyUnsettle)
	set(flagBenchCapture, func() { cfg.Capture = cmd.Bool(flagBenchCapture) })
	set(flagBenchGrace, func() { cfg.Grace = cmd.Duration(flagBenchGrace) })
	set(flagBenchMaxInFlight, func() { cfg.MaxInFlight = cmd.Int(flagBenchMaxInFlight) })
	set(flagBenchLanes, func() { cfg.Lanes = cmd.Int(flagBenchLanes) })
	set(flagBenchBatchSize, func() { cfg.BatchSize = cmd.Int(flagBenchBatchSize) })
}

// applyBenchServerFlags sets the fields that always come from their flag: the
// servers', the stores' and the targets'.
func applyBenchServerFlags(cmd *cli.Command, cfg *bench.Config) error {
	cfg.BatchMax = cmd.Int(flagBenchBatchMax)
	cfg.BatchWait = cmd.Duration(flagBenchBatchWait)
	cfg.Committers = cmd.Int(flagBenchCommitters)
	cfg.DisableGroupCommit = cmd.Bool(flagBenchNoGroup)
	cfg.NoFsync = cmd.Bool(flagBenchNoFsync)
	cfg.Standby = cmd.Bool(flagBenchStandby)
	var err error
	if cfg.NATSSyncInterval, cfg.NATSSyncAlways, err = embednats.ParseSync(cmd.String(flagBenchNATSSync)); err != nil {
		return err
	}
	cfg.BaselinePoolSize = cmd.Int(flagBenchPoolSize)
	cfg.BaselinePlainRead = !cmd.Bool(flagBenchForUpdate)
	cfg.ProgressInterval = cmd.Duration(flagBenchProgress)
	cfg.LedgerDatabaseURL = cmd.String(flagBenchLedgerDB)
	cfg.TargetNATSURL = cmd.String(flagBenchTarget)
	cfg.BaselineDatabaseURL = cmd.String(flagBenchBaselineDB)
	cfg.DataDir = cmd.String(config.FlagDataDir)
	cfg.EventStore = cmd.String(flagBenchEventStore)
	return nil
}

// applyBenchFractions reads --open-loop-fractions (bench.ParseFractions).
func applyBenchFractions(cmd *cli.Command, cfg *bench.Config) error {
	var err error
	cfg.OpenLoopFractions, err = bench.ParseFractions(cmd.String(flagBenchFractions))
	return err
}

// applyBenchSystems reads --systems, a comma-separated list.
func applyBenchSystems(cmd *cli.Command, cfg *bench.Config) {
	cfg.Systems = nil
	for _, s := range strings.Split(cmd.String(flagBenchSystems), ",") {
		if s = strings.TrimSpace(s); s != "" {
			cfg.Systems = append(cfg.Systems, s)
		}
	}
}
