package projections_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/internal/platform/pgerr"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/projections"
	"github.com/ledgerworks/ledger/projections/projtest"
)

func rebuild(t *testing.T, env *projtest.Env, opts projections.RebuildOptions) ([]projections.RebuildResult, error) {
	t.Helper()
	if opts.Check == nil {
		opts.Check = audit.VerifyGeneration(env.Pool, env.Store)
	}
	return projections.Rebuild(context.Background(), env.Pool, env.Store, opts)
}

func liveGenerations(t *testing.T, env *projtest.Env) map[string]int {
	t.Helper()
	st, err := projections.ReadStatus(context.Background(), env.Pool, env.Store)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, s := range st {
		if strings.HasPrefix(s.Projection, "publisher:") {
			continue // not a read model: a rebuild leaves it alone (TestRebuildNeverRepublishes)
		}
		if s.State != "live" {
			t.Fatalf("a generation is left %s: %+v", s.State, s)
		}
		out[s.Projection] = s.Generation
	}
	return out
}

func TestReadModelsEqualARebuild(t *testing.T) {
	env := projtest.New(t)
	env.Run(t, projtest.Workload{Commands: 500, DupRate: 0.3, Seed: 30})
	devtest.CatchUp(t, newRunner(t, env, projections.Options{BatchSize: 11}))
	live := projtest.Snapshot(t, env.Pool)
	before := liveGenerations(t, env)

	var progress atomic.Int64
	res, err := rebuild(t, env, projections.RebuildOptions{BatchSize: 64, Progress: func(n, _ int64) { progress.Store(n) }})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != len(projections.Names) || progress.Load() != storeEvents(t, env) {
		t.Fatalf("results %+v, progress %d", res, progress.Load())
	}
	after := liveGenerations(t, env)
	for name, g := range after {
		if g <= before[name] {
			t.Fatalf("%s: generation %d after the rebuild, %d before", name, g, before[name])
		}
	}
	projtest.SameSnapshot(t, "live read models vs a rebuild from scratch", live, projtest.Snapshot(t, env.Pool))
	// The runner goes on with the new generation.
	env.Run(t, projtest.Workload{Commands: 50, Seed: 31, Prefix: "x"})
	devtest.CatchUp(t, newRunner(t, env, projections.Options{}))
	projtest.AuditOK(t, env.Store, env.Pool)

	// One projection alone.
	res, err = rebuild(t, env, projections.RebuildOptions{Projections: []string{projections.Entries}})
	if err != nil || len(res) != 1 || res[0].Projection != projections.Entries || res[0].Previous != after[projections.Entries] {
		t.Fatalf("rebuild of entries: %+v, %v", res, err)
	}
	projtest.AuditOK(t, env.Store, env.Pool)
}

// TestRebuildPastItsMemoBound: a rebuild whose builders remember more
// accounts than their memo's bound reads the others' last rows back from the
// generation, and builds the same read models as the live runner.
func TestRebuildPastItsMemoBound(t *testing.T) {
	env := projtest.New(t)
	env.Run(t, projtest.Workload{Commands: 300, Seed: 32})
	devtest.CatchUp(t, newRunner(t, env, projections.Options{}))
	live := projtest.Snapshot(t, env.Pool)
	defer projections.SetMemoAccountsLimit(3)()
	if _, err := rebuild(t, env, projections.RebuildOptions{BatchSize: 40}); err != nil {
		t.Fatal(err)
	}
	projtest.SameSnapshot(t, "live read models vs a rebuild past its memo's bound", live, projtest.Snapshot(t, env.Pool))
}

func TestRebuildUnderLiveTraffic(t *testing.T) {
	env := projtest.New(t)
	env.Run(t, projtest.Workload{Commands: 300, Seed: 40, Prefix: "p"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	live := devtest.Go(t, newRunner(t, env, projections.Options{BatchSize: 50, PollInterval: 2 * time.Millisecond}).Run) // the live projector
	var wg sync.WaitGroup
	wg.Add(2)
	trafficDone := make(chan struct{})
	go func() { // live traffic
		defer wg.Done()
		defer close(trafficDone)
		for i := 0; ctx.Err() == nil && i < 40; i++ {
			env.Run(t, projtest.Workload{Commands: 30, Accounts: 3, Seed: uint64(41 + i), Prefix: fmt.Sprintf("l%d", i)})
		}
	}()
	before := liveGenerations(t, env)[projections.Accounts]
	var reads, firstGen, lastGen atomic.Int64 // the accounts' live generation of the reader's first and last reads
	readerErr := make(chan error, 1)
	go func() { // readers: never a half-built model (counts never go down), never an error
		defer wg.Done()
		var maxAccounts, maxEntries, maxCommands int64
		for ctx.Err() == nil {
			var a, e, c, gen int64
			err := env.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM readmodel.accounts), (SELECT count(*) FROM readmodel.entries),
				(SELECT count(*) FROM readmodel.commands),
				(SELECT generation FROM readmodel.checkpoints WHERE name = $1 AND state = 'live')`, projections.Accounts).Scan(&a, &e, &c, &gen)
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				readerErr <- fmt.Errorf("query during the rebuild: %w", err)
				return
			}
			if a < maxAccounts || e < maxEntries || c < maxCommands {
				readerErr <- fmt.Errorf("a reader saw %d accounts, %d entries, %d commands after %d, %d, %d", a, e, c, maxAccounts, maxEntries, maxCommands)
				return
			}
			maxAccounts, maxEntries, maxCommands = a, e, c
			firstGen.CompareAndSwap(0, gen)
			lastGen.Store(gen)
			reads.Add(1)
		}
	}()
	// The readers read the live generation before the rebuild starts, and go
	// on until they have read the one it switched to: their reads span the
	// switch.
	awaitReader(t, readerErr, "a first read", func() bool { return reads.Load() > 0 })
	res, err := rebuild(t, env, projections.RebuildOptions{BatchSize: 40})
	if err != nil {
		t.Fatal(err)
	}
	after := int64(liveGenerations(t, env)[projections.Accounts])
	awaitReader(t, readerErr, "a read of the new generation", func() bool { return lastGen.Load() == after })
	if first := firstGen.Load(); first != int64(before) || after == first {
		t.Fatalf("the readers read generation %d first and %d last, want %d then the rebuild's", first, lastGen.Load(), before)
	}
	<-trafficDone
	waitCaughtUp(t, env)
	if err := live.Stop(); err != nil {
		t.Fatal(err)
	}
	cancel()
	wg.Wait()
	select {
	case err := <-readerErr:
		t.Fatal(err)
	default:
	}
	projtest.AuditOK(t, env.Store, env.Pool)
	if got, want := eventsConsumed(t, env), storeEvents(t, env); got[projections.Accounts] != want || got[projections.Commands] != want {
		var below, nonledger int64
		cp := checkpoints(t, env)[projections.Accounts]
		env.Pool.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE (transaction_id::text::numeric, position) <= ($1::numeric, $2)), count(*) FILTER (WHERE stream NOT LIKE 'account-%' AND stream NOT LIKE 'key-%' AND stream NOT LIKE 'transfer-%') FROM events`, cp.Commit, cp.Prepare).Scan(&below, &nonledger)
		t.Fatalf("events consumed %v, store holds %d (%d at or below the checkpoint %s, %d of other streams); %+v", got, want, below, cp, nonledger, res)
	}
	t.Logf("%d reads during the rebuild; %+v", reads.Load(), res)
}

// awaitReader polls until done says the reader got as far as what names, and
// fails the test if the reader failed first.
func awaitReader(t *testing.T, readerErr chan error, what string, done func() bool) {
	t.Helper()
	devtest.Await(t, 2*time.Minute, func() error {
		select {
		case err := <-readerErr:
			t.Fatal(err)
		default:
		}
		if !done() {
			return fmt.Errorf("the readers have not done %s", what)
		}
		return nil
	})
}

func TestRebuildRefusesATamperedGeneration(t *testing.T) {
	env := projtest.New(t)
	env.Run(t, projtest.Workload{Commands: 200, Seed: 50})
	devtest.CatchUp(t, newRunner(t, env, projections.Options{}))
	live := projtest.Snapshot(t, env.Pool)
	before := liveGenerations(t, env)
	err := rebuildAlteringEntriesOnce(t, env, `UPDATE %s SET amount = amount + 1
		WHERE event_id = (SELECT event_id FROM %[1]s ORDER BY event_id LIMIT 1)`)
	if !errors.Is(err, audit.ErrGenerationMismatch) || !strings.Contains(err.Error(), "entries") || !strings.Contains(err.Error(), "differing row") {
		t.Fatalf("the rebuild took a tampered generation: %v", err)
	}
	t.Log(err)
	// The live generations stay; the tampered one is gone; the others switched.
	entriesRefusedOthersSwitched(t, env, before)
	projtest.SameSnapshot(t, "read models after a refused rebuild", live, projtest.Snapshot(t, env.Pool))
	projtest.AuditOK(t, env.Store, env.Pool)
}

// TestRebuildDropsAGenerationWhoseIndexFails: a duplicate row in a generation
// being built fails the build of its unique index after the load (migration
// 00019); that projection's generation is refused and dropped, the error names
// it, its verdict and what to do, the others switch, and a plain rebuild run
// again builds it afresh.
func TestRebuildDropsAGenerationWhoseIndexFails(t *testing.T) {
	env := projtest.New(t)
	env.Run(t, projtest.Workload{Commands: 200, Seed: 51})
	devtest.CatchUp(t, newRunner(t, env, projections.Options{}))
	live := projtest.Snapshot(t, env.Pool)
	before := liveGenerations(t, env)
	err := rebuildAlteringEntriesOnce(t, env, `INSERT INTO %s SELECT * FROM %[1]s ORDER BY event_id LIMIT 1`)
	if err == nil || !strings.Contains(err.Error(), "rebuild of entries refused") || !strings.Contains(err.Error(), pgerr.UniqueViolation) || !strings.Contains(err.Error(), "run the rebuild again") {
		t.Fatalf("the rebuild did not refuse entries for its index: %v", err)
	}
	if !errors.Is(err, audit.ErrGenerationMismatch) || !strings.Contains(err.Error(), "unexpected row") {
		t.Fatalf("the check's verdict on the duplicate is not in the error: %v", err)
	}
	t.Log(err)
	entriesRefusedOthersSwitched(t, env, before)
	projtest.SameSnapshot(t, "read models after a refused rebuild", live, projtest.Snapshot(t, env.Pool))

	// Run again, plainly: entries is built afresh and switches.
	if _, err := rebuild(t, env, projections.RebuildOptions{BatchSize: 30}); err != nil {
		t.Fatalf("the rebuild run again: %v", err)
	}
	if again := liveGenerations(t, env); again[projections.Entries] == before[projections.Entries] {
		t.Fatal("entries did not switch on the rebuild run again")
	}
	projtest.SameSnapshot(t, "read models after the rebuild run again", live, projtest.Snapshot(t, env.Pool))
	projtest.AuditOK(t, env.Store, env.Pool)
}

// rebuildAlteringEntriesOnce rebuilds every projection, running stmt (%s: the
// entries generation being built) once after a build batch, and returns the
// rebuild's error; it fails t if stmt changed no row.
func rebuildAlteringEntriesOnce(t *testing.T, env *projtest.Env, stmt string) error {
	t.Helper()
	var altered atomic.Bool
	_, err := rebuild(t, env, projections.RebuildOptions{
		BatchSize: 30,
		AfterBatch: func(ctx context.Context, gens map[string]int) error {
			if altered.Load() {
				return nil
			}
			ct, err := env.Pool.Exec(ctx, fmt.Sprintf(stmt, projections.Table("entries", gens[projections.Entries])))
			if err != nil {
				return err
			}
			altered.Store(ct.RowsAffected() == 1)
			return nil
		},
	})
	if !altered.Load() {
		t.Fatal("no row of entries was altered")
	}
	return err
}

// entriesRefusedOthersSwitched fails t unless entries is still at its live
// generation of before, its refused one dropped, while the others switched and
// none is left building.
func entriesRefusedOthersSwitched(t *testing.T, env *projtest.Env, before map[string]int) {
	t.Helper()
	after := liveGenerations(t, env) // fails on a generation left building
	if after[projections.Entries] != before[projections.Entries] {
		t.Fatalf("entries switched to generation %d", after[projections.Entries])
	}
	for _, name := range []string{projections.Accounts, projections.Balances} {
		if after[name] == before[name] {
			t.Fatalf("%s did not switch", name)
		}
	}
	var left int
	if err := env.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_tables WHERE schemaname = 'readmodel' AND tablename LIKE 'entries_g%'`).Scan(&left); err != nil || left != 1 {
		t.Fatalf("%d entries generations left (%v)", left, err)
	}
}

// TestRebuildStoppedAndResumed: a rebuild stopped half-way (its context ended
// after some batches) leaves its generations being built; the next rebuild
// resumes them from their checkpoints, reading only what they lack, and the
// read models it switches to equal those of a rebuild run through. With Fresh
// it starts anew.
func TestRebuildStoppedAndResumed(t *testing.T) {
	env := projtest.New(t)
	env.Run(t, projtest.Workload{Commands: 400, Seed: 40})
	devtest.CatchUp(t, newRunner(t, env, projections.Options{}))
	total := storeEvents(t, env)
	if _, err := rebuild(t, env, projections.RebuildOptions{BatchSize: 50}); err != nil {
		t.Fatal(err)
	}
	through := projtest.Snapshot(t, env.Pool)

	ctx, stop := context.WithCancel(context.Background())
	batches := 0
	_, err := projections.Rebuild(ctx, env.Pool, env.Store, projections.RebuildOptions{BatchSize: 50,
		Check: audit.VerifyGeneration(env.Pool, env.Store),
		AfterBatch: func(context.Context, map[string]int) error {
			if batches++; batches == 5 {
				stop()
			}
			return nil
		}})
	if err == nil {
		t.Fatal("a stopped rebuild succeeded")
	}
	st, err := projections.ReadStatus(context.Background(), env.Pool, env.Store)
	if err != nil {
		t.Fatal(err)
	}
	building := 0
	for _, s := range st {
		if s.State == "building" {
			building++
		}
	}
	if building != len(projections.Names) {
		t.Fatalf("%d generations left being built after the stop: %+v", building, st)
	}

	var read, carried atomic.Int64
	res, err := rebuild(t, env, projections.RebuildOptions{BatchSize: 50, Progress: func(n, c int64) { read.Store(n); carried.Store(c) }})
	if err != nil || len(res) != len(projections.Names) {
		t.Fatalf("resumed rebuild: %+v, %v", res, err)
	}
	for _, r := range res {
		if r.Events != total {
			t.Fatalf("%s: the resumed generation counts %d events of %d", r.Projection, r.Events, total)
		}
	}
	if n := read.Load(); n == 0 || n > total-250 {
		t.Fatalf("the resumed rebuild read %d of the %d events (5 batches of 50 were built before the stop)", n, total)
	}
	// Its progress counts from where it resumed: the events it read and those
	// its checkpoint carried make the store's, none counted twice.
	if n, c := read.Load(), carried.Load(); c < 250 || n+c != total {
		t.Fatalf("the resumed rebuild's progress: %d read after %d carried, want %d in all, at least 250 carried", n, c, total)
	}
	projtest.SameSnapshot(t, "a rebuild stopped and resumed vs one run through", through, projtest.Snapshot(t, env.Pool))

	// Fresh: stopped again, then built anew.
	ctx, stop = context.WithCancel(context.Background())
	batches = 0
	if _, err := projections.Rebuild(ctx, env.Pool, env.Store, projections.RebuildOptions{BatchSize: 50,
		AfterBatch: func(context.Context, map[string]int) error {
			if batches++; batches == 2 {
				stop()
			}
			return nil
		}}); err == nil {
		t.Fatal("a stopped rebuild succeeded")
	}
	if res, err := rebuild(t, env, projections.RebuildOptions{Fresh: true}); err != nil || res[0].Events != total {
		t.Fatalf("fresh rebuild: %+v, %v", res, err)
	}
	projtest.SameSnapshot(t, "a fresh rebuild vs one run through", through, projtest.Snapshot(t, env.Pool))
}

// TestRebuildKeepsTheSchema: a rebuild loads its generations without the
// indexes its writes do not need and builds them after the load (migrations
// 00009 and 00019); the generations it switches to must have every index and
// constraint of a generation made whole (create_generation, then
// create_secondary_indexes, as the migrations make the first).
func TestRebuildKeepsTheSchema(t *testing.T) {
	env := projtest.New(t)
	env.Run(t, projtest.Workload{Commands: 60, Seed: 70})
	devtest.CatchUp(t, newRunner(t, env, projections.Options{}))
	if _, err := rebuild(t, env, projections.RebuildOptions{BatchSize: 20}); err != nil {
		t.Fatal(err)
	}
	const whole = 99999
	for name, gen := range liveGenerations(t, env) {
		if _, err := env.Pool.Exec(context.Background(), `SELECT readmodel.create_generation($1, $2), readmodel.create_secondary_indexes($1, $2)`, name, whole); err != nil {
			t.Fatal(err)
		}
		want, got := generationSchema(t, env, name, whole), generationSchema(t, env, name, gen)
		if _, err := env.Pool.Exec(context.Background(), `SELECT readmodel.drop_generation($1, $2)`, name, whole); err != nil {
			t.Fatal(err)
		}
		if len(want) == 0 || strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("%s: generation %d, rebuilt, has\n%s\nwhere a generation made whole has\n%s", name, gen, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	}
}

// generationSchema lists the indexes and constraints of a generation's
// tables, sorted, with the generation's number taken out of their names.
func generationSchema(t *testing.T, env *projtest.Env, name string, gen int) []string {
	t.Helper()
	rows, err := env.Pool.Query(context.Background(), `
		SELECT replace('index ' || i.indexname || ': ' || i.indexdef, '_g' || $2 || ' ', '_gN ')
		FROM readmodel.generation_tables($1, $2) g JOIN pg_indexes i ON i.schemaname = 'readmodel' AND i.tablename = g
		UNION ALL
		SELECT 'constraint ' || c.conname || ': ' || pg_get_constraintdef(c.oid)
		FROM readmodel.generation_tables($1, $2) g JOIN pg_constraint c ON c.conrelid = ('readmodel.' || quote_ident(g))::regclass`, name, gen)
	if err != nil {
		t.Fatal(err)
	}
	defs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for i, d := range defs {
		defs[i] = strings.ReplaceAll(strings.ReplaceAll(d, fmt.Sprintf("_g%d_", gen), "_gN_"), fmt.Sprintf("_g%d", gen), "_gN")
	}
	sort.Strings(defs)
	return defs
}

// TestRebuildStoppedInItsCheckResumes: a rebuild stopped (its context ended)
// as its check begins (on main before, its generations were dropped), after
// its index builds, during its check or its switch, or whose check
// could not be done (an infrastructure error, not a verdict), drops no
// generation as differing from the store: it returns that error, leaves
// every generation being built and the live ones as they were, and the
// next rebuild resumes them to read models equal to a rebuild run through.
func TestRebuildStoppedInItsCheckResumes(t *testing.T) {
	env := projtest.New(t)
	env.Run(t, projtest.Workload{Commands: 200, Seed: 41})
	devtest.CatchUp(t, newRunner(t, env, projections.Options{}))
	if _, err := rebuild(t, env, projections.RebuildOptions{BatchSize: 50}); err != nil {
		t.Fatal(err)
	}
	through := projtest.Snapshot(t, env.Pool)
	lost := errors.New("connection lost")
	for _, c := range []struct {
		name string
		when stopWhen
		want error
	}{
		{"stopped as the check begins", stopInBegin, context.Canceled},
		{"stopped during the check", stopInCheck, context.Canceled},
		{"stopped at the switch", stopAtSwitch, context.Canceled},
		{"the check could not be done", failCheck, lost},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := liveGenerations(t, env)
			ctx, stop := context.WithCancel(context.Background())
			defer stop()
			held, release := []string(nil), func() {} // left being built: all, but at the switch the one held
			if c.when == stopAtSwitch {
				held = []string{projections.Transfers}
				release = stopWhenSwitchWaits(t, env, ctx, stop, projections.Transfers)
			}
			check := &interruptedCheck{Check: audit.VerifyGeneration(env.Pool, env.Store), built: new(atomic.Int64), when: c.when, stop: stop, lost: lost}
			logger := slog.New(indexLog{slog.Default().Handler(), check.built})
			_, err := projections.Rebuild(ctx, env.Pool, env.Store, projections.RebuildOptions{BatchSize: 50, Check: check, Logger: logger})
			if !errors.Is(err, c.want) || errors.Is(err, audit.ErrGenerationMismatch) || strings.Contains(err.Error(), "does not match") {
				t.Fatalf("the rebuild returned %v, want %v and no verdict", err, c.want)
			}
			t.Log(err)
			buildingLeft(t, env, before, held)
			release()
			res, err := rebuild(t, env, projections.RebuildOptions{BatchSize: 50})
			if err != nil || len(res) != len(projections.Names) {
				t.Fatalf("resumed rebuild: %+v, %v", res, err)
			}
			projtest.SameSnapshot(t, "a rebuild "+c.name+" and resumed vs one run through", through, projtest.Snapshot(t, env.Pool))
		})
	}
	projtest.AuditOK(t, env.Store, env.Pool)
}

// stopWhenSwitchWaits holds the live checkpoint of name (its switch locks it)
// until the function it returns is called, and ends the rebuild's context
// (stop) once its switch waits for it, the projections before it switched.
func stopWhenSwitchWaits(t *testing.T, env *projtest.Env, ctx context.Context, stop context.CancelFunc, name string) (release func()) {
	t.Helper()
	// Connections of their own: the rebuild may take every one of the pool.
	holding, polling := connect(t, env), connect(t, env)
	tx, err := holding.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	release = func() { tx.Rollback(context.Background()) }
	t.Cleanup(release)
	var holder int
	if err := tx.QueryRow(context.Background(), `SELECT pg_backend_pid() FROM readmodel.checkpoints WHERE name = $1 AND state = 'live' FOR UPDATE`, name).Scan(&holder); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer stop()
		for ctx.Err() == nil { // polled: nothing tells when a backend starts waiting
			var waiting bool
			err := polling.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid)))`, holder).Scan(&waiting)
			if err != nil || waiting {
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	return release
}

// connect opens a connection to env's database, closed at t's end.
func connect(t *testing.T, env *projtest.Env) *pgx.Conn {
	t.Helper()
	conn, err := pgx.ConnectConfig(context.Background(), env.Pool.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// buildingLeft fails t unless held (nil: every projection) have a generation
// left being built and their live generation is that of before.
func buildingLeft(t *testing.T, env *projtest.Env, before map[string]int, held []string) {
	t.Helper()
	st, err := projections.ReadStatus(context.Background(), env.Pool, env.Store)
	if err != nil {
		t.Fatal(err)
	}
	if held == nil {
		held = projections.Names
	}
	var building []string
	for _, s := range st {
		switch {
		case s.State == "building":
			building = append(building, s.Projection)
		case s.State == "live" && slices.Contains(held, s.Projection) && s.Generation != before[s.Projection]:
			t.Fatalf("%s switched to generation %d", s.Projection, s.Generation)
		}
	}
	sort.Strings(building)
	if !slices.Equal(building, held) {
		t.Fatalf("generations left being built: %v, want %v: %+v", building, held, st)
	}
}

type stopWhen int

const (
	stopInCheck  stopWhen = iota // the context ends once the indexes are built, before the check reads
	stopAtSwitch                 // the context ends while the switch of transfers waits (stopWhenSwitchWaits)
	failCheck                    // the check fails to check every generation
	stopInBegin                  // the context ends as the check begins, the generations created
)

// interruptedCheck is a Check whose Verify waits for the index builds of the
// generations it verifies, then stops the rebuild or fails as when says.
type interruptedCheck struct {
	projections.Check
	built *atomic.Int64
	when  stopWhen
	stop  context.CancelFunc
	lost  error
}

func (c *interruptedCheck) Begin(ctx context.Context, from eventstore.Position) error {
	if c.when == stopInBegin {
		c.stop()
	}
	return c.Check.Begin(ctx, from)
}

func (c *interruptedCheck) Verify(ctx context.Context, vs []projections.Verification) ([]error, error) {
	for c.built.Load() < int64(len(vs)) { // polled: the index builds run beside Verify
		time.Sleep(5 * time.Millisecond)
	}
	switch c.when {
	case stopInCheck:
		c.stop()
	case failCheck:
		return nil, fmt.Errorf("audit: read: %w", c.lost)
	}
	return c.Check.Verify(ctx, vs)
}

// indexLog counts the rebuild's "indexes built" records: a generation's
// index build is done once its record is logged.
type indexLog struct {
	slog.Handler
	built *atomic.Int64
}

func (h indexLog) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "rebuild: indexes built" {
		h.built.Add(1)
	}
	return h.Handler.Handle(ctx, r)
}

func (h indexLog) WithAttrs(as []slog.Attr) slog.Handler {
	return indexLog{h.Handler.WithAttrs(as), h.built}
}

func (h indexLog) WithGroup(name string) slog.Handler {
	return indexLog{h.Handler.WithGroup(name), h.built}
}

// TestRebuildLoadsWithoutAutovacuum (migration 00025): a rebuild loads its
// generations with autovacuum off on their tables, and every table it makes
// live has been analyzed (its statistics taken, when it has rows), with
// autovacuum back on.
func TestRebuildLoadsWithoutAutovacuum(t *testing.T) {
	env := projtest.New(t)
	env.Run(t, projtest.Workload{Commands: 60, Seed: 71})
	devtest.CatchUp(t, newRunner(t, env, projections.Options{}))
	loaded := 0
	_, err := rebuild(t, env, projections.RebuildOptions{BatchSize: 20,
		AfterBatch: func(ctx context.Context, gens map[string]int) error {
			for name, gen := range gens {
				for _, s := range tableSettings(t, env.Pool, name, gen) {
					if loaded++; !strings.Contains(s.options, "autovacuum_enabled=false") {
						t.Errorf("during the load, %s has options %q", s.table, s.options)
					}
				}
			}
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	if loaded == 0 {
		t.Fatal("no batch was loaded")
	}
	for name, gen := range liveGenerations(t, env) {
		for _, s := range tableSettings(t, env.Pool, name, gen) {
			if strings.Contains(s.options, "autovacuum") || !s.analyzed || s.rows > 0 && !s.statistics {
				t.Errorf("made live: %+v", s)
			}
		}
	}
}

// tableSetting is what TestRebuildLoadsWithoutAutovacuum and
// TestRebuildSwitchesVacuumedGenerations look at in a table.
type tableSetting struct {
	table, options                 string
	analyzed, vacuumed, statistics bool // ever analyzed, vacuumed by hand; has rows in pg_stats
	rows                           int64
	pages, allVisible              int32
}

// tableSettings describes each table of a generation.
func tableSettings(t *testing.T, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
	QueryRow(context.Context, string, ...any) pgx.Row
}, name string, gen int) []tableSetting {
	t.Helper()
	ctx := context.Background()
	rows, err := q.Query(ctx, `
		SELECT g, array_to_string(coalesce(c.reloptions, '{}'), ' '), s.last_analyze IS NOT NULL,
			s.last_vacuum IS NOT NULL, c.relpages, c.relallvisible,
			EXISTS (SELECT 1 FROM pg_stats p WHERE p.schemaname = 'readmodel' AND p.tablename = g)
		FROM readmodel.generation_tables($1, $2) g
		JOIN pg_class c ON c.oid = ('readmodel.' || quote_ident(g))::regclass
		JOIN pg_stat_user_tables s ON s.relid = c.oid`, name, gen)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (s tableSetting, err error) {
		return s, r.Scan(&s.table, &s.options, &s.analyzed, &s.vacuumed, &s.pages, &s.allVisible, &s.statistics)
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := range out {
		if err := q.QueryRow(ctx, `SELECT count(*) FROM readmodel.`+pgx.Identifier{out[i].table}.Sanitize()).Scan(&out[i].rows); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// TestRebuildSwitchesVacuumedGenerations: at the switch, every table of each
// new generation has been vacuumed and analyzed by the rebuild, not left for
// autovacuum to do once live (docs/design.md, "A rebuild"). The test holds
// the live generations' tables (ACCESS SHARE, no transaction ID or snapshot
// kept, so nothing held back from the vacuum): the first switch waits to
// drop its old generation, and the test looks at the new ones meanwhile.
func TestRebuildSwitchesVacuumedGenerations(t *testing.T) {
	env := projtest.New(t)
	env.Run(t, projtest.Workload{Commands: 60, Seed: 73})
	devtest.CatchUp(t, newRunner(t, env, projections.Options{}))
	ctx := context.Background()
	// Connections of their own: the rebuild may take every one of the pool's.
	holder, blocker := holdLiveTables(t, env)
	watch := connect(t, env)
	done := make(chan error, 1)
	go func() {
		_, err := rebuild(t, env, projections.RebuildOptions{BatchSize: 20, LockTimeout: 10 * time.Minute})
		done <- err
	}()
	devtest.Eventually(t, 10*time.Minute, "the switch waits for the live tables", func() bool {
		select {
		case err := <-done:
			t.Fatalf("the rebuild returned before its switch waited: %v", err)
		default:
		}
		var waits bool
		if err := watch.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE $1::int = ANY (pg_blocking_pids(pid)))`, blocker).Scan(&waits); err != nil {
			t.Fatal(err)
		}
		return waits
	})
	checked := 0
	for name, gen := range buildingGenerations(t, watch) {
		for _, s := range tableSettings(t, watch, name, gen) {
			checked++
			if !s.vacuumed || !s.analyzed {
				t.Errorf("at the switch, %s generation %d: %+v", name, gen, s)
			}
		}
	}
	if checked == 0 {
		t.Error("no table of a new generation at the switch")
	}
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// holdLiveTables takes ACCESS SHARE on every table of the live generations,
// in a transaction it returns with its backend's pid.
func holdLiveTables(t *testing.T, env *projtest.Env) (pgx.Tx, int) {
	t.Helper()
	ctx := context.Background()
	tx, err := connect(t, env).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	var pid int
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	var tables string
	if err := tx.QueryRow(ctx, `SELECT string_agg(format('readmodel.%I', g), ', ')
		FROM readmodel.checkpoints c, readmodel.generation_tables(c.name, c.generation) g
		WHERE c.state = 'live' AND c.name NOT LIKE 'publisher:%'`).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `LOCK TABLE `+tables+` IN ACCESS SHARE MODE`); err != nil {
		t.Fatal(err)
	}
	return tx, pid
}

// buildingGenerations returns the generations being built, by projection.
func buildingGenerations(t *testing.T, conn *pgx.Conn) map[string]int {
	t.Helper()
	rows, err := conn.Query(context.Background(), `SELECT name, generation FROM readmodel.checkpoints WHERE state = 'building'`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	var name string
	var gen int
	_, err = pgx.ForEachRow(rows, []any{&name, &gen}, func() error { out[name] = gen; return nil })
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestRebuildBuildsIndexesWithItsMemory: the index builds after the load run
// with the rebuild's maintenance_work_mem (RebuildOptions.IndexMemoryMiB),
// not the session's default. An event trigger, made once the load has
// begun (a generation's creation builds indexes it then drops, with the
// default), records the setting each CREATE INDEX ran with, in its session.
func TestRebuildBuildsIndexesWithItsMemory(t *testing.T) {
	env := projtest.New(t)
	env.Run(t, projtest.Workload{Commands: 40, Seed: 75})
	ctx := context.Background()
	var armed bool
	opts := projections.RebuildOptions{BatchSize: 20, IndexMemoryMiB: 77, AfterBatch: func(ctx context.Context, _ map[string]int) error {
		if armed {
			return nil
		}
		armed = true
		_, err := env.Pool.Exec(ctx, `CREATE TABLE public.index_memory (mem text NOT NULL);
			CREATE FUNCTION public.record_index_memory() RETURNS event_trigger LANGUAGE plpgsql AS $fn$
			BEGIN INSERT INTO public.index_memory VALUES (current_setting('maintenance_work_mem')); END $fn$;
			CREATE EVENT TRIGGER index_memory ON ddl_command_end WHEN TAG IN ('CREATE INDEX')
			EXECUTE FUNCTION public.record_index_memory()`)
		return err
	}}
	if _, err := rebuild(t, env, opts); err != nil {
		t.Fatal(err)
	}
	rows, err := env.Pool.Query(ctx, `SELECT mem, count(*) FROM public.index_memory GROUP BY mem`)
	if err != nil {
		t.Fatal(err)
	}
	var mem string
	var n int
	got := map[string]int{}
	if _, err := pgx.ForEachRow(rows, []any{&mem, &n}, func() error { got[mem] = n; return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got["77MB"] == 0 {
		t.Errorf("the index builds' maintenance_work_mem, by index count: %v, want every one 77MB", got)
	}
}

// TestResumedRebuildBuildsTheReadBackKeyWithItsMemory: a rebuild stopped in
// its load and resumed reads its balance history back, so it builds
// balance_history's primary key over the rows loaded in a load batch
// (ensureReadBackKey): that build, the largest table's, runs with the
// rebuild's index memory too, as every later index build (review r505: it ran
// with the session's 64 MB).
func TestResumedRebuildBuildsTheReadBackKeyWithItsMemory(t *testing.T) {
	env := projtest.New(t)
	env.Run(t, projtest.Workload{Commands: 40, Seed: 75})
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	batches := 0
	stopAt := projections.RebuildOptions{BatchSize: 20, Check: audit.VerifyGeneration(env.Pool, env.Store), AfterBatch: func(context.Context, map[string]int) error {
		if batches++; batches == 2 {
			stop()
		}
		return nil
	}}
	if _, err := projections.Rebuild(ctx, env.Pool, env.Store, stopAt); err == nil {
		t.Fatal("the rebuild was not stopped in its load")
	}
	if _, err := env.Pool.Exec(context.Background(), `CREATE TABLE public.index_memory (idx text NOT NULL, mem text NOT NULL);
		CREATE FUNCTION public.record_index_memory() RETURNS event_trigger LANGUAGE plpgsql AS $fn$
		BEGIN INSERT INTO public.index_memory SELECT object_identity, current_setting('maintenance_work_mem') FROM pg_event_trigger_ddl_commands(); END $fn$;
		CREATE EVENT TRIGGER index_memory ON ddl_command_end WHEN TAG IN ('CREATE INDEX')
		EXECUTE FUNCTION public.record_index_memory()`); err != nil {
		t.Fatal(err)
	}
	if _, err := rebuild(t, env, projections.RebuildOptions{BatchSize: 20, IndexMemoryMiB: 77}); err != nil {
		t.Fatalf("resumed: %v", err)
	}
	rows, err := env.Pool.Query(context.Background(), `SELECT idx, mem FROM public.index_memory WHERE idx LIKE 'readmodel.%'`)
	if err != nil {
		t.Fatal(err)
	}
	var idx, mem string
	key := false
	if _, err := pgx.ForEachRow(rows, []any{&idx, &mem}, func() error {
		key = key || strings.HasPrefix(idx, "readmodel.balance_history_g") && strings.HasSuffix(idx, "_pkey")
		if mem != "77MB" {
			t.Errorf("%s built with maintenance_work_mem %s, want 77MB", idx, mem)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !key {
		t.Fatal("the resumed rebuild built no balance_history key: the test stopped it elsewhere than in its load")
	}
}

// TestRebuildRefusesAnIndexMemoryOutOfBounds: an index memory below 0 or
// above MaxIndexMemoryMiB is refused before any generation is created, not by
// the first index build after the whole load (review r505: 2097152 MiB loaded
// every generation, then dropped them as refused).
func TestRebuildRefusesAnIndexMemoryOutOfBounds(t *testing.T) {
	env := projtest.New(t)
	env.Run(t, projtest.Workload{Commands: 20, Seed: 76})
	before := liveGenerations(t, env)
	for _, mib := range []int{-5, projections.MaxIndexMemoryMiB + 1, 2097152} {
		batches := 0
		_, err := rebuild(t, env, projections.RebuildOptions{BatchSize: 20, IndexMemoryMiB: mib, AfterBatch: func(context.Context, map[string]int) error {
			batches++
			return nil
		}})
		if !errors.Is(err, projections.ErrIndexMemory) || batches != 0 {
			t.Errorf("IndexMemoryMiB %d: %v after %d batches, want ErrIndexMemory before any", mib, err, batches)
		}
	}
	var building int
	if err := env.Pool.QueryRow(context.Background(), `SELECT count(*) FROM readmodel.checkpoints WHERE state <> 'live'`).Scan(&building); err != nil {
		t.Fatal(err)
	}
	if after := liveGenerations(t, env); building != 0 || !maps.Equal(before, after) {
		t.Errorf("generations building %d, live %v (before %v)", building, after, before)
	}
}

// TestRebuildKeepsAGenerationWhoseVacuumFailed: a VACUUM of a loaded
// generation that fails (here cancelled from another session while it waits
// for a table another session locks) is no verdict on its rows: the rebuild
// returns an error and keeps the generation, and the next rebuild resumes and
// switches it, where a refusal would drop the load and start afresh.
func TestRebuildKeepsAGenerationWhoseVacuumFailed(t *testing.T) {
	env := projtest.New(t)
	env.Run(t, projtest.Workload{Commands: 60, Seed: 74})
	ctx := context.Background()
	locker, watch := connect(t, env), connect(t, env)
	var locked string
	opts := projections.RebuildOptions{BatchSize: 20, AfterBatch: func(ctx context.Context, gens map[string]int) error {
		gen, ok := gens["entries"]
		if locked != "" || !ok {
			return nil
		}
		locked = fmt.Sprintf("readmodel.entries_g%d", gen)
		if _, err := locker.Exec(ctx, `BEGIN`); err != nil {
			return err
		}
		_, err := locker.Exec(ctx, `LOCK TABLE `+locked+` IN SHARE UPDATE EXCLUSIVE MODE`)
		return err
	}}
	done := make(chan error, 1)
	go func() {
		_, err := rebuild(t, env, opts)
		done <- err
	}()
	devtest.Eventually(t, 10*time.Minute, "a VACUUM waits for the locked table", func() bool {
		var n int
		if err := watch.QueryRow(ctx, `SELECT count(pg_cancel_backend(pid)) FROM pg_stat_activity
			WHERE query LIKE 'VACUUM%' AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
	err := <-done
	if _, rerr := locker.Exec(ctx, `ROLLBACK`); rerr != nil {
		t.Fatal(rerr)
	}
	if err == nil || !strings.Contains(err.Error(), "kept") {
		t.Fatalf("a rebuild whose vacuum failed: %v, want the generations kept", err)
	}
	kept := buildingGenerations(t, watch)
	if len(kept) == 0 {
		t.Fatalf("no generation kept after the vacuum failed: %v", err)
	}
	res, err := rebuild(t, env, projections.RebuildOptions{BatchSize: 20})
	if err != nil {
		t.Fatalf("the resumed rebuild: %v", err)
	}
	for _, r := range res {
		if g, ok := kept[r.Projection]; ok && r.Generation != g {
			t.Errorf("%s switched to generation %d, not the kept %d: the load was thrown away", r.Projection, r.Generation, g)
		}
	}
}
