package projections_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/projections"
	"github.com/ledgerworks/ledger/projections/projtest"
)

// accountsBuild is what a rebuild's accounts generation holds after a batch:
// its rows, and the events its stored checkpoint counts.
type accountsBuild struct{ rows, events int64 }

func readAccountsBuild(ctx context.Context, t *testing.T, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, gen int) accountsBuild {
	t.Helper()
	var b accountsBuild
	sql := fmt.Sprintf(`SELECT (SELECT count(*) FROM readmodel.accounts_g%d),
		(SELECT events FROM readmodel.checkpoints WHERE name = 'accounts' AND generation = %d)`, gen, gen)
	if err := q.QueryRow(ctx, sql).Scan(&b.rows, &b.events); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestRebuildHoldsTheAccountsRowsUntilItsLoadEnds: a rebuild's accounts
// builder writes no account row, and leaves its checkpoint where it
// started, until the end of its load (or until its rows pass the memo's
// bound, when it writes them and upserts from then on), and switches to
// read models equal to the live runner's either way.
func TestRebuildHoldsTheAccountsRowsUntilItsLoadEnds(t *testing.T) {
	env := projtest.New(t)
	env.Run(t, projtest.Workload{Commands: 300, Seed: 50})
	devtest.CatchUp(t, newRunner(t, env, projections.Options{}))
	live := projtest.Snapshot(t, env.Pool)
	for _, c := range []struct {
		name       string
		bound      int
		wantLoaded bool // some rows written during the load
	}{
		{"held to the end of the load", 1 << 30, false},
		{"released past the memo's bound", 3, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			defer projections.SetMemoAccountsLimit(c.bound)()
			var seen []accountsBuild
			_, err := rebuild(t, env, projections.RebuildOptions{BatchSize: 40, Fresh: true,
				AfterBatch: func(ctx context.Context, gens map[string]int) error {
					seen = append(seen, readAccountsBuild(ctx, t, env.Pool, gens[projections.Accounts]))
					return nil
				}})
			if err != nil {
				t.Fatal(err)
			}
			loaded := false
			for _, b := range seen {
				if (b.rows == 0) != (b.events == 0) {
					t.Fatalf("after a batch the accounts generation holds %d rows at a checkpoint of %d events", b.rows, b.events)
				}
				loaded = loaded || b.rows > 0
			}
			if len(seen) < 5 || loaded != c.wantLoaded {
				t.Fatalf("over %d batches rows were written during the load: %v, want %v (%+v)", len(seen), loaded, c.wantLoaded, seen)
			}
			projtest.SameSnapshot(t, "live read models vs a rebuild that held its accounts", live, projtest.Snapshot(t, env.Pool))
		})
	}
}

// TestRebuildStoppedWithItsAccountsHeldResumes: a rebuild stopped by a batch
// that failed after folding its events into the held rows (as a process
// that died would leave it) writes none of them; its accounts generation
// stays empty at its start while the others are kept at their checkpoints,
// and the next rebuild resumes the accounts from their start and the others
// from theirs, to read models equal to a rebuild run through.
func TestRebuildStoppedWithItsAccountsHeldResumes(t *testing.T) {
	env := projtest.New(t)
	env.Run(t, projtest.Workload{Commands: 300, Seed: 51})
	devtest.CatchUp(t, newRunner(t, env, projections.Options{}))
	total := storeEvents(t, env)
	if _, err := rebuild(t, env, projections.RebuildOptions{BatchSize: 50}); err != nil {
		t.Fatal(err)
	}
	through := projtest.Snapshot(t, env.Pool)

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	batches, died := 0, errors.New("the process died")
	var hooked atomic.Int64
	var gens map[string]int
	_, err := projections.Rebuild(ctx, env.Pool, env.Store, projections.RebuildOptions{BatchSize: 50,
		Check: audit.VerifyGeneration(env.Pool, env.Store),
		AfterBatch: func(_ context.Context, g map[string]int) error {
			batches, gens = batches+1, g
			return nil
		},
		Hook: func(context.Context, pgx.Tx) error {
			if batches < 5 {
				return nil
			}
			// The sixth batch fails in every builder's transaction, after
			// its fold; the last to fail stops the rebuild (none begins
			// after the stop).
			if hooked.Add(1) == int64(len(projections.Names)) {
				stop()
			}
			return died
		}})
	if err == nil || gens == nil {
		t.Fatalf("a stopped rebuild returned %v after %d batches", err, batches)
	}
	if b := readAccountsBuild(context.Background(), t, env.Pool, gens[projections.Accounts]); b != (accountsBuild{}) {
		t.Fatalf("the stopped build's accounts generation holds %+v, want no row at its start", b)
	}
	var read, carried int64
	res, err := rebuild(t, env, projections.RebuildOptions{BatchSize: 50, Progress: func(n, c int64) { read, carried = n, c }})
	if err != nil || len(res) != len(projections.Names) {
		t.Fatalf("resumed rebuild: %+v, %v", res, err)
	}
	for _, r := range res {
		if r.Events != total || r.Generation != gens[r.Projection] {
			t.Fatalf("%s: the resumed generation %d counts %d events of %d (stopped: generation %d)", r.Projection, r.Generation, r.Events, total, gens[r.Projection])
		}
	}
	if read != total || carried != 0 {
		t.Fatalf("the resumed rebuild read %d events after %d carried, want all %d from the accounts' start", read, carried, total)
	}
	projtest.SameSnapshot(t, "a rebuild stopped with its accounts held and resumed vs one run through", through, projtest.Snapshot(t, env.Pool))
}

// TestRebuildStoppedAtItsLoadsEndWritesTheHeldRows: a stop that arrives once
// the load has read its last batch, as the end-of-load write of the held rows
// begins, writes them as a stop during the load does (best effort), rather
// than leave the accounts generation at the start of "all" for the next
// rebuild to read the whole history again (review r483).
func TestRebuildStoppedAtItsLoadsEndWritesTheHeldRows(t *testing.T) {
	env := projtest.New(t)
	env.Run(t, projtest.Workload{Commands: 300, Seed: 52})
	devtest.CatchUp(t, newRunner(t, env, projections.Options{}))
	total := storeEvents(t, env)

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var done int64
	var gens map[string]int
	_, err := projections.Rebuild(ctx, env.Pool, env.Store, projections.RebuildOptions{BatchSize: 50,
		Check:    audit.VerifyGeneration(env.Pool, env.Store),
		Progress: func(n, _ int64) { done = n },
		AfterBatch: func(_ context.Context, g map[string]int) error {
			gens = g
			if done == total { // the load's last batch: the stop arrives as the held rows are to be written
				stop()
			}
			return nil
		}})
	if err == nil || gens == nil {
		t.Fatalf("a stopped rebuild returned %v", err)
	}
	b := readAccountsBuild(context.Background(), t, env.Pool, gens[projections.Accounts])
	t.Logf("after a stop at the load's end (all %d events folded, none spoiled) the accounts generation holds %+v", total, b)
	if b.rows == 0 {
		t.Fatalf("a stop at the end of the load wrote none of the held rows (%+v): the next rebuild reads all %d events again for them", b, total)
	}
}
