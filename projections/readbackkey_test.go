package projections_test

import (
	"bytes"
	"context"
	"log/slog"
	"regexp"
	"strings"
	"testing"

	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/migrations"
	"github.com/ledgerworks/ledger/projections"
	"github.com/ledgerworks/ledger/projections/projtest"
)

// balanceKey reports whether generation gen's balance history has its
// primary key (account_id, revision), the key the balances builder reads an
// account's last row back by.
func balanceKey(t *testing.T, env *projtest.Env, gen int) bool {
	t.Helper()
	var keyed bool
	err := env.Pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM pg_constraint
		WHERE conrelid = format('readmodel.balance_history_g%s', $1::int)::regclass AND contype = 'p')`, gen).Scan(&keyed)
	if err != nil {
		t.Fatal(err)
	}
	return keyed
}

// keyLog records, after each committed build batch, whether the balance
// history being built has its key.
type keyLog struct {
	t     *testing.T
	env   *projtest.Env
	keyed []bool
	stop  func() // called after the batch stopAt, when set
	at    int
}

func (k *keyLog) afterBatch(_ context.Context, gens map[string]int) error {
	k.keyed = append(k.keyed, balanceKey(k.t, k.env, gens[projections.Balances]))
	if k.stop != nil && len(k.keyed) == k.at {
		k.stop()
	}
	return nil
}

// TestRebuildLoadsBalanceHistoryWithoutItsKey (migration 00031): a fresh
// rebuild whose builder's memo holds every account loads the balance
// history without its primary key and builds it after the load; stopped
// there and resumed, the resumed builder (its memo empty) builds the key
// before its first read-back, in its first batch; past its memo's bound a
// builder builds it before it reads back. Each way the read models equal a
// rebuild run through.
func TestRebuildLoadsBalanceHistoryWithoutItsKey(t *testing.T) {
	env := projtest.New(t)
	env.Run(t, projtest.Workload{Commands: 300, Seed: 33})
	devtest.CatchUp(t, newRunner(t, env, projections.Options{}))

	through := &keyLog{t: t, env: env}
	var log bytes.Buffer
	if _, err := rebuild(t, env, projections.RebuildOptions{BatchSize: 40, AfterBatch: through.afterBatch, Logger: slog.New(slog.NewTextHandler(&log, nil))}); err != nil {
		t.Fatal(err)
	}
	if len(through.keyed) < 10 || keyedAt(through.keyed) != -1 {
		t.Fatalf("a fresh rebuild within its memo: the key there after batches %v, want none of at least 10", through.keyed)
	}
	loadedLog(t, &log, "memo_complete=true key_built_in_load=false")
	if gen := liveGenerations(t, env)[projections.Balances]; !balanceKey(t, env, gen) {
		t.Fatalf("generation %d went live without its balance history's key", gen)
	}
	want := projtest.Snapshot(t, env.Pool)

	ctx, stop := context.WithCancel(context.Background())
	stopped := &keyLog{t: t, env: env, stop: stop, at: 4}
	if _, err := projections.Rebuild(ctx, env.Pool, env.Store, projections.RebuildOptions{BatchSize: 40, AfterBatch: stopped.afterBatch}); err == nil {
		t.Fatal("a stopped rebuild succeeded")
	}
	if keyedAt(stopped.keyed) != -1 {
		t.Fatalf("stopped after batches %v: the key was built", stopped.keyed)
	}
	resumed := &keyLog{t: t, env: env}
	if _, err := rebuild(t, env, projections.RebuildOptions{BatchSize: 40, AfterBatch: resumed.afterBatch}); err != nil {
		t.Fatal(err)
	}
	if keyedAt(resumed.keyed) != 0 {
		t.Fatalf("resumed: the key there after batches %v, want from the first on", resumed.keyed)
	}
	projtest.SameSnapshot(t, "a rebuild stopped and resumed vs one run through", want, projtest.Snapshot(t, env.Pool))

	defer projections.SetMemoAccountsLimit(3)()
	past := &keyLog{t: t, env: env}
	log.Reset()
	if _, err := rebuild(t, env, projections.RebuildOptions{BatchSize: 40, AfterBatch: past.afterBatch, Logger: slog.New(slog.NewTextHandler(&log, nil))}); err != nil {
		t.Fatal(err)
	}
	loadedLog(t, &log, "memo_complete=false key_built_in_load=true")
	if at := keyedAt(past.keyed); at < 1 {
		t.Fatalf("past its memo's bound: the key there after batches %v, want built after the first", past.keyed)
	}
	projtest.SameSnapshot(t, "a rebuild past its memo's bound vs one run through", want, projtest.Snapshot(t, env.Pool))
}

// loadedLog fails unless the rebuild logged its balance history's load
// ("rebuild: loaded") with want after its generation.
func loadedLog(t *testing.T, log *bytes.Buffer, want string) {
	t.Helper()
	re := regexp.MustCompile(`msg="rebuild: loaded" projection=balances generation=\d+ memo_accounts=\d+ ` + regexp.QuoteMeta(want) + `\n`)
	if !re.Match(log.Bytes()) {
		t.Fatalf("the rebuild's log has no balances line %q:\n%s", want, log.String())
	}
}

// keyedAt is the first batch after which the key was there and stayed,
// -1 when it never was; it fails when the key went away again.
func keyedAt(keyed []bool) int {
	at := -1
	for i, k := range keyed {
		switch {
		case k && at < 0:
			at = i
		case !k && at >= 0:
			return -2 // dropped again: never right
		}
	}
	return at
}

// TestRollbackOf00031RefusedBesideARebuild: migration 00031's rollback drops
// the function a builder past its memo calls before its first read-back, and
// builds the key only on the generations it can see; beside a rebuild (which
// holds the rebuild lock from before it creates its generations) it refuses,
// the database staying at 00031, and the rebuild, its memo bound crossed
// after the refusal, builds its key and switches.
func TestRollbackOf00031RefusedBesideARebuild(t *testing.T) {
	env := projtest.New(t)
	env.Run(t, projtest.Workload{Commands: 300, Seed: 33})
	devtest.CatchUp(t, newRunner(t, env, projections.Options{}))
	var accounts int
	if err := env.Pool.QueryRow(context.Background(), `SELECT count(DISTINCT account_id) FROM readmodel.balance_history`).Scan(&accounts); err != nil {
		t.Fatal(err)
	}
	defer projections.SetMemoAccountsLimit(accounts - 1)()
	var downErr error
	batches := 0
	results, err := rebuild(t, env, projections.RebuildOptions{BatchSize: 5, AfterBatch: func(ctx context.Context, _ map[string]int) error {
		if batches++; batches == 1 {
			_, downErr = migrations.DownTo(ctx, env.URL, 30)
		}
		return nil
	}})
	if err != nil {
		t.Fatalf("the rebuild beside 00031's rollback: %v", err)
	}
	if downErr == nil || !strings.Contains(downErr.Error(), "a rebuild is running") {
		t.Fatalf("00031's rollback beside a rebuild: got %v, want its refusal", downErr)
	}
	var version int64
	if err := env.Pool.QueryRow(context.Background(), `SELECT max(version_id) FROM goose_db_version`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	if version < 31 {
		t.Fatalf("after the refused rollback the database is at %d, want 31 or later", version)
	}
	for _, r := range results {
		if r.Projection == projections.Balances && !balanceKey(t, env, r.Generation) {
			t.Fatalf("the switched balance history (generation %d) has no primary key", r.Generation)
		}
	}
}
