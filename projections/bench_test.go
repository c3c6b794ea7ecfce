package projections_test

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/internal/platform/config"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/projections"
	"github.com/ledgerworks/ledger/projections/projtest"
)

// Projection throughput, in events/s, over the PostgreSQL event store:
//
//	go test ./projections -run '^$' -bench . -benchtime 3x
//	LEDGER_BENCH_EVENTS=1000000 go test ./projections -run '^$' -bench Rebuild -benchtime 1x -timeout 30m
//
// LEDGER_BENCH_EVENTS sets the events written (default 100,000; half of them are
// key claims, which every projection reads and skips), LEDGER_BENCH_ACCOUNTS
// the accounts they are spread over (default one per 200 events),
// LEDGER_BENCH_BATCH the batch size (default: the runner's).
// LEDGER_BENCH_CPUPROFILE=<file> profiles the timed part only (-test.cpuprofile
// would include the seeding). LEDGER_BENCH_MEMPROFILE=<file> writes a heap
// profile of the timed part at its peak of live heap (memProfilePeak).
// LEDGER_BENCH_MEMSTATS=<file> writes, every 100 ms of the timed part, the
// process's resident set and the runtime's memory classes (memStats): what
// the peak RSS is made of. LEDGER_BENCH_SNAPSHOTS=1 has BenchmarkAudit write
// a snapshot of every account first (snapshotAccounts), which it checks
// (BenchmarkAuditIncremental too: its comment).

func benchInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// resetReadModels empties the live generations and rewinds their checkpoints.
// synthetic seeds the benchmark's history (LEDGER_BENCH_EVENTS over
// LEDGER_BENCH_ACCOUNTS) and returns the events written.
func synthetic(b *testing.B, env *projtest.Env, seed uint64) int {
	b.Helper()
	return env.SyntheticAccounts(b, benchInt("LEDGER_BENCH_EVENTS", 100_000), benchInt("LEDGER_BENCH_ACCOUNTS", 0), seed)
}

// profileTimed sets the read tools' memory limit for the timed part, as the
// tools set it (config.ReadToolMemoryLimit; a GOMEMLIMIT in the environment
// wins, GOMEMLIMIT=off measures without one), and starts
// LEDGER_BENCH_CPUPROFILE's CPU profile, if set; the function it returns
// stops it and puts back the limit.
func profileTimed(b *testing.B) func() { return profileTool(b, "") }

// profileTool is profileTimed for one tool of several in a benchmark: each
// profile's file is the variable's path with "-"+tool after it, where tool is
// not "".
func profileTool(b *testing.B, tool string) func() {
	b.Helper()
	restoreLimit, err := config.SetMemoryLimit(config.ReadToolMemoryLimit, false)
	if err != nil {
		b.Fatal(err)
	}
	stopStats, stopPeak := memStats(b, benchPath("LEDGER_BENCH_MEMSTATS", tool)), memProfilePeak(b, benchPath("LEDGER_BENCH_MEMPROFILE", tool))
	stopHeap := func() { stopPeak(); stopStats(); restoreLimit() }
	path := benchPath("LEDGER_BENCH_CPUPROFILE", tool)
	if path == "" {
		return stopHeap
	}
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		b.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			b.Error(err)
		}
		stopHeap()
	}
}

// memProfilePeak writes a heap profile to path (LEDGER_BENCH_MEMPROFILE's),
// unless it is "", each time the live heap (runtime/metrics' /gc/heap/live:bytes, as of the last
// collection) passes its peak so far by 1%, polled every 100 ms: the file left
// is the profile within 1% of the timed part's peak. (By 5%, a run whose heap
// peaked early and then grew by less left its early profile: the 1,000,000-event
// ones of BENCHMARKS.md, "What the fold keeps per account".) The function it
// returns stops it.
func memProfilePeak(b *testing.B, path string) func() {
	b.Helper()
	if path == "" {
		return func() {}
	}
	done, stopped := make(chan struct{}), make(chan struct{})
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	go func() {
		defer close(stopped)
		var peak uint64
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			metrics.Read(sample)
			if live := sample[0].Value.Uint64(); live > peak+peak/100 {
				peak = live
				if err := writeHeapProfile(path); err != nil {
					b.Error(err)
					return
				}
			}
		}
	}()
	return func() {
		close(done)
		<-stopped
	}
}

// memStatNames are the runtime/metrics memStats writes, after the
// process's VmRSS (kB, /proc/self/status).
var memStatNames = []string{
	"/gc/heap/live:bytes", "/gc/heap/goal:bytes", "/gc/cycles/total:gc-cycles",
	"/memory/classes/heap/objects:bytes", "/memory/classes/heap/unused:bytes",
	"/memory/classes/heap/free:bytes", "/memory/classes/heap/released:bytes",
	"/memory/classes/heap/stacks:bytes", "/memory/classes/os-stacks:bytes",
	"/memory/classes/metadata/other:bytes", "/memory/classes/metadata/mspan/inuse:bytes",
	"/memory/classes/other:bytes", "/memory/classes/profiling/buckets:bytes",
	"/memory/classes/total:bytes", "/sched/goroutines:goroutines",
}

// memStats writes to path (LEDGER_BENCH_MEMSTATS's), unless it is "": a header line,
// then every 100 ms the seconds since the start, VmRSS in bytes and
// memStatNames' values, tab-separated. The function it returns stops it.
func memStats(b *testing.B, path string) func() {
	b.Helper()
	if path == "" {
		return func() {}
	}
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	w := bufio.NewWriter(f)
	fmt.Fprintf(w, "s\tVmRSS\t%s\n", strings.Join(memStatNames, "\t"))
	samples := make([]metrics.Sample, len(memStatNames))
	for i, n := range memStatNames {
		samples[i].Name = n
	}
	done, stopped := make(chan struct{}), make(chan struct{})
	start := time.Now()
	go func() {
		defer close(stopped)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			metrics.Read(samples)
			fmt.Fprintf(w, "%.1f\t%d", time.Since(start).Seconds(), vmRSS())
			for _, s := range samples {
				fmt.Fprintf(w, "\t%d", s.Value.Uint64())
			}
			fmt.Fprintln(w)
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	return func() {
		close(done)
		<-stopped
		if err := cmp.Or(w.Flush(), f.Close()); err != nil {
			b.Error(err)
		}
	}
}

// benchPath is the file the environment variable name gives ("": none), with
// "-"+tool after it where tool is not "".
func benchPath(name, tool string) string {
	path := os.Getenv(name)
	if path == "" || tool == "" {
		return path
	}
	return path + "-" + tool
}

// vmRSS is the process's resident set in bytes (0 where /proc has none).
func vmRSS() int64 {
	kb, _ := procStatusKB("VmRSS")
	return kb * 1024
}

// procStatusKB reads a field of /proc/self/status, in kB.
func procStatusKB(field string) (int64, error) {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(status)) {
		if kb, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(kb), "kB")), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s %q: %w", field, kb, err)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("no %s in /proc/self/status", field)
}

func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// peakRSS returns the memory freed to the OS and resets the process's peak
// resident set (Linux's /proc/self/clear_refs); the function it returns
// reports the peak since as the metric name, in MiB. Elsewhere it reports
// nothing.
func peakRSS(b *testing.B) func(name string) {
	b.Helper()
	debug.FreeOSMemory()
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		b.Logf("peak RSS not measured: %v", err)
		return func(string) {}
	}
	return func(name string) {
		kb, err := procStatusKB("VmHWM")
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(kb)/1024, name)
	}
}

func resetReadModels(b *testing.B, env *projtest.Env) {
	b.Helper()
	_, err := env.Pool.Exec(context.Background(), `DO $$
DECLARE r record; t text;
BEGIN
	FOR r IN SELECT name, generation FROM readmodel.checkpoints WHERE state = 'live' LOOP
		FOR t IN SELECT * FROM readmodel.generation_tables(r.name, r.generation) LOOP
			EXECUTE format('TRUNCATE readmodel.%I', t);
		END LOOP;
	END LOOP;
	UPDATE readmodel.checkpoints SET commit_position = 0, prepare_position = 0, events = 0;
END $$`)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := env.Pool.Exec(context.Background(), `VACUUM ANALYZE`); err != nil {
		b.Fatal(err)
	}
}

func BenchmarkProjection(b *testing.B) {
	env := projtest.New(b)
	total := synthetic(b, env, 1)
	var elapsed time.Duration
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		resetReadModels(b, env)
		r, err := projections.NewRunner(env.Pool, env.Store, projections.Options{BatchSize: benchInt("LEDGER_BENCH_BATCH", 0)})
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		for {
			n, err := r.Step(context.Background())
			if err != nil {
				b.Fatal(err)
			}
			if n == 0 {
				break
			}
		}
		elapsed += time.Since(start)
	}
	b.StopTimer()
	var consumed int64
	if err := env.Pool.QueryRow(context.Background(), `SELECT min(events) FROM readmodel.checkpoints`).Scan(&consumed); err != nil || consumed != int64(total) {
		b.Fatalf("projected %d of %d events (%v)", consumed, total, err)
	}
	b.ReportMetric(float64(total*b.N)/elapsed.Seconds(), "events/s")
}

func BenchmarkRebuild(b *testing.B) {
	env := projtest.New(b)
	total := synthetic(b, env, 2)
	pool := rebuildPool(b, env)
	peak, stop := peakRSS(b), profileTimed(b)
	var elapsed time.Duration
	b.ResetTimer()
	for range b.N {
		elapsed += benchRebuild(b, env, pool)
	}
	b.StopTimer()
	stop()
	peak("peak-RSS-MiB")
	b.ReportMetric(float64(total*b.N)/elapsed.Seconds(), "events/s")
	b.ReportMetric(elapsed.Seconds()/float64(b.N), "s/rebuild")
}

func BenchmarkAudit(b *testing.B) {
	env := projtest.New(b)
	total := synthetic(b, env, 3)
	project(b, env)
	snapshots := snapshotAccounts(b, env)
	peak, stop := peakRSS(b), profileTimed(b)
	b.ResetTimer()
	for range b.N {
		// A snapshot past the projector's checkpoint has its closed holds
		// unchecked: the run would time an audit that skipped that check.
		if rep := benchAudit(b, env, audit.Options{}); rep.Snapshots != snapshots || rep.HoldsUnchecked != 0 {
			b.Fatalf("%d snapshots checked of %d, the closed holds of %d of them unchecked", rep.Snapshots, snapshots, rep.HoldsUnchecked)
		}
	}
	b.StopTimer()
	stop()
	peak("peak-RSS-MiB")
	b.ReportMetric(float64(total*b.N)/b.Elapsed().Seconds(), "events/s")
}

// snapshotAccounts writes, when LEDGER_BENCH_SNAPSHOTS is set, a snapshot of
// every account at its last revision as a ledger keeps it (closed holds up to
// 1,024), taken an hour before, and returns how many.
func snapshotAccounts(b *testing.B, env *projtest.Env) int {
	b.Helper()
	if benchInt("LEDGER_BENCH_SNAPSHOTS", 0) == 0 {
		return 0
	}
	n := writeSnapshots(b, env, accountSnapshots(b, env))
	// Taken an hour ago, as a ledger's snapshots before a checkpoint were
	// written long before the audit that stored it (up to 3bc829e an
	// incremental audit folded each account's stream from its first event
	// for one taken in the 5 minutes before that audit began).
	if _, err := env.Pool.Exec(context.Background(), `UPDATE snapshots SET taken = taken - interval '1 hour'`); err != nil {
		b.Fatal(err)
	}
	return n
}

// accountSnapshots is a snapshot of every account at its last revision as a
// ledger keeps it (closed holds up to 1,024).
func accountSnapshots(b *testing.B, env *projtest.Env) []eventstore.Snapshot {
	b.Helper()
	ctx := context.Background()
	rows, err := env.Pool.Query(ctx, `SELECT DISTINCT stream FROM events WHERE stream LIKE $1`, domain.AccountStreamPrefix+"%")
	if err != nil {
		b.Fatal(err)
	}
	streams, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		b.Fatal(err)
	}
	snaps := make([]eventstore.Snapshot, 0, len(streams))
	for _, stream := range streams {
		evs, err := env.Store.ReadStream(ctx, stream, 0, eventstore.Forwards, 0)
		if err != nil {
			b.Fatal(err)
		}
		a := domain.NewAccount(strings.TrimPrefix(stream, domain.AccountStreamPrefix))
		a.HoldLimit = 1024
		for _, re := range evs {
			devtest.EvolveRecorded(b, a, re)
		}
		data, err := domain.EncodeSnapshot(stream, a)
		if err != nil {
			b.Fatal(err)
		}
		snaps = append(snaps, eventstore.Snapshot{Stream: stream, Revision: uint64(a.Revision), Data: data})
	}
	return snaps
}

// writeSnapshots writes snaps and returns how many.
func writeSnapshots(b *testing.B, env *projtest.Env, snaps []eventstore.Snapshot) int {
	b.Helper()
	for _, sn := range snaps {
		if err := env.Store.WriteSnapshot(context.Background(), sn); err != nil {
			b.Fatal(err)
		}
	}
	return len(snaps)
}

// BenchmarkReadTools: BenchmarkRebuild and then BenchmarkAudit on one
// seeding (the rebuild makes the read models the audit compares), each
// with its rate and its own peak RSS, each under the tools' memory limit as
// `projector rebuild` and `ledger audit` run (profileTool; GOMEMLIMIT=off
// measures without it), with its own profiles (their files end in -rebuild
// and -audit): the 10,000,000-event figures in one run,
//
//	LEDGER_BENCH_EVENTS=10000000 LEDGER_BENCH_ACCOUNTS=100000 go test ./projections -run '^$' -bench ReadTools -benchtime 1x -timeout 170m
func BenchmarkReadTools(b *testing.B) {
	env := projtest.New(b)
	total := synthetic(b, env, 5)
	pool := rebuildPool(b, env)
	var rebuild, auditing time.Duration
	b.ResetTimer()
	for range b.N {
		peak, stop := peakRSS(b), profileTool(b, "rebuild")
		rebuild += benchRebuild(b, env, pool)
		stop()
		peak("rebuild-peak-RSS-MiB")
		peak, stop = peakRSS(b), profileTool(b, "audit")
		start := time.Now()
		benchAudit(b, env, audit.Options{})
		auditing += time.Since(start)
		stop()
		peak("audit-peak-RSS-MiB")
	}
	b.ReportMetric(float64(total*b.N)/rebuild.Seconds(), "rebuild-events/s")
	b.ReportMetric(float64(total*b.N)/auditing.Seconds(), "audit-events/s")
}

// auditPools are the benchmarks' audit pools, one an env (auditPool).
var auditPools sync.Map // *projtest.Env -> *pgxpool.Pool

// auditPool is env's pool for its audits, opened as `ledger audit` opens
// its own (projections.NewAuditPool: without JIT) once an env, so that an
// audit after the first finds its connections open as on env.Pool before.
func auditPool(b *testing.B, env *projtest.Env) *pgxpool.Pool {
	b.Helper()
	if p, ok := auditPools.Load(env); ok {
		return p.(*pgxpool.Pool)
	}
	pool, err := projections.NewAuditPool(context.Background(), env.URL)
	if err != nil {
		b.Fatal(err)
	}
	auditPools.Store(env, pool)
	b.Cleanup(func() { auditPools.Delete(env); pool.Close() })
	return pool
}

// rebuildPool is the pool a rebuild runs on: the projector's
// (projections.NewPool), as `projector rebuild` does; its projections and its
// check hold connections at once, more than the test pool's four.
func rebuildPool(b *testing.B, env *projtest.Env) *pgxpool.Pool {
	b.Helper()
	pool, err := projections.NewPool(context.Background(), env.URL)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	return pool
}

// benchRebuild rebuilds every projection, checked, and returns its time.
func benchRebuild(b *testing.B, env *projtest.Env, pool *pgxpool.Pool) time.Duration {
	b.Helper()
	start := time.Now()
	_, err := projections.Rebuild(context.Background(), pool, env.Store, projections.RebuildOptions{
		BatchSize: benchInt("LEDGER_BENCH_BATCH", 0), Check: audit.VerifyGeneration(pool, env.Store),
	})
	if err != nil {
		b.Fatal(err)
	}
	return time.Since(start)
}

// BenchmarkAuditIncremental: a full audit storing its checkpoint, then, after
// LEDGER_BENCH_INCREMENT_PERMILLE more events (default 10: 1%) on the same
// accounts, the audit from that checkpoint (storing its own, as `ledger
// audit --from` does); each iteration audits the history written so far. It
// reports both audits' seconds and the ratio incremental/full (the issue's
// target: at most 0.02 for the last 1%) and the accounts the incremental
// audit read (CheckpointRef.AccountsRead). LEDGER_BENCH_CPUPROFILE and the
// other profiles (profileTimed) cover the incremental audit alone.
// LEDGER_BENCH_SNAPSHOTS=1 writes a snapshot of every account
// (snapshotAccounts) and then five increments more before the full audit,
// so that most snapshots are before the checkpoint, as a ledger's taken
// every SnapshotEvery events are; LEDGER_BENCH_SNAPSHOTS=2 also takes a
// snapshot of every account at its last revision then, writes one increment
// more, and writes those snapshots while the full audit runs, at its last
// progress report (its fold at the head, after it listed the snapshots and
// before it stores its checkpoint; the writes' time is not counted): of the
// accounts the increment between touched, each of a revision its fold passed
// and did not check, as one the ledger writes in the background while that
// audit runs (it reports snapshots-checked and snapshots-trusted of the
// incremental audit).
//
//	LEDGER_BENCH_EVENTS=1000000 go test ./projections -run '^$' -bench AuditIncremental -benchtime 1x -timeout 60m
func BenchmarkAuditIncremental(b *testing.B) {
	env := projtest.New(b)
	n := benchInt("LEDGER_BENCH_EVENTS", 100_000)
	more := max(n*benchInt("LEDGER_BENCH_INCREMENT_PERMILLE", 10)/1000, 1)
	h := env.NewSynthetic(b, max(n/200, 10), 4)
	h.Write(n)
	if snapshotAccounts(b, env) > 0 {
		h.Write(5 * more)
	}
	var later []eventstore.Snapshot // written after the checkpointing audit
	if benchInt("LEDGER_BENCH_SNAPSHOTS", 0) == 2 {
		later = accountSnapshots(b, env)
		h.Write(more)
	}
	var full, inc time.Duration
	var read, checked, trusted int64 // the checkpoint's account rows the incremental audits read, the snapshots they checked and trusted
	clock := newCPUClock(b, env.Pool)
	var fullCPU, incCPU cpuSpent
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		project(b, env)
		b.StartTimer()
		start := time.Now()
		opts, writing := writeAtTheHead(b, env, later)
		spent := clock.start(&fullCPU)
		cp := benchAudit(b, env, opts).Checkpoint
		spent()
		full += time.Since(start) - *writing
		b.StopTimer()
		later = nil
		h.Write(more)
		project(b, env)
		b.StartTimer()
		start = time.Now()
		stop, spent := profileTimed(b), clock.start(&incCPU) // the incremental audit's alone
		rep := benchAudit(b, env, audit.Options{SaveCheckpoint: true, From: &cp.ID})
		spent()
		stop()
		read, checked, trusted = read+rep.From.AccountsRead, checked+int64(rep.Snapshots), trusted+int64(rep.SnapsTrusted)
		inc += time.Since(start)
	}
	b.ReportMetric(full.Seconds()/float64(b.N), "full-s")
	b.ReportMetric(inc.Seconds()/float64(b.N), "incremental-s")
	b.ReportMetric(inc.Seconds()/full.Seconds(), "incremental/full")
	reportCPU(b, "full", fullCPU)
	reportCPU(b, "incremental", incCPU)
	b.ReportMetric(float64(read)/float64(b.N), "accounts-read")
	b.ReportMetric(float64(checked)/float64(b.N), "snapshots-checked")
	b.ReportMetric(float64(trusted)/float64(b.N), "snapshots-trusted")
}

// writeAtTheHead is a checkpointing audit's options that write snaps (when
// any) at its progress report of the store's last event, and the time the
// writes take once it has run; the run fails when it made no such report.
func writeAtTheHead(b *testing.B, env *projtest.Env, snaps []eventstore.Snapshot) (audit.Options, *time.Duration) {
	b.Helper()
	opts, took := audit.Options{SaveCheckpoint: true}, new(time.Duration)
	if len(snaps) == 0 {
		return opts, took
	}
	var total int64
	if err := env.Pool.QueryRow(context.Background(), `SELECT count(*) FROM events`).Scan(&total); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if snaps != nil {
			b.Errorf("the audit reported no progress at the store's %d events: the snapshots were not written", total)
		}
	})
	opts.Progress = func(done, carried int64) {
		if done+carried >= total && snaps != nil {
			start := time.Now()
			writeSnapshots(b, env, snaps)
			snaps, *took = nil, time.Since(start)
		}
	}
	return opts, took
}

// project brings the live read models up to the store's head (settled
// first: the store shows no event newer than a transaction still running).
func project(b *testing.B, env *projtest.Env) {
	b.Helper()
	devtest.Settle(b, env.Store)
	r, err := projections.NewRunner(env.Pool, env.Store, projections.Options{})
	if err != nil {
		b.Fatal(err)
	}
	for {
		n, err := r.Step(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		if n == 0 {
			return
		}
	}
}

// benchAudit audits the store (the chains verified, the read models
// compared) on env's audit pool (auditPool) and fails on any violation.
func benchAudit(b *testing.B, env *projtest.Env, opts audit.Options) *audit.Report {
	b.Helper()
	opts.ReadModels, opts.VerifyChain = auditPool(b, env), true
	rep, err := audit.Run(context.Background(), env.Store, opts)
	if err != nil {
		b.Fatal(err)
	}
	if !rep.OK() {
		b.Fatalf("%d violations: %v", rep.ViolationCount, rep.Violations[:min(5, len(rep.Violations))])
	}
	return rep
}
