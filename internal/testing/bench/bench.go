package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/adapters/natsapi"
	"github.com/ledgerworks/ledger/internal/app/ledger"
	"github.com/ledgerworks/ledger/internal/platform/devenv"
	"github.com/ledgerworks/ledger/internal/platform/embednats"
	"github.com/ledgerworks/ledger/internal/platform/node"
	"github.com/ledgerworks/ledger/internal/platform/pgcluster"
)

// BaselineDatabase is the database of the baseline on the private cluster.
const BaselineDatabase = "bench_baseline"

// stopTimeout bounds the shutdown of what a run started.
const stopTimeout = 2 * time.Minute

// Run starts the environment (as `ledger dev` does: embedded NATS, PostgreSQL,
// migrations, the ledger node with its intake), drives the ledger and then the
// baseline through the same phases, and measures the key check and the projector.
// It stops everything it started before returning, also when ctx ends (then with
// what was measured so far and an error). Print the report with Report.Print.
func Run(ctx context.Context, cfg Config) (rep *Report, err error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	runID := strconv.FormatInt(time.Now().UnixNano()/1e6%(36*36*36*36*36), 36)
	w := newWorkload(runID, cfg.Accounts, cfg.Skew, cfg.TransactionRatio)
	rep = newReport(cfg, w)
	defer func() {
		rep.Seconds = time.Since(rep.Started).Seconds()
		rep.Machine.LoadAfter = loadAvg()
	}()

	if cfg.TargetNATSURL != "" {
		return rep, runTarget(ctx, cfg, w, rep)
	}
	return rep, runLocal(ctx, cfg, runID, w, rep)
}

// newReport is a run's report before anything is measured: its configuration.
func newReport(cfg Config, w *workload) *Report {
	rep := &Report{Started: time.Now(), Machine: machine(), Config: ReportConfig{
		Clients: cfg.Clients, Accounts: cfg.Accounts, DuplicateRatio: cfg.DuplicateRatio, Skew: cfg.Skew, TransactionRatio: cfg.TransactionRatio,
		HottestShare: w.hottestShare(), Duration: cfg.Duration.String(), Capture: cfg.Capture, Grace: cfg.Grace.String(), NATSSync: natsSync(cfg),
		MaxInFlight: cfg.MaxInFlight, GroupCommit: !cfg.DisableGroupCommit, BatchMax: cfg.BatchMax, Committers: cfg.Committers,
		BaselinePoolSize: cfg.BaselinePoolSize, BaselineLockedRead: !cfg.BaselinePlainRead, JetStreamMessages: cfg.JetStreamMessages, KeyCheckEvents: cfg.KeyCheckEvents,
		EventStore: reportedEventStore(cfg.EventStore), Target: cfg.TargetNATSURL,
	}}
	if isKurrent(cfg.EventStore) {
		rep.Config.GroupCommit = false // KurrentDB writes one stream per append
	}
	if cfg.BatchWait > 0 {
		rep.Config.BatchWait = cfg.BatchWait.String()
	}
	return rep
}

// runLocal is Run in this process's own environment: it drives every
// system, then the phases after them, and stops what it started.
func runLocal(ctx context.Context, cfg Config, runID string, w *workload, rep *Report) error {
	log := cfg.Progress
	dir := cfg.DataDir
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "ledger-bench-"); err != nil {
			return err
		}
		defer os.RemoveAll(dir)
	}
	esURL, stopES, calls, err := startEventStore(cfg.EventStore)
	if err != nil {
		return err
	}
	defer stopES() // after the environment, deferred below
	env, err := startEnv(ctx, cfg, dir, esURL)
	if err != nil {
		return fmt.Errorf("bench: start the ledger's environment: %w", err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopTimeout)
		defer cancel()
		if serr := env.Stop(sctx); serr != nil {
			log.Warn("bench: stop environment", "err", serr)
		}
	}()
	pm := 0
	if env.PG != nil {
		pm = postmasterPID(filepath.Join(env.PG.Dir(), "data"))
	} else if env.Pair != nil {
		pm = postmasterPID(filepath.Join(env.Pair.Primary().Dir(), "data"))
	}
	if err := describeDatabase(ctx, env.DatabaseURL, &rep.Machine); err != nil {
		return err
	}
	cfg.ledgerMetrics, cfg.ledger = env.Node.Registry, env.Node.Ledger
	cfg.eventStoreURL = env.EventStoreURL
	if ps, ok := env.Node.Store.(interface{ Pool() *pgxpool.Pool }); ok {
		cfg.ledgerPool = ps.Pool().Stat
	}
	if env.Pair != nil {
		cfg.pair = &pairSwitch{set: env.Pair.SetSynchronous, url: env.DatabaseURL}
	}
	if err := driveSystems(ctx, cfg, env, dir, w, pm, calls, rep); err != nil {
		return err
	}
	rep.ratios()
	return afterSystems(ctx, cfg, env, runID, pm, rep)
}

// startEnv starts the ledger's environment in dir, its event store at esURL
// ("": the ledger's database).
func startEnv(ctx context.Context, cfg Config, dir, esURL string) (*devenv.Env, error) {
	return devenv.Start(ctx, devenv.Options{
		DataDir:          dir,
		NATSAddr:         "127.0.0.1:0",
		DatabaseURL:      cfg.LedgerDatabaseURL,
		EventStoreURL:    esURL,
		NoFsync:          cfg.NoFsync,
		Standby:          cfg.Standby,
		NATSSyncInterval: cfg.NATSSyncInterval,
		NATSSyncAlways:   cfg.NATSSyncAlways,
		Logger:           cfg.Logger,
		Node: node.Options{
			Name:                "bench-ledger",
			DisableCommandQuery: true,
			Ledger: ledger.Options{
				CacheSize:          max(100_000, 2*cfg.Accounts),
				DisableGroupCommit: cfg.DisableGroupCommit,
				Batch:              ledger.BatchOptions{MaxBatch: cfg.BatchMax, MaxWait: cfg.BatchWait, Committers: cfg.Committers},
			},
			Intake: intakeOptions(cfg, cfg.Grace, cfg.Logger),
		},
	})
}

// driveSystems drives cfg's systems in turn through their phases, each
// started on a settled cluster and stopped after.
func driveSystems(ctx context.Context, cfg Config, env *devenv.Env, dir string, w *workload, pm int, calls *storeCalls, rep *Report) error {
	log := cfg.Progress
	prog := &progress{log: log, interval: cfg.ProgressInterval}
	var written []string // databases the systems driven so far wrote to
	for _, sys := range cfg.driven() {
		if sys != SystemEcho {
			// Each system starts on a settled cluster: the previous one's tables
			// vacuumed and a checkpoint just taken. Otherwise the second system
			// pays for the first's writes (autovacuum of its tables, a checkpoint
			// and the full-page writes after it): the baseline measured after the
			// ledger did 1,146 commands/s, first on a fresh cluster 2,036.
			_ = settle(ctx, written, env.DatabaseURL, log) // logged: the run goes on unsettled
		}
		natsURL, stop, dbs, err := startSystem(ctx, cfg, env, dir, sys)
		if err != nil {
			return err
		}
		written = append(written, dbs...)
		log.Info("bench: driving", "system", sys, "nats", natsURL)
		var phases []PhaseResult
		if sys == SystemEcho {
			ref := 0.0
			if l := rep.Phase(SystemLedger, PhaseLoad); l != nil {
				ref = l.CommandsPerSec
			}
			phases, err = runEcho(ctx, cfg, natsURL, w, pm, prog, ref)
		} else {
			var c *storeCalls
			if sys == SystemLedger {
				c = calls
			}
			var many *ManyReport
			phases, many, err = runSystem(ctx, cfg, sys, natsURL, w, pm, prog, c)
			if many != nil {
				rep.Many = many
			}
		}
		stop()
		rep.Phases = append(rep.Phases, phases...)
		if err != nil {
			return fmt.Errorf("bench: %s: %w", sys, err)
		}
	}
	return nil
}

// startSystem starts sys (the ledger is running already) and returns its NATS
// URL, how to stop it and the databases it writes to.
func startSystem(ctx context.Context, cfg Config, env *devenv.Env, dir, sys string) (natsURL string, stop func(), dbs []string, err error) {
	switch sys {
	case SystemLedger:
		dbs = []string{env.DatabaseURL}
		if env.EventStoreURL != env.DatabaseURL && !isKurrent(cfg.EventStore) {
			dbs = append(dbs, env.EventStoreURL)
		}
		return env.NATSURL, func() {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopTimeout)
			defer cancel()
			_ = env.Node.Stop(sctx) // its intake, consumer and store; NATS and PostgreSQL stay up
		}, dbs, nil
	case SystemBaseline:
		b, err := startBaseline(ctx, cfg, env, dir, cfg.Grace)
		if err != nil {
			return "", nil, nil, err
		}
		return b.natsURL, b.stop, []string{b.dbURL}, nil
	case SystemEcho:
		e, err := startEcho(dir)
		if err != nil {
			return "", nil, nil, err
		}
		return e.natsURL, e.stop, nil, nil
	}
	return "", nil, nil, fmt.Errorf("bench: no system %q", sys)
}

// ratios sets the report's ratios between the phases measured.
func (rep *Report) ratios() {
	if l, b := rep.Phase(SystemLedger, PhaseLoad), rep.Phase(SystemBaseline, PhaseLoad); l != nil && b != nil {
		rep.Ratio = ratio(l.CommandsPerSec, b.CommandsPerSec)
	}
	if l, b := rep.Phase(SystemLedger, PhaseLoad), rep.Phase(SystemLedger, PhaseBatch); l != nil && b != nil {
		rep.BatchRatio = ratio(b.CommandsPerSec, l.CommandsPerSec)
	}
	if b, h := rep.Phase(SystemLedger, PhaseBatch), rep.Phase(SystemLedger, PhaseHotBatch); b != nil && h != nil {
		rep.HotBatchRatio = ratio(h.CommandsPerSec, b.CommandsPerSec)
	}
	if l, h := rep.Phase(SystemLedger, PhaseLoad), rep.Phase(SystemLedger, PhaseHot); l != nil && h != nil {
		rep.HotRatio = ratio(h.CommandsPerSec, l.CommandsPerSec)
	}
	if l, m := rep.Phase(SystemLedger, PhaseLoad), rep.Phase(SystemLedger, PhaseMany); l != nil && m != nil {
		rep.ManyRatio = ratio(m.CommandsPerSec, l.CommandsPerSec)
	}
	rep.PairRatio = pairLoneRatio(rep.Phases)
}

// afterSystems runs the phases after the systems': the key check, the
// projection and the history, those cfg asks for.
func afterSystems(ctx context.Context, cfg Config, env *devenv.Env, runID string, pm int, rep *Report) (err error) {
	log := cfg.Progress
	if cfg.KeyCheckEvents > 0 {
		log.Info("bench: key check", "events", cfg.KeyCheckEvents)
		rep.KeyCheck, err = keyCheck(ctx, env.EventStoreURL, cfg.EventStore, runID, cfg.KeyCheckEvents, cfg.KeyCheckSamples, cfg.Logger, func(msg string, args ...any) { log.Info("bench: "+msg, args...) })
		if err != nil {
			return fmt.Errorf("bench: key check: %w", err)
		}
	}
	if cfg.ProjectionTimeout > 0 {
		log.Info("bench: projection")
		before := sampleCPU(pm)
		rep.Projection, err = projectAll(ctx, env.DatabaseURL, env.EventStoreURL, cfg.ProjectionTimeout, cfg.Logger, log)
		if rep.Projection != nil {
			rep.Projection.CPU = cpuBetween(before, sampleCPU(pm), cpuCount())
		}
		if err != nil {
			return fmt.Errorf("bench: projection: %w", err)
		}
	}
	if cfg.HistoryEvents > 0 {
		other := rep.ledgerAccounts(cfg)
		log.Info("bench: history", "events", cfg.HistoryEvents, "accounts", cfg.Accounts, "other_accounts_in_store", other)
		rep.History, err = historyPhase(ctx, env.DatabaseURL, env.EventStoreURL, runID, other, cfg, log)
		if err != nil {
			return fmt.Errorf("bench: history: %w", err)
		}
	}
	return nil
}

// ledgerAccounts is the accounts this run's other phases opened in the
// ledger's event store: the load phase's when the ledger was driven, the
// many-accounts phase's and the key check's (driven or not).
func (rep *Report) ledgerAccounts(cfg Config) int {
	n := 0
	if slices.Contains(cfg.driven(), SystemLedger) {
		n = cfg.Accounts
	}
	if rep.Many != nil {
		n += rep.Many.Accounts
	}
	if rep.KeyCheck != nil {
		n += keyCheckAccounts
	}
	return n
}

func hook(cfg Config, system, phase string, start bool) {
	if cfg.PhaseHook != nil {
		cfg.PhaseHook(system, phase, start)
	}
}

func cpuCount() int { return runtime.NumCPU() }

func intakeOptions(cfg Config, grace time.Duration, log *slog.Logger) natsapi.Options {
	return natsapi.Options{
		MaxInFlight:      cfg.MaxInFlight,
		DisableJetStream: !cfg.Capture,
		Lanes:            cfg.Lanes,
		Grace:            grace,
		Logger:           log,
	}
}

// baselineServer is the baseline behind its own embedded NATS server (the intake's
// subjects are fixed, so each system gets a server of its own, alike in all).
type baselineServer struct {
	natsURL string
	dbURL   string
	stop    func()
}

func startBaseline(ctx context.Context, cfg Config, env *devenv.Env, dir string, grace time.Duration) (_ *baselineServer, err error) {
	log := cfg.Logger // the components' logger
	url := cfg.BaselineDatabaseURL
	if url == "" {
		if url, err = createBaselineDatabase(ctx, env); err != nil {
			return nil, err
		}
	}
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	pcfg.MaxConns = int32(cfg.BaselinePoolSize)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, err
	}
	var (
		ns *server.Server
		nc *nats.Conn
		in *natsapi.Intake
	)
	stop := func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopTimeout)
		defer cancel()
		if in != nil {
			_ = in.Stop(sctx)
		}
		if nc != nil {
			nc.Close()
		}
		if ns != nil {
			ns.Shutdown()
			ns.WaitForShutdown()
		}
		pool.Close()
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	b, err := NewBaseline(ctx, pool, cfg.BaselinePlainRead)
	if err != nil {
		return nil, err
	}
	ns, err = embednats.Start(embednats.Options{Addr: "127.0.0.1:0", StoreDir: filepath.Join(dir, "nats-baseline"), Name: "bench-baseline", SyncInterval: cfg.NATSSyncInterval, SyncAlways: cfg.NATSSyncAlways, Logger: log})
	if err != nil {
		return nil, err
	}
	nc, err = nats.Connect(ns.ClientURL(), nats.Name("bench-baseline"), nats.MaxReconnects(-1))
	if err != nil {
		return nil, err
	}
	in = natsapi.New(nc, b, intakeOptions(cfg, grace, log))
	if err := in.Start(ctx); err != nil {
		return nil, err
	}
	return &baselineServer{natsURL: ns.ClientURL(), dbURL: url, stop: stop}, nil
}

// createBaselineDatabase (re)creates the baseline's database, empty, on the
// environment's private cluster and returns its URL.
func createBaselineDatabase(ctx context.Context, env *devenv.Env) (string, error) {
	var urlFor func(string) string
	switch {
	case env.PG != nil:
		urlFor = env.PG.URLFor
	case env.Pair != nil:
		urlFor = env.Pair.URLFor
	default:
		return "", errors.New("bench: no database for the baseline: set the baseline database URL")
	}
	if err := pgcluster.RecreateDatabase(ctx, urlFor("postgres"), BaselineDatabase); err != nil {
		return "", fmt.Errorf("bench: baseline database: %w", err)
	}
	return urlFor(BaselineDatabase), nil
}

// runSystem drives one system through the phases; calls, when not nil, counts
// the calls its event store receives.
func runSystem(ctx context.Context, cfg Config, sys, natsURL string, w *workload, pm int, prog *progress, calls *storeCalls) ([]PhaseResult, *ManyReport, error) {
	t, err := dialTarget(sys, natsURL, cfg.Clients)
	if err != nil {
		return nil, nil, err
	}
	defer t.close()
	var base uint64 // the stream's last sequence before this run (a reused data dir)
	if cfg.Capture {
		if base, err = streamLastSeq(ctx, natsURL); err != nil {
			return nil, nil, err
		}
	}
	rrStart := time.Now()
	gens := func(phase string) []*clientGen { return newGens(w, sys[:1]+phase, cfg.Clients) }
	pr := &phaseRunner{ctx: ctx, cfg: cfg, sys: sys, t: t, pm: pm, prog: prog, calls: calls}
	if err := pr.requestReply(w, gens); err != nil {
		return pr.out, pr.manyRep, err
	}
	if cfg.Capture {
		if err := pr.capture(natsURL, base, rrStart, gens); err != nil {
			return pr.out, pr.manyRep, err
		}
	}
	if sys == SystemLedger && cfg.ManyAccounts > 0 {
		if err := pr.many(w); err != nil {
			return pr.out, pr.manyRep, err
		}
	}
	return pr.out, pr.manyRep, nil
}

// streamLastSeq is the last sequence of the intake's stream (natsapi.StreamName)
// at natsURL.
func streamLastSeq(ctx context.Context, natsURL string) (uint64, error) {
	p, err := newJSProbe(ctx, natsURL, nil, 0)
	if err != nil {
		return 0, err
	}
	base, err := p.lastSeq(ctx)
	p.close()
	return base, err
}

// requestReply opens and warms the system, then runs the request-reply
// phases: load (and the standby's alternation), hot, batches, duplicates and
// the open-loop fractions of the load's rate.
func (pr *phaseRunner) requestReply(w *workload, gens func(string) []*clientGen) error {
	cfg, sys := pr.cfg, pr.sys
	warmNew, err := openAndWarm(pr.ctx, cfg, sys, pr.t, w, pr.prog)
	if err != nil {
		return err
	}
	load := gens("load")
	lr, err := pr.run(PhaseLoad, load, loadSpec{duration: cfg.Duration, dupRatio: cfg.DuplicateRatio})
	if err != nil {
		return err
	}
	lr.Mode = fmt.Sprintf("closed loop, %d clients", cfg.Clients)
	lr.WarmupNewAnswered = warmNew
	loadRate := lr.CommandsPerSec
	if sys == SystemLedger && cfg.pair != nil {
		// The same load without and with the standby required, alternated: the
		// standby's cost measured in one run, on one cluster.
		if err := cfg.pair.alternate(pr.ctx, cfg.Clients, func(name string) (*PhaseResult, error) {
			return pr.run(name, gens(name), loadSpec{duration: cfg.Duration / 2, dupRatio: cfg.DuplicateRatio})
		}); err != nil {
			return err
		}
	}
	if err := pr.hotAndBatches(w, gens); err != nil {
		return err
	}
	if err := pr.duplicates(load, gens); err != nil {
		return err
	}
	if loadRate > 0 {
		for _, f := range cfg.OpenLoopFractions {
			name := PhaseHalfLoad
			if f != 0.5 {
				name = fmt.Sprintf("load@%g%%", 100*f)
			}
			if err := pr.openLoop(name, gens(name), loadRate, f, "the load phase"); err != nil {
				return err
			}
		}
	}
	return nil
}

// hotAndBatches runs the load with every client on one account (a
// merchant's, a fee account: a hot account must cost what a cold one costs),
// then the load phase's clients and accounts, each request a batch of
// BatchSize commands (ledger.v1.cmd.batch, not atomic), then every command of
// them on one account.
func (pr *phaseRunner) hotAndBatches(w *workload, gens func(string) []*clientGen) error {
	cfg, sys := pr.cfg, pr.sys
	hot := make([]*clientGen, cfg.Clients)
	for i := range hot {
		hot[i] = newClientGen(w.hot(), sys[:1]+PhaseHot, i)
	}
	hr, err := pr.run(PhaseHot, hot, loadSpec{duration: cfg.Duration / 2, dupRatio: cfg.DuplicateRatio})
	if err != nil {
		return err
	}
	hr.Mode = fmt.Sprintf("closed loop, %d clients, all on one account", cfg.Clients)

	br, err := pr.run(PhaseBatch, gens("batch"), loadSpec{duration: cfg.Duration / 2, dupRatio: cfg.DuplicateRatio, batch: cfg.BatchSize})
	if err != nil {
		return err
	}
	br.Mode = fmt.Sprintf("closed loop, %d clients, batches of %d", cfg.Clients, cfg.BatchSize)
	hotBatch := make([]*clientGen, cfg.Clients)
	for i := range hotBatch {
		hotBatch[i] = newClientGen(w.hot(), sys[:1]+"hb", i)
	}
	hbr, err := pr.run(PhaseHotBatch, hotBatch, loadSpec{duration: cfg.Duration / 2, dupRatio: cfg.DuplicateRatio, batch: cfg.BatchSize})
	if err != nil {
		return err
	}
	hbr.Mode = fmt.Sprintf("closed loop, %d clients, batches of %d, all on one account", cfg.Clients, cfg.BatchSize)
	return nil
}

// duplicates resends the load phase's commands: every command a resend.
func (pr *phaseRunner) duplicates(load []*clientGen, gens func(string) []*clientGen) error {
	dups := gens("dups")
	for i := range dups {
		dups[i].inherit(load[i])
	}
	dr, err := pr.run(PhaseDuplicates, dups, loadSpec{duration: pr.cfg.Duration / 2, dupRatio: 1})
	if err != nil {
		return err
	}
	dr.Mode = fmt.Sprintf("closed loop, %d clients, every command a resend", pr.cfg.Clients)
	return nil
}

// capture measures how long JetStream's capture of the request-reply phases
// (sent since rrStart, the stream at base before) takes to be stored and
// confirmed, then runs the JetStream phases.
func (pr *phaseRunner) capture(natsURL string, base uint64, rrStart time.Time, gens func(string) []*clientGen) error {
	ctx, cfg, sys, t, log := pr.ctx, pr.cfg, pr.sys, pr.t, pr.cfg.Progress
	p, err := newJSProbe(ctx, natsURL, log, cfg.ProgressInterval)
	if err != nil {
		return err
	}
	defer p.close()
	// The capture: JetStream stored every request-reply command, and the consumer
	// confirms each (after the grace). Measure how long both take to catch up
	// with what the request-reply phases sent; the JetStream phases, and the next
	// system, start on an idle server.
	rrEnd := time.Now()
	want := base + uint64(t.sent.Load())
	stored, err := p.waitStored(ctx, want, 10*time.Second)
	if err != nil {
		return err
	}
	storedAt := time.Now()
	if err := p.waitSettled(ctx, stored, settleTimeout(int(stored-base)), nil); err != nil {
		return err
	}
	settledAt := time.Now()
	n := int64(stored - base)
	cr := PhaseResult{System: sys, Phase: PhaseCapture, Commands: n, NewApplied: 0,
		Seconds: storedAt.Sub(rrStart).Seconds(), Errors: int64(want - stored),
		Mode: fmt.Sprintf("the stream stored %d of the %d commands sent, the last %.1fs after the last reply; the consumer confirmed all %.1fs after",
			stored-base, want-base, storedAt.Sub(rrEnd).Seconds(), settledAt.Sub(rrEnd).Seconds())}
	if stored < want {
		cr.Mode += " (errors: the commands JetStream dropped)"
	}
	cr.CommandsPerSec = float64(n) / cr.Seconds
	pr.out = append(pr.out, cr)
	log.Info("bench: capture caught up", "system", sys, "stored", n, "sent", want-base, "stored_per_sec", int(cr.CommandsPerSec),
		"stored_after", storedAt.Sub(rrEnd).Round(time.Millisecond), "confirmed_after", settledAt.Sub(rrEnd).Round(time.Millisecond))
	if cfg.JetStreamMessages <= 0 {
		return nil
	}
	settle := func() error {
		last, err := p.lastSeq(ctx)
		if err != nil {
			return err
		}
		return p.waitSettled(ctx, last, settleTimeout(int(last-base)), nil)
	}
	for _, js := range []struct {
		name string
		run  func(context.Context, *jsProbe, []*clientGen, int) (PhaseResult, error)
	}{{PhaseJSPublish, jsPublish}, {PhaseJSConsume, jsConsume}} {
		log.Info("bench", "phase", sys+"/"+js.name, "messages", cfg.JetStreamMessages)
		if _, err := pr.measure(js.name, func() (PhaseResult, error) {
			res, err := js.run(ctx, p, gens(js.name), cfg.JetStreamMessages)
			if err != nil {
				return res, fmt.Errorf("%s: %w", js.name, err)
			}
			return res, nil
		}); err != nil {
			return err
		}
		if err := settle(); err != nil {
			return err
		}
	}
	return nil
}

func resultOf(run *phaseRun) PhaseResult {
	s := run.elapsed.Seconds()
	c := &run.c
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	r := PhaseResult{
		System: run.spec.system, Phase: run.spec.phase, Seconds: s,
		Commands: c.answered.Load(), Duplicates: c.duplicates.Load(), NewApplied: c.newApplied.Load(),
		Rejected: c.rejected.Load(), Errors: c.errors.Load(), Anomalies: c.anomalies.Load(),
		NewAnswered: c.newAnswered.Load(), EarlyDuplicates: c.early.Load(),
		P50Ms: ms(percentile(run.lats, 50)), P99Ms: ms(percentile(run.lats, 99)), P999Ms: ms(percentile(run.lats, 99.9)),
		ErrorSamples: run.errs, Timeline: run.timeline,
	}
	if len(run.lats) > 0 {
		r.MaxMs = ms(run.lats[len(run.lats)-1])
	}
	if s > 0 {
		r.CommandsPerSec = float64(r.Commands) / s
		r.DuplicatesPerSec = float64(r.Duplicates) / s
	}
	return r
}

// openAccounts opens every account of w (unmeasured): a duplicate answer is fine
// (a data dir reused), any other outcome is an error.
func openAccounts(ctx context.Context, t *target, w *workload, clients int) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for i := 0; i < clients; i++ {
		req, err := t.requester(i)
		if err != nil {
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer req.close()
			for ctx.Err() == nil {
				k := int(next.Add(1)) - 1
				if k >= len(w.accounts) {
					return
				}
				acc := w.accounts[k]
				key := "open-" + acc
				rep, err := req.do(command{typ: domain.CmdOpenAccount, key: key, body: openBody(key, acc, w.currency)})
				if err == nil && rep.Status != domain.StatusApplied {
					err = fmt.Errorf("%s %s: %s", rep.Status, rep.Code, rep.Message)
				}
				if err != nil {
					errs <- fmt.Errorf("bench: open %s: %w", acc, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	return ctx.Err()
}

func machine() Machine {
	m := Machine{Cores: runtime.NumCPU(), GoVersion: runtime.Version(), LoadBefore: loadAvg()}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
				kb, _ := strconv.ParseInt(f[1], 10, 64)
				m.MemoryMB = kb / 1024
			}
		}
	}
	return m
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// describeDatabase records the server's version and whether it fsyncs.
func describeDatabase(ctx context.Context, url string, m *Machine) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	var fsync, syncCommit, version string
	if err := conn.QueryRow(ctx, `SELECT current_setting('fsync'), current_setting('synchronous_commit'), current_setting('server_version')`).Scan(&fsync, &syncCommit, &version); err != nil {
		return err
	}
	m.Fsync = fsync == "on" && syncCommit != "off"
	m.PostgresVer = version
	return nil
}

// natsSync names the JetStream fsync setting of the run.
func natsSync(cfg Config) string {
	switch {
	case cfg.NATSSyncAlways:
		return "always"
	case cfg.NATSSyncInterval > 0:
		return "every " + cfg.NATSSyncInterval.String()
	}
	return "every " + embednats.DefaultSyncInterval.String()
}

// settle vacuums and analyzes the databases in vacuum, then takes a checkpoint
// (through checkpointURL), so that the next system does not pay for what the
// previous ones wrote and every system starts right after a checkpoint (and
// the many-accounts phases after their bulk load: many.go). What the
// benchmark may not do (an external database without the rights) is logged,
// skipped and returned: the run goes on unsettled.
func settle(ctx context.Context, vacuum []string, checkpointURL string, log *slog.Logger) error {
	start := time.Now()
	var errs []error
	exec := func(url, sql string) {
		conn, err := pgx.Connect(ctx, url)
		if err == nil {
			_, err = conn.Exec(ctx, sql)
			conn.Close(ctx)
		}
		if err != nil {
			log.Warn("bench: settle", "sql", sql, "err", err)
			errs = append(errs, fmt.Errorf("%s: %w", sql, err))
		}
	}
	for _, url := range vacuum {
		exec(url, "VACUUM (ANALYZE)")
	}
	exec(checkpointURL, "CHECKPOINT")
	log.Info("bench: settled PostgreSQL (VACUUM ANALYZE, CHECKPOINT)", "vacuumed", len(vacuum), "took", time.Since(start).Round(time.Millisecond))
	return errors.Join(errs...)
}
