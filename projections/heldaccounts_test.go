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

func readAccountsBuild(ctx context.Context, t *testing.T, q rowQuerier, gen int) accountsBuild {
	t.Helper()
	return readHeldBuild(ctx, t, q, projections.Accounts, "accounts", gen)
}

// readCmdAccountsBuild is readAccountsBuild of the commands' generation: its
// command_accounts rows and its checkpoint's events.
func readCmdAccountsBuild(ctx context.Context, t *testing.T, q rowQuerier, gen int) accountsBuild {
	t.Helper()
	return readHeldBuild(ctx, t, q, projections.Commands, "command_accounts", gen)
}

type rowQuerier interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}

// readHeldBuild is what generation gen of proj holds: the rows of its table
// base and the events its checkpoint counts.
func readHeldBuild(ctx context.Context, t *testing.T, q rowQuerier, proj, base string, gen int) accountsBuild {
	t.Helper()
	var b accountsBuild
	sql := fmt.Sprintf(`SELECT (SELECT count(*) FROM readmodel.%s_g%d),
		(SELECT events FROM readmodel.checkpoints WHERE name = '%s' AND generation = %d)`, base, gen, proj, gen)
	if err := q.QueryRow(ctx, sql).Scan(&b.rows, &b.events); err != nil {
		t.Fatal(err)
	}
	return b
}

// commandAccounts renders the live command_accounts rows, by account.
func commandAccounts(t *testing.T, env *projtest.Env) map[string]string {
	t.Helper()
	return rowsByAccount(t, env, `SELECT account_id, concat_ws(' ', currency, balance, held, revision) FROM readmodel.command_accounts`)
}

// rowsByAccount is query's rows, an account and its row's text each, by account.
func rowsByAccount(t *testing.T, env *projtest.Env, query string) map[string]string {
	t.Helper()
	rows, err := env.Pool.Query(context.Background(), query)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	var id, row string
	if _, err := pgx.ForEachRow(rows, []any{&id, &row}, func() error { out[id] = row; return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

// sameCommandAccounts fails t where the live command_accounts differ from want.
func sameCommandAccounts(t *testing.T, what string, want, got map[string]string) {
	t.Helper()
	if len(want) == 0 || len(got) != len(want) {
		t.Fatalf("%s: %d command_accounts rows, want %d", what, len(got), len(want))
	}
	for id, row := range want {
		if got[id] != row {
			t.Fatalf("%s: command_accounts of %s: %q, want %q", what, id, got[id], row)
		}
	}
}

// TestRebuildHoldsTheAccountsRowsUntilItsLoadEnds: a rebuild's accounts
// builder writes no account row, and leaves its checkpoint where it
// started, until the end of its load (or until its rows pass the memo's
// bound, when it writes them and upserts from then on), and its commands
// builder writes no command_accounts row while its checkpoint moves; either
// way it switches to read models, and command_accounts, equal to the live
// runner's.
func TestRebuildHoldsTheAccountsRowsUntilItsLoadEnds(t *testing.T) {
	env := projtest.New(t)
	env.Run(t, projtest.Workload{Commands: 300, Seed: 50})
	// Accounts opened later: the bound is passed in a batch that does not
	// touch every account the memo holds.
	env.Run(t, projtest.Workload{Commands: 100, Seed: 53, Prefix: "x"})
	devtest.CatchUp(t, newRunner(t, env, projections.Options{}))
	live, liveCmd := projtest.Snapshot(t, env.Pool), commandAccounts(t, env)
	for _, c := range []struct {
		name       string
		bound      int
		wantLoaded bool // some rows written during the load
	}{
		{"held to the end of the load", 1 << 30, false},
		{"released past the memo's bound", 10, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			defer projections.SetMemoAccountsLimit(c.bound)()
			var seen, cmds []accountsBuild
			_, err := rebuild(t, env, projections.RebuildOptions{BatchSize: 40, Fresh: true,
				AfterBatch: func(ctx context.Context, gens map[string]int) error {
					seen = append(seen, readAccountsBuild(ctx, t, env.Pool, gens[projections.Accounts]))
					cmds = append(cmds, readCmdAccountsBuild(ctx, t, env.Pool, gens[projections.Commands]))
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
			// The commands' checkpoint moves every batch; their command_accounts
			// rows are written at the load's end, or from the batch past the bound.
			cmdLoaded := false
			for i, b := range cmds {
				if b.events == 0 {
					t.Fatalf("after batch %d the commands generation's checkpoint counts no event", i+1)
				}
				cmdLoaded = cmdLoaded || b.rows > 0
			}
			if cmdLoaded != c.wantLoaded {
				t.Fatalf("over %d batches command_accounts rows were written during the load: %v, want %v (%+v)", len(cmds), cmdLoaded, c.wantLoaded, cmds)
			}
			projtest.SameSnapshot(t, "live read models vs a rebuild that held its accounts", live, projtest.Snapshot(t, env.Pool))
			sameCommandAccounts(t, "live vs a rebuild that held its command_accounts", liveCmd, commandAccounts(t, env))
		})
	}
}

// TestRebuildStoppedWithItsAccountsHeldResumes: a rebuild stopped by a batch
// that failed after folding its events into the held rows (as a process
// that died would leave it) writes none of them; its accounts generation
// stays empty at its start, its commands generation has no command_accounts
// row past its start, and the others are kept at their checkpoints; the next
// rebuild resumes the accounts from their start and the others from theirs,
// but for the commands, built afresh, to read models equal to a rebuild run
// through.
func TestRebuildStoppedWithItsAccountsHeldResumes(t *testing.T) {
	env := projtest.New(t)
	env.Run(t, projtest.Workload{Commands: 300, Seed: 51})
	devtest.CatchUp(t, newRunner(t, env, projections.Options{}))
	total := storeEvents(t, env)
	if _, err := rebuild(t, env, projections.RebuildOptions{BatchSize: 50}); err != nil {
		t.Fatal(err)
	}
	through, throughCmd := projtest.Snapshot(t, env.Pool), commandAccounts(t, env)

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
			// after the stop). The writes of held rows on the stop are let
			// through: the rows folded from that batch must not be written.
			switch n := hooked.Add(1); {
			case n == int64(len(projections.Names)):
				stop()
			case n > int64(len(projections.Names)):
				return nil
			}
			return died
		}})
	if err == nil || gens == nil {
		t.Fatalf("a stopped rebuild returned %v after %d batches", err, batches)
	}
	if b := readAccountsBuild(context.Background(), t, env.Pool, gens[projections.Accounts]); b != (accountsBuild{}) {
		t.Fatalf("the stopped build's accounts generation holds %+v, want no row at its start", b)
	}
	if b := readCmdAccountsBuild(context.Background(), t, env.Pool, gens[projections.Commands]); b.rows != 0 || b.events == 0 {
		t.Fatalf("the stopped build's commands generation holds %+v, want no command_accounts row past its start", b)
	}
	resumeHeld(t, env, gens, total, false, through, throughCmd)
}

// resumeHeld resumes the rebuild stopped with generations gens over total
// events and fails t unless each generation was resumed (the commands' one
// built afresh instead unless cmdKept: its held rows were not written) to
// read models, and command_accounts, equal to a rebuild run through.
func resumeHeld(t *testing.T, env *projtest.Env, gens map[string]int, total int64, cmdKept bool, through map[string]map[string]string, throughCmd map[string]string) {
	t.Helper()
	res, err := rebuild(t, env, projections.RebuildOptions{BatchSize: 50})
	if err != nil || len(res) != len(projections.Names) {
		t.Fatalf("resumed rebuild: %+v, %v", res, err)
	}
	for _, r := range res {
		kept := r.Projection != projections.Commands || cmdKept
		if r.Events != total || (r.Generation == gens[r.Projection]) != kept {
			t.Fatalf("%s: the resumed rebuild's generation %d counts %d events of %d (stopped: generation %d; kept: want %v)", r.Projection, r.Generation, r.Events, total, gens[r.Projection], kept)
		}
	}
	projtest.SameSnapshot(t, "a rebuild stopped with its rows held and resumed vs one run through", through, projtest.Snapshot(t, env.Pool))
	sameCommandAccounts(t, "a rebuild stopped with its rows held and resumed vs one run through", throughCmd, commandAccounts(t, env))
}

// TestRebuildStoppedAtItsLoadsEndWritesTheHeldRows: a stop that arrives once
// the load has read its last batch, as the end-of-load write of the held rows
// begins, writes them as a stop during the load does (best effort), rather
// than leave the accounts generation at the start of "all" for the next
// rebuild to read the whole history again (review r483), and the commands'
// command_accounts rows, so that the next rebuild resumes every generation.
// Should the write of the commands' rows fail after its COPY (the process
// died in it), none is there, and the next rebuild builds the commands
// afresh; should the accounts' write fail so (it comes first), none of theirs
// is there, and the commands' rows are written all the same (review r492:
// the first failure stopped the writes, and the next rebuild built the
// commands afresh), so the next rebuild resumes the accounts from their start
// and every other generation. Each way it ends with read models equal to a
// rebuild run through.
func TestRebuildStoppedAtItsLoadsEndWritesTheHeldRows(t *testing.T) {
	env := projtest.New(t)
	env.Run(t, projtest.Workload{Commands: 300, Seed: 52})
	devtest.CatchUp(t, newRunner(t, env, projections.Options{}))
	total := storeEvents(t, env)
	for _, c := range []struct {
		name  string
		dieIn string // the held rows' write that fails after its COPY: that of this table, if any
	}{{"after the held rows' write", ""}, {"during the commands' held rows' write", "command_accounts"}, {"during the accounts' held rows' write", "accounts"}} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := rebuild(t, env, projections.RebuildOptions{BatchSize: 50, Fresh: true}); err != nil {
				t.Fatal(err)
			}
			through, throughCmd := projtest.Snapshot(t, env.Pool), commandAccounts(t, env)
			gens := stopAtLoadsEnd(t, env, total, c.dieIn)
			a := readAccountsBuild(context.Background(), t, env.Pool, gens[projections.Accounts])
			b := readCmdAccountsBuild(context.Background(), t, env.Pool, gens[projections.Commands])
			t.Logf("after a stop at the load's end (all %d events folded, none spoiled) the accounts generation holds %+v, the commands' %+v", total, a, b)
			if (a.rows == 0) != (c.dieIn == "accounts") {
				t.Fatalf("a stop at the end of the load left the accounts generation %+v (its write failed: %v): the next rebuild reads all %d events again for them", a, c.dieIn == "accounts", total)
			}
			if (b.rows == 0) != (c.dieIn == "command_accounts") || b.events != total {
				t.Fatalf("the commands generation holds %+v after a stop at the load's end (its write failed: %v)", b, c.dieIn == "command_accounts")
			}
			resumeHeld(t, env, gens, total, c.dieIn != "command_accounts", through, throughCmd)
		})
	}
}

// stopAtLoadsEnd runs a rebuild stopped once its load has read its last
// batch, failing every transaction that sees the held rows of table dieIn
// (accounts or command_accounts; none when "") written, and returns its
// generations.
func stopAtLoadsEnd(t *testing.T, env *projtest.Env, total int64, dieIn string) map[string]int {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var done int64
	var gens map[string]int
	proj := map[string]string{"accounts": projections.Accounts, "command_accounts": projections.Commands}[dieIn]
	_, err := projections.Rebuild(ctx, env.Pool, env.Store, projections.RebuildOptions{BatchSize: 50, Fresh: true,
		Check:    audit.VerifyGeneration(env.Pool, env.Store),
		Progress: func(n, _ int64) { done = n },
		AfterBatch: func(_ context.Context, g map[string]int) error {
			gens = g
			if done == total && dieIn == "" { // the load's last batch: the stop arrives as the held rows are to be written
				stop()
			}
			return nil
		},
		Hook: func(ctx context.Context, tx pgx.Tx) error {
			if dieIn == "" || done != total {
				return nil
			}
			var written bool
			sql := fmt.Sprintf(`SELECT EXISTS (SELECT FROM readmodel.%s_g%d)`, dieIn, gens[proj])
			if err := tx.QueryRow(ctx, sql).Scan(&written); err != nil || !written {
				return err
			}
			stop()
			return errors.New("the process died in the held rows' write")
		}})
	if err == nil || gens == nil {
		t.Fatalf("a stopped rebuild returned %v", err)
	}
	return gens
}

// TestRebuildHeldAccountsRowsEqualTheLiveOnes: a fresh rebuild, whose
// accounts rows are held and written once by COPY at its load's end
// (heldAccountsCopy), leaves every account's whole row as the live runner's
// upserts (writeAccounts) left it, the columns no check compares included
// (opened_at, updated_at: review r501 swapped them in the COPY and every
// other test passed).
func TestRebuildHeldAccountsRowsEqualTheLiveOnes(t *testing.T) {
	env := projtest.New(t)
	env.Run(t, projtest.Workload{Commands: 300, Seed: 50})
	devtest.CatchUp(t, newRunner(t, env, projections.Options{}))
	live := wholeAccountsRows(t, env)
	if _, err := rebuild(t, env, projections.RebuildOptions{BatchSize: 40, Fresh: true}); err != nil {
		t.Fatal(err)
	}
	got := wholeAccountsRows(t, env)
	if len(got) != len(live) || len(live) == 0 {
		t.Fatalf("%d accounts rows after the rebuild, %d live", len(got), len(live))
	}
	for id, want := range live {
		if got[id] != want {
			t.Errorf("account %s after a held rebuild:\n %s\nlive:\n %s", id, got[id], want)
		}
	}
}

// wholeAccountsRows is every live accounts row as its text, by account.
func wholeAccountsRows(t *testing.T, env *projtest.Env) map[string]string {
	t.Helper()
	return rowsByAccount(t, env, `SELECT account_id, a::text FROM readmodel.accounts a`)
}
