package projections_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/internal/testing/devtest"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/internal/app/ledger"
	"github.com/ledgerworks/ledger/internal/app/reply"
	"github.com/ledgerworks/ledger/internal/testing/pgtest"
	"github.com/ledgerworks/ledger/projections"
	"github.com/ledgerworks/ledger/projections/projtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func newRunner(t *testing.T, env *projtest.Env, opts projections.Options) *projections.Runner {
	t.Helper()
	r, err := projections.NewRunner(env.Pool, env.Store, opts)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func checkpoints(t *testing.T, env *projtest.Env) map[string]eventstore.Position {
	t.Helper()
	cps, err := projections.Checkpoints.LiveByName(context.Background(), env.Pool)
	if err != nil {
		t.Fatal(err)
	}
	return cps
}

// eventsConsumed is the events column of the live checkpoints: it grows only
// with a successful compare-and-set, so it counts each applied event once.
func eventsConsumed(t *testing.T, env *projtest.Env) map[string]int64 {
	t.Helper()
	rows, err := env.Pool.Query(context.Background(), `SELECT name, events FROM readmodel.checkpoints WHERE state = 'live'`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	var (
		name string
		n    int64
	)
	if _, err := pgx.ForEachRow(rows, []any{&name, &n}, func() error { out[name] = n; return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

func storeEvents(t *testing.T, env *projtest.Env) int64 {
	t.Helper()
	var n int64
	if err := env.Pool.QueryRow(context.Background(), `SELECT count(*) FROM events`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func readAll(t *testing.T, env *projtest.Env) []*projections.Event {
	t.Helper()
	evs, err := projections.DecodeAll(devtest.ReadAll(t, env.Store))
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

func TestProjectsAMixedWorkload(t *testing.T) {
	env := projtest.New(t)
	keys := env.Run(t, projtest.Workload{Commands: 400, Seed: 7})
	r := newRunner(t, env, projections.Options{BatchSize: 13}) // batches split commands
	devtest.CatchUp(t, r)
	projtest.AuditOK(t, env.Store, env.Pool)
	if got, want := eventsConsumed(t, env), storeEvents(t, env); got[projections.Accounts] != want || got[projections.Commands] != want {
		t.Fatalf("events consumed %v, store holds %d", got, want)
	}
	// The commands read model answers what the ledger itself answers.
	ctx := context.Background()
	for _, k := range keys {
		want, err := env.Ledger.Lookup(ctx, k)
		if err != nil || want == nil {
			t.Fatalf("ledger lookup %q: %v %v", k, want, err)
		}
		var raw string
		if err := env.Pool.QueryRow(ctx, `SELECT reply::text FROM readmodel.commands WHERE idempotency_key = $1`, k).Scan(&raw); err != nil {
			t.Fatalf("read model has no reply for %q (%s): %v", k, want.Status, err)
		}
		var got reply.Reply
		if err := json.Unmarshal([]byte(raw), &got); err != nil {
			t.Fatal(err)
		}
		wantJSON, _ := json.Marshal(want)
		if !reflect.DeepEqual(got, *want) || raw != string(wantJSON) {
			t.Fatalf("reply of %q:\n read model %s\n ledger     %s", k, raw, wantJSON)
		}
	}
	noDecidedSagaParts(t, env)
}

// noDecidedSagaParts requires that no saga decided in the commands read model
// keeps its part or its steps' parts in command_parts (its reply row holds
// it now), and that the workload decided one.
func noDecidedSagaParts(t *testing.T, env *projtest.Env) {
	t.Helper()
	var decided, kept, steps int
	err := env.Pool.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM readmodel.commands WHERE command IN ('transfer', 'refund')),
		(SELECT count(*) FROM readmodel.command_parts p JOIN readmodel.commands c ON p.key = 'saga/' || c.idempotency_key),
		(SELECT count(*) FROM readmodel.command_parts p JOIN readmodel.commands c ON c.command IN ('transfer', 'refund')
			AND starts_with(p.key, 'step/' || c.idempotency_key || ':'))`).Scan(&decided, &kept, &steps)
	if err != nil {
		t.Fatal(err)
	}
	if decided == 0 || kept != 0 || steps != 0 {
		t.Fatalf("%d transfers and refunds decided, %d of their saga parts and %d of their steps' parts kept; want some decided, none kept", decided, kept, steps)
	}
}

func TestReplayingABatchChangesNothing(t *testing.T) {
	env := projtest.New(t)
	env.Run(t, projtest.Workload{Commands: 200, Seed: 8})
	events := readAll(t, env)
	ctx := context.Background()
	apply := func(evs []*projections.Event) {
		t.Helper()
		err := pgx.BeginFunc(ctx, env.Pool, func(tx pgx.Tx) error {
			for _, name := range projections.Names {
				p, _ := projections.ByName(name)
				if err := p.Apply(ctx, tx, 1, evs); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	half := len(events) / 2
	apply(events[:half])
	first := projtest.Snapshot(t, env.Pool)
	apply(events[:half]) // the same batch again
	projtest.SameSnapshot(t, "a batch applied twice", first, projtest.Snapshot(t, env.Pool))
	apply(events[half/2 : half]) // its second half again
	projtest.SameSnapshot(t, "a half batch applied again", first, projtest.Snapshot(t, env.Pool))
	apply(events[half:])
	all := projtest.Snapshot(t, env.Pool)
	apply(events) // everything again
	projtest.SameSnapshot(t, "everything applied twice", all, projtest.Snapshot(t, env.Pool))
	for _, ev := range events { // and one event at a time
		apply([]*projections.Event{ev})
	}
	projtest.SameSnapshot(t, "everything applied again event by event", all, projtest.Snapshot(t, env.Pool))
}

// errCrash is the failpoint's "process died between its write and its checkpoint".
var errCrash = errors.New("failpoint: crashed before commit")

func TestCrashBetweenWriteAndCheckpointDoubleCountsNothing(t *testing.T) {
	env := projtest.New(t)
	env.Run(t, projtest.Workload{Commands: 300, Seed: 9})
	var batches atomic.Int64
	hook := func(ctx context.Context, tx pgx.Tx) error {
		if batches.Add(1)%3 == 0 {
			// Die as a killed process does: the connection drops mid-transaction.
			tx.Conn().PgConn().Close(context.Background())
			return errCrash
		}
		return nil
	}
	crashing := newRunner(t, env, projections.Options{BatchSize: 20, Hook: hook})
	ctx := context.Background()
	crashes := 0
	for {
		n, err := crashing.Step(ctx)
		if err != nil {
			crashes++
			// A new process starts from the checkpoint in the database.
			crashing = newRunner(t, env, projections.Options{BatchSize: 20, Hook: hook})
			continue
		}
		if n == 0 {
			break
		}
	}
	if crashes == 0 {
		t.Fatal("the failpoint never fired")
	}
	projtest.AuditOK(t, env.Store, env.Pool)
	if got, want := eventsConsumed(t, env), storeEvents(t, env); got[projections.Entries] != want {
		t.Fatalf("events consumed %v, store holds %d", got, want)
	}
	t.Logf("%d crashes", crashes)
}

func TestTwoRunnersNeverDoubleApply(t *testing.T) {
	env := projtest.New(t)
	var runs []*devtest.Running
	for range 2 {
		r := newRunner(t, env, projections.Options{BatchSize: 7, PollInterval: time.Millisecond, MinBackoff: time.Millisecond})
		runs = append(runs, devtest.Go(t, r.Run))
	}
	env.Run(t, projtest.Workload{Commands: 300, Seed: 10, Prefix: "a"})
	env.Run(t, projtest.Workload{Commands: 300, Seed: 11, Prefix: "b"})
	waitCaughtUp(t, env)
	for _, run := range runs {
		if err := run.Stop(); err != nil {
			t.Error(err)
		}
	}
	projtest.AuditOK(t, env.Store, env.Pool)
	if got, want := eventsConsumed(t, env), storeEvents(t, env); got[projections.Accounts] != want || got[projections.Transfers] != want {
		t.Fatalf("events consumed %v, store holds %d: a batch was applied twice", got, want)
	}
}

// waitCaughtUp waits until every live checkpoint is at the store's head.
// waitCaughtUp waits, once writes have stopped, until every live checkpoint
// covers the last event stored. It reads that event from the table, not
// through Store.Head: Head is gap-safe, so it lags the last commit while any
// transaction that began before it (a projector's own batch, a reader) is still
// open, and a checkpoint that reached such a transient head has not consumed
// everything (the CI flake of 2026-11-25).
func waitCaughtUp(t *testing.T, env *projtest.Env) {
	t.Helper()
	var xid string
	var pos int64
	if err := env.Pool.QueryRow(context.Background(), `SELECT transaction_id::text AS xid, position FROM events
		ORDER BY transaction_id DESC, position DESC LIMIT 1`).Scan(&xid, &pos); err != nil {
		t.Fatal(err)
	}
	commit, err := strconv.ParseUint(xid, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	last := eventstore.Position{Commit: commit, Prepare: uint64(pos)}
	devtest.Await(t, time.Minute, func() error {
		cps := checkpoints(t, env)
		for _, p := range cps {
			if p.Compare(last) < 0 {
				return fmt.Errorf("the projector did not reach the last event %s: %v", last, cps)
			}
		}
		return nil
	})
}

func TestRunnerSurvivesLostConnections(t *testing.T) {
	env := projtest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The runner has its own sessions (read-model pool and event store), named so
	// that only they are cut.
	url := env.URL + "&application_name=projector-under-test"
	if !strings.Contains(env.URL, "?") {
		url = env.URL + "?application_name=projector-under-test"
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	st := devtest.Store(t, url)
	r, err := projections.NewRunner(pool, st, projections.Options{BatchSize: 10, PollInterval: time.Millisecond, MinBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	run := devtest.Go(t, r.Run)
	stop := make(chan struct{})
	var kills atomic.Int64
	go func() { // the database "restarts": every session but ours is cut, again and again
		admin, err := pgx.Connect(context.Background(), env.URL)
		if err != nil {
			t.Error(err)
			return
		}
		defer admin.Close(context.Background())
		for {
			select {
			case <-stop:
				return
			case <-time.After(15 * time.Millisecond):
			}
			ct, err := admin.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
				WHERE application_name = 'projector-under-test'`)
			if err == nil {
				kills.Add(ct.RowsAffected())
			}
		}
	}()
	for i := range 5 {
		env.Run(t, projtest.Workload{Commands: 40, Seed: uint64(20 + i), Prefix: fmt.Sprintf("r%d", i), DupRate: 0.1})
	}
	close(stop)
	waitCaughtUp(t, env)
	if err := run.Stop(); err != nil {
		t.Fatal(err)
	}
	projtest.AuditOK(t, env.Store, env.Pool)
	t.Logf("%d sessions cut", kills.Load())
}

// The projector and the audit work the same over KurrentDB (here its in-process
// stand-in): positions are (commit, prepare) pairs of its own, and captures into
// an account are capture sagas.
func TestProjectsFromKurrentDB(t *testing.T) {
	ctx := context.Background()
	st := devtest.KurrentDB(t)
	env := projtest.New(t)
	env.Ledger = ledger.New(st, ledger.Options{})
	env.Run(t, projtest.Workload{Commands: 150, Seed: 60})
	r, err := projections.NewRunner(env.Pool, st, projections.Options{BatchSize: 17})
	if err != nil {
		t.Fatal(err)
	}
	devtest.CatchUp(t, r)
	rep, err := audit.Run(ctx, st, audit.Options{ReadModels: env.Pool, VerifyChain: true})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() || rep.Events == 0 {
		t.Fatalf("audit over KurrentDB: %d events, %v", rep.Events, rep.Violations)
	}
	// Among them, captures into an account, which are sagas there: guarded,
	// captured, credited under the key one append writes, released.
	guards, credits := 0, 0
	for _, re := range devtest.ReadAll(t, st) {
		switch p, _ := domain.DecodeEvent(re.Type, re.Data); e := p.(type) {
		case *domain.HoldPlaced:
			if _, ok := domain.CaptureGuardKey(e.HoldID); ok {
				guards++
			}
		case *domain.Credited:
			if e.Reason == domain.ReasonCaptureIn {
				credits++
			}
		}
	}
	if guards == 0 || credits == 0 {
		t.Fatalf("the workload made %d capture guards and %d capture credits", guards, credits)
	}
	if _, err := projections.Rebuild(ctx, env.Pool, st, projections.RebuildOptions{Check: audit.VerifyGeneration(env.Pool, st)}); err != nil {
		t.Fatal(err)
	}
}
