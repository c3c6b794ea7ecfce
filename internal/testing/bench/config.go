package bench

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/app/ledger"
	"github.com/ledgerworks/ledger/internal/platform/config"
)

// Config shapes a benchmark run. Zero values take the defaults of Defaults.
type Config struct {
	// ledgerMetrics is where the ledger under test registers its metrics
	// (set by Run: its node's registry).
	ledgerMetrics prometheus.Gatherer
	// ledger is the ledger under test (set by Run), warmed over the many
	// accounts (ManyCold).
	ledger *ledger.Service
	// pair is the private cluster when it is a pair (set by Run with Standby):
	// the ledger's load phase is then also run alternately without and with
	// the synchronous standby (pairload.go).
	pair *pairSwitch
	// ledgerPool reads the connection pool of the ledger's PostgreSQL event
	// store (set by Run; nil on another store).
	ledgerPool func() *pgxpool.Stat
	// quick is set by Quick: the phases it leaves out by default are
	// refused as its (phaseFlags), when asked for.
	quick bool
	// explicit reports whether a flag was set explicitly (set by Undriven;
	// nil: none was): the phase flags whose fields Run fills with a default
	// ask for their phases only when set so (phaseFlags).
	explicit func(flag string) bool
	// eventStoreURL is the ledger's event store (set by Run): the
	// many-accounts phases open their accounts there.
	eventStoreURL string
	// Clients is the number of concurrent clients (each one command at a time).
	Clients int
	// Accounts is the number of accounts the commands spread over.
	Accounts int
	// DuplicateRatio is the share of commands of the load phase that resend a key
	// already answered.
	DuplicateRatio float64
	// Skew spreads commands over accounts with weight 1/rank^Skew (0: uniform).
	Skew float64
	// TransactionRatio is the share of new commands that are post_transaction
	// of one posting, from the command's account to another one drawn
	// uniformly (the baseline serves no transactions: ledger only).
	TransactionRatio float64
	// Duration of the load phase; the duplicates, half-load and batch phases take half.
	Duration time.Duration
	// BatchSize is the commands of each request in the batch phases
	// (ledger.v1.cmd.batch; default 100, at most domain.MaxBatchCommands).
	BatchSize int
	// OpenLoopFractions are the open-loop phases, as fractions of the load
	// phase's rate (default 0.5: the half-load phase).
	OpenLoopFractions []float64
	// Warmup runs before the load phase, unrecorded.
	Warmup time.Duration
	// JetStreamMessages is the number of commands of each JetStream phase (0: none).
	JetStreamMessages int
	// KeyCheckEvents is the long stream of the key-check phase (0: no phase).
	KeyCheckEvents int
	// KeyCheckSamples is the number of timed commands per kind and stream.
	KeyCheckSamples int
	// ManyAccounts, when > 0, runs the many-accounts phases after the
	// ledger's others (many.go): this many accounts opened in its event store,
	// the load phase's clients over them, then half that rate. Unlike the
	// other fields, 0 means no such phase (Defaults has 1,000,000; Quick 0).
	ManyAccounts int
	// ManyCold leaves the many accounts cold: without it the ledger warms
	// them once they are opened (ledger.Service.Warm, as a restart over them
	// would: the cache, then residents), and the phases start when warming
	// has ended.
	ManyCold bool
	// ManyUnsettled skips what an operator does after a bulk load, which
	// the bench does by default once the many accounts are opened and
	// warmed, on PostgreSQL: VACUUM (ANALYZE), then CHECKPOINT (many.go:
	// settle), so that the phases measure the ledger's steady state and not
	// the checkpoint of the million rows just copied in.
	ManyUnsettled bool
	// HistoryEvents is the history of the history phase: about this many events
	// seeded over Accounts accounts, then rebuilt and audited (0: no phase).
	HistoryEvents int64
	// HistorySnapshotEvery is the seeding ledger's snapshot interval
	// (ledger.Options.SnapshotEvery: 0 its default, 1,000 as ledger serve's;
	// negative: none): the history holds the snapshots such a ledger takes.
	HistorySnapshotEvery int
	// HistoryMemoryLimit is the process's soft memory limit while the
	// history phase rebuilds and audits (config.ParseMemoryLimit's syntax;
	// "": config.ReadToolMemoryLimit, the tools' own default), put back
	// after each. Unless HistoryMemoryLimitSet, a GOMEMLIMIT in the
	// environment wins (config.SetMemoryLimit).
	HistoryMemoryLimit    string
	HistoryMemoryLimitSet bool
	// ProjectionTimeout bounds the projection phase (0: no phase).
	ProjectionTimeout time.Duration
	// Systems to drive, in order: "ledger", "baseline", "echo" (default: ledger
	// and baseline); or "none" alone (SystemNone): no system is driven.
	Systems []string

	// EventStore is the ledger's event store: EventStorePostgres (the default:
	// the ledger's database, as ledger dev), EventStoreKurrentTest (the
	// in-process KurrentDB test server, started and stopped by Run), or a
	// KurrentDB URL (kurrentdb://, esdb://). The read models, the projector's
	// checkpoints and the baseline stay on PostgreSQL.
	EventStore string

	// TargetNATSURL, when set, is the NATS server of a ledger this process
	// does not start (`ledger dev` or `serve` in another process): Run opens
	// the accounts through it and runs the warm-up and the load phase only
	// (RunTarget), starting nothing; the ledger's own figures (heap, CPU,
	// RSS) are for the caller to sample from outside.
	TargetNATSURL string

	// DataDir holds the private PostgreSQL cluster and the NATS stores; empty: a
	// temporary directory removed at the end.
	DataDir string
	// LedgerDatabaseURL and BaselineDatabaseURL, when set, are used instead of the
	// private cluster (tests). Both empty: the cluster's "ledger" and "bench_baseline".
	LedgerDatabaseURL   string
	BaselineDatabaseURL string
	// NoFsync runs the private cluster without fsync (tests only).
	NoFsync bool
	// Standby runs the private cluster as a primary and a synchronous standby
	// (devenv.Options.Standby): every commit of both systems waits for the
	// standby, as in production (docs/operations.md).
	Standby bool
	// NATSSyncInterval and NATSSyncAlways set how the embedded NATS servers fsync
	// JetStream (zero: as ledger dev, embednats.DefaultSyncInterval).
	NATSSyncInterval time.Duration
	NATSSyncAlways   bool

	// Capture declares LEDGER_COMMANDS, so that request-reply commands are also
	// stored by JetStream and confirmed by the consumer, as in `ledger dev` (and
	// the same for the baseline, behind the same intake). Off: plain request-reply.
	Capture bool
	// Grace is the intake's JetStream grace (default 2s, as `ledger dev`).
	Grace time.Duration
	// MaxInFlight bounds the commands each intake handles at once (default 64).
	MaxInFlight int
	// Lanes is the number of JetStream consumer workers (default 16).
	Lanes int
	// BatchMax, BatchWait, Committers shape the ledger's group commit (defaults:
	// the ledger's own). DisableGroupCommit turns it off.
	BatchMax           int
	BatchWait          time.Duration
	Committers         int
	DisableGroupCommit bool
	// BaselinePoolSize is the baseline's connection pool (default MaxInFlight+Lanes).
	BaselinePoolSize int
	// BaselinePlainRead makes the baseline read an existing key with a plain SELECT
	// (seed 002) instead of SELECT … FOR UPDATE (seed 000, the default).
	BaselinePlainRead bool

	// Logger receives what the started components log (NATS, PostgreSQL, the
	// ledger node, the intakes, the projector).
	Logger *slog.Logger
	// PhaseHook, when set, is called as each measured phase starts and ends (a
	// profiler scoped to one phase).
	PhaseHook func(system, phase string, start bool)
	// Progress receives the benchmark's own lines: phases, progress, results.
	Progress *slog.Logger
	// ProgressInterval is the period of progress lines (0: none).
	ProgressInterval time.Duration
}

// Defaults is the configuration of a full run.
func Defaults() Config {
	return Config{
		Clients:           64,
		Accounts:          10_000,
		DuplicateRatio:    0.1,
		Duration:          20 * time.Second,
		Warmup:            3 * time.Second,
		JetStreamMessages: 20_000,
		KeyCheckEvents:    100_000,
		ManyAccounts:      1_000_000,
		KeyCheckSamples:   400,
		ProjectionTimeout: 5 * time.Minute,
		Capture:           true,
		Grace:             2 * time.Second,
		MaxInFlight:       64,
		Lanes:             16,
		BatchSize:         100,
		ProgressInterval:  2 * time.Second,
	}
}

// Quick shrinks c to a run of well under a minute.
func (c Config) Quick() Config {
	c.Accounts = min(c.Accounts, 1000)
	c.Duration = 4 * time.Second
	c.Warmup = time.Second
	c.JetStreamMessages = min(c.JetStreamMessages, 2000)
	c.KeyCheckEvents = min(c.KeyCheckEvents, 10_000)
	c.KeyCheckSamples = min(c.KeyCheckSamples, 100)
	c.ProjectionTimeout = min(c.ProjectionTimeout, 5*time.Second)
	// Plain request-reply: with the capture on, the stream and its consumer take
	// longer to catch up with the request-reply phases than the whole minute
	// (see BENCHMARKS.md), so the quick run leaves it and the JetStream phases out.
	c.Capture = false
	c.ManyAccounts = 0 // opening them is minutes of work
	c.quick = true
	return c
}

// defaults fills in the zero fields of c, then refuses the values that
// cannot run (Check).
func (c *Config) defaults() error {
	d := Defaults()
	c.workloadDefaults(d)
	c.serverDefaults(d)
	return c.Check()
}

// workloadDefaults: clients, accounts, durations, fractions, samples, systems.
func (c *Config) workloadDefaults(d Config) {
	if c.Clients <= 0 {
		c.Clients = d.Clients
	}
	if c.Accounts <= 0 {
		c.Accounts = d.Accounts
	}
	if c.Duration <= 0 {
		c.Duration = d.Duration
	}
	if c.OpenLoopFractions == nil {
		c.OpenLoopFractions = []float64{0.5}
	}
	if c.KeyCheckSamples <= 0 {
		c.KeyCheckSamples = d.KeyCheckSamples
	}
	if len(c.Systems) == 0 {
		c.Systems = []string{SystemLedger, SystemBaseline}
	}
}

// serverDefaults: the event store, the intake's limits and lanes, the
// baseline's pool and the loggers.
func (c *Config) serverDefaults(d Config) {
	if c.EventStore == "" {
		c.EventStore = EventStorePostgres
	}
	if c.Grace == 0 {
		c.Grace = d.Grace
	}
	if c.MaxInFlight <= 0 {
		c.MaxInFlight = d.MaxInFlight
	}
	if c.BatchSize <= 0 {
		c.BatchSize = d.BatchSize
	}
	if c.Lanes <= 0 {
		c.Lanes = d.Lanes
	}
	if c.BaselinePoolSize <= 0 {
		c.BaselinePoolSize = c.MaxInFlight + c.Lanes
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Progress == nil {
		c.Progress = slog.New(slog.DiscardHandler)
	}
}

// Check refuses a configuration that cannot run: the one home of the bench's
// rules. Run calls it once the zero fields have their defaults; ledger bench
// calls it on its flags' values (Defaults, then what was set), so that a bad
// flag is refused before anything starts, and with the same message.
func (c Config) Check() error {
	if err := c.checkWorkload(); err != nil {
		return err
	}
	if err := c.checkSystems(); err != nil {
		return err
	}
	if err := c.checkUndriven(); err != nil {
		return err
	}
	return c.checkServers()
}

// checkWorkload: clients, accounts, ratios, durations, fractions.
func (c Config) checkWorkload() error {
	if c.Clients <= 0 || c.Accounts <= 0 || c.Duration <= 0 {
		return errors.New("--clients, --accounts and --duration must be positive")
	}
	if c.DuplicateRatio < 0 || c.DuplicateRatio >= 1 {
		return errors.New("bench: duplicate ratio must be in [0, 1)")
	}
	if c.Skew < 0 {
		return errors.New("bench: skew must be >= 0")
	}
	if c.TransactionRatio < 0 || c.TransactionRatio > 1 {
		return errors.New("bench: transaction ratio must be in [0, 1]")
	}
	for _, f := range c.OpenLoopFractions {
		if !isFraction(f) {
			return fractionError(strconv.FormatFloat(f, 'g', -1, 64))
		}
	}
	return nil
}

// ParseFractions reads a comma-separated list of open-loop fractions
// (Config.OpenLoopFractions; blanks skipped, none: nil, the default).
func ParseFractions(list string) ([]float64, error) {
	var fs []float64
	for _, f := range strings.Split(list, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		v, err := strconv.ParseFloat(f, 64)
		if err != nil || !isFraction(v) {
			return nil, fractionError(f)
		}
		fs = append(fs, v)
	}
	return fs, nil
}

// isFraction is the rule of an open-loop fraction: in (0, 1].
func isFraction(f float64) bool { return f > 0 && f <= 1 }

func fractionError(f string) error {
	return fmt.Errorf("--open-loop-fractions: %q is not a fraction in (0, 1]", f)
}

// checkSystems: the systems under test and what each can serve, the many
// accounts, the history, and the accounts the workload needs.
func (c Config) checkSystems() error {
	for _, s := range c.Systems {
		if s == SystemNone && len(c.Systems) == 1 {
			continue
		}
		if s != SystemLedger && s != SystemBaseline && s != SystemEcho {
			return errors.New("bench: systems are ledger, baseline and echo (or none alone)")
		}
		if s != SystemLedger && c.TransactionRatio > 0 {
			return errors.New("bench: transactions are the ledger's only (the baseline serves open_account, deposit and withdraw): use --systems ledger")
		}
	}
	if c.ManyAccounts < 0 {
		return errors.New("bench: many accounts must be >= 0")
	}
	if c.HistoryEvents < 0 {
		return errors.New("bench: history events must be >= 0")
	}
	if c.HistoryEvents > 0 && c.Accounts < 2 {
		return errors.New("bench: a history needs two accounts")
	}
	if c.TransactionRatio > 0 && c.Accounts < 2 {
		return errors.New("bench: a transaction needs two accounts")
	}
	return nil
}

// checkUndriven refuses, not skips, a flag that asks for phases the run
// does not run (undriven); Undriven takes such phases' defaults off. Both
// read one table, phaseFlags, the one home of the rule.
// --standby is accepted whatever is driven: the private PostgreSQL is then
// a primary and a synchronous standby for every phase that runs (the
// baseline's commits wait for the standby as the ledger's do; the key
// check, the projection, the history's seeding, rebuild and audit); only
// the pair/lone alternation of the load phase is the ledger's, and does not
// run without it.
func (c Config) checkUndriven() error {
	for _, p := range c.undriven() {
		if p.asked {
			return fmt.Errorf("bench: %s asks for %s, and %s: leave %s out or %s", p.flag, p.phases, p.why, p.flag, p.fix)
		}
	}
	return nil
}

// phaseFlag is a flag that asks for phases of a run, or for a change of
// them, paired with the conditions under which those phases do not run:
// where one holds, Undriven takes the flag's field off (off: its default
// there) and Check refuses the flag asked for (asks).
type phaseFlag struct {
	flag, phases string
	asks         func(Config) bool
	off          func(*Config)
	notRun       []notRun
}

// notRun says why c does not run some phases and how to have them run
// (why "": it runs them).
type notRun func(c Config) (why, fix string)

// phaseFlags is the one table of the flags of phases a run may not run:
// a run with --target-nats-url runs the warm-up and the load phase alone
// (runTarget), so every other phase flag is refused there, and --systems
// but the ledger alone (it drives the ledger only; the flags of this
// process's own systems are refused by the ledger command: it starts none);
// the JetStream phases are those of a system behind an intake (the ledger,
// the baseline: not echo, and none under --systems none) with the capture
// on; the many-accounts phases the ledger's alone (after its other phases,
// in its event store: not the baseline's, nor echo's); --many-cold and
// --many-unsettled change the many-accounts phases, so they are refused
// where those do not run (--many-accounts 0, --quick's default, or the
// ledger not driven: --systems baseline, none), and --many-unsettled where
// the bench settles nothing (the ledger's events on KurrentDB); the changes
// of the key-check, history, open-loop and batch phases where those do not
// run (--key-check-events 0, --history 0, --systems none).
var phaseFlags = []phaseFlag{
	{flag: "--jetstream-messages", phases: "the JetStream phases",
		asks: func(c Config) bool { return c.JetStreamMessages > 0 }, off: func(c *Config) { c.JetStreamMessages = 0 },
		notRun: []notRun{targetRuns, noSystemDriven, noIntakeDriven, captureOff}},
	{flag: "--many-accounts", phases: "phases of the ledger",
		asks: func(c Config) bool { return c.ManyAccounts > 0 }, off: func(c *Config) { c.ManyAccounts = 0 },
		notRun: []notRun{targetRuns, ledgerNotDriven}},
	{flag: "--many-cold", phases: "a change of the many-accounts phases",
		asks: func(c Config) bool { return c.ManyCold }, off: func(c *Config) { c.ManyCold = false },
		notRun: []notRun{targetRuns, manyNotRun}},
	{flag: "--many-unsettled", phases: "a change of the many-accounts phases",
		asks: func(c Config) bool { return c.ManyUnsettled }, off: func(c *Config) { c.ManyUnsettled = false },
		notRun: []notRun{targetRuns, manyNotRun, settlesNothing}},
	{flag: "--key-check-events", phases: "the key-check phase",
		asks: func(c Config) bool { return c.KeyCheckEvents > 0 }, off: func(c *Config) { c.KeyCheckEvents = 0 },
		notRun: []notRun{targetRuns}},
	{flag: "--key-check-samples", phases: "a change of the key-check phase",
		asks: explicitly("--key-check-samples"), off: func(c *Config) { c.KeyCheckSamples = 0 },
		notRun: []notRun{targetRuns, keyCheckOff}},
	{flag: "--projection-timeout", phases: "the projection phase",
		asks: func(c Config) bool { return c.ProjectionTimeout > 0 }, off: func(c *Config) { c.ProjectionTimeout = 0 },
		notRun: []notRun{targetRuns}},
	{flag: "--history", phases: "the history phase",
		asks: func(c Config) bool { return c.HistoryEvents > 0 }, off: func(c *Config) { c.HistoryEvents = 0 },
		notRun: []notRun{targetRuns}},
	{flag: "--history-snapshot-every", phases: "a change of the history phase",
		asks: explicitly("--history-snapshot-every"), off: func(c *Config) { c.HistorySnapshotEvery = 0 },
		notRun: []notRun{targetRuns, historyOff}},
	{flag: "--history-memory-limit", phases: "a change of the history phase",
		asks: func(c Config) bool { return c.HistoryMemoryLimitSet },
		off:  func(c *Config) { c.HistoryMemoryLimit, c.HistoryMemoryLimitSet = "", false }, notRun: []notRun{targetRuns, historyOff}},
	{flag: "--open-loop-fractions", phases: "the open-loop phases",
		asks: explicitly("--open-loop-fractions"), off: func(c *Config) { c.OpenLoopFractions = nil },
		notRun: []notRun{targetRuns, noSystemDriven}},
	{flag: "--batch-size", phases: "a change of the batch phases",
		asks: explicitly("--batch-size"), off: func(c *Config) { c.BatchSize = 0 },
		notRun: []notRun{targetRuns, noSystemDriven}},
	{flag: "--systems", phases: "the phases of systems besides the ledger",
		asks: func(c Config) bool {
			return explicitly("--systems")(c) && !slices.Equal(c.Systems, []string{SystemLedger})
		},
		off: func(c *Config) { c.Systems = []string{SystemLedger} }, notRun: []notRun{targetRuns}},
}

// explicitly asks for a phase flag's phases when the flag was set
// explicitly (Config.explicit): for the fields Run fills with a default,
// whose value does not say whether they were asked for.
func explicitly(flag string) func(Config) bool {
	return func(c Config) bool { return c.explicit != nil && c.explicit(flag) }
}

// targetRuns: a run that drives a ledger in another process runs its
// warm-up and load phase alone, and starts nothing (runTarget).
func targetRuns(c Config) (why, fix string) {
	if c.TargetNATSURL == "" {
		return "", ""
	}
	return "--target-nats-url runs the warm-up and the load phase alone, against a ledger in another process, and starts nothing", "drop --target-nats-url"
}

// keyCheckOff: the key-check phase runs over a positive long stream.
func keyCheckOff(c Config) (why, fix string) {
	if c.KeyCheckEvents > 0 {
		return "", ""
	}
	return "the key-check phase does not run (--key-check-events 0)", "run it (--key-check-events N)"
}

// historyOff: the history phase runs over a positive number of events.
func historyOff(c Config) (why, fix string) {
	if c.HistoryEvents > 0 {
		return "", ""
	}
	return "the history phase does not run (--history 0, the default)", "run it (--history N)"
}

// noSystemDriven: --systems none runs no driven system's phases.
func noSystemDriven(c Config) (why, fix string) {
	if !c.drivesNone() {
		return "", ""
	}
	return "--systems none drives no system", "drive the ledger (--systems ledger)"
}

// noIntakeDriven: echo alone runs no JetStream phase (it answers
// request-reply only).
func noIntakeDriven(c Config) (why, fix string) {
	if slices.ContainsFunc(c.driven(), func(s string) bool { return s != SystemEcho }) {
		return "", ""
	}
	return c.systemsFlag() + " drives neither the ledger nor the baseline", "drive one of them (--systems ledger)"
}

// captureOff: the JetStream phases run on the capture's stream alone
// (Config.Capture), which --quick turns off by default.
func captureOff(c Config) (why, fix string) {
	if c.Capture {
		return "", ""
	}
	return "they need the capture (" + c.byQuick("--capture=false") + ")", "turn it on (--capture)"
}

// settlesNothing: the bench settles the many accounts' bulk load on
// PostgreSQL alone (many.go: settle), not on KurrentDB.
func settlesNothing(c Config) (why, fix string) {
	if !isKurrent(c.EventStore) {
		return "", ""
	}
	return "the bench settles nothing on KurrentDB (--event-store " + config.Redact(c.EventStore) + ")", "put the ledger's events on PostgreSQL (--event-store " + EventStorePostgres + ")"
}

// ledgerNotDriven: a run that does not drive the ledger runs none of its
// phases.
func ledgerNotDriven(c Config) (why, fix string) {
	if c.drivesLedger() {
		return "", ""
	}
	return c.systemsFlag() + " does not drive it", "drive the ledger (--systems ledger)"
}

// manyNotRun: the many-accounts phases run over a positive number of
// accounts, in a run that drives the ledger; why names what left them out.
func manyNotRun(c Config) (why, fix string) {
	switch {
	case !c.drivesLedger():
		why = c.systemsFlag() + " does not drive the ledger"
	case c.ManyAccounts > 0:
		return "", ""
	default:
		why = c.byQuick("--many-accounts 0")
	}
	return "they do not run (" + why + ")", "run them (--systems ledger --many-accounts N)"
}

// byQuick names the setting that left phases out, and --quick beside it
// where --quick made c (its default, unless the setting was given too: c
// does not say which).
func (c Config) byQuick(setting string) string {
	if c.quick {
		return setting + ", --quick's default"
	}
	return setting
}

// systemsFlag is c's systems as their flag.
func (c Config) systemsFlag() string { return "--systems " + strings.Join(c.Systems, ",") }

// undrivenFlag is a flag of phaseFlags whose phases c does not run:
// whether c asks for them, why they do not run, how to have them run.
type undrivenFlag struct {
	phaseFlag
	asked    bool
	why, fix string
}

// undriven is the flags of the phases c does not run, each with the first
// of its conditions that holds.
func (c Config) undriven() []undrivenFlag {
	var fs []undrivenFlag
	for _, f := range phaseFlags {
		for _, n := range f.notRun {
			if why, fix := n(c); why != "" {
				fs = append(fs, undrivenFlag{phaseFlag: f, asked: f.asks(c), why: why, fix: fix})
				break
			}
		}
	}
	return fs
}

// Undriven is c with the phases it does not run off (phaseFlags: their
// defaults there), but for the flags set explicitly (set reports whether
// one was; nil: none was): Check then refuses those that ask for them, and
// a default is never refused.
func (c Config) Undriven(set func(flag string) bool) Config {
	c.explicit = set
	for _, u := range c.undriven() {
		if set == nil || !set(u.flag) {
			u.off(&c)
		}
	}
	return c
}

// checkServers: the event store, the intake's grace, the batches, the
// history's memory limit.
func (c Config) checkServers() error {
	if err := CheckEventStore(c.EventStore); err != nil {
		return fmt.Errorf("--event-store: %w", err)
	}
	if c.Grace < 0 {
		return errors.New("--grace must not be negative")
	}
	if c.BatchSize > domain.MaxBatchCommands {
		return fmt.Errorf("bench: batch size %d is over the protocol's %d commands", c.BatchSize, domain.MaxBatchCommands)
	}
	if c.HistoryMemoryLimit != "" {
		if _, err := config.ParseMemoryLimit(c.HistoryMemoryLimit); err != nil {
			return fmt.Errorf("--history-memory-limit: %w", err)
		}
	}
	return nil
}

// Systems under test.
const (
	SystemLedger   = "ledger"
	SystemBaseline = "baseline"
	// SystemEcho answers every command with a fixed reply: the NATS ceiling.
	SystemEcho = "echo"
	// SystemNone, alone in Systems, drives no system: only the phases after
	// them run (key check, projection, history), and no account is opened
	// in the ledger's event store but the history's and the key check's
	// streams.
	SystemNone = "none"
)

// driven is the systems Run drives, in order (none for SystemNone).
func (c Config) driven() []string {
	if c.drivesNone() {
		return nil
	}
	return c.Systems
}

// drivesLedger reports whether c drives the ledger.
func (c Config) drivesLedger() bool { return slices.Contains(c.driven(), SystemLedger) }

// drivesNone reports whether c's systems are SystemNone alone.
func (c Config) drivesNone() bool { return len(c.Systems) == 1 && c.Systems[0] == SystemNone }
