package audit_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/internal/testing/pgtest"
	"github.com/ledgerworks/ledger/projections"
	"github.com/ledgerworks/ledger/projections/projtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// projected runs a workload and projects it.
func projected(t *testing.T, w projtest.Workload) *projtest.Env {
	t.Helper()
	return projectedAfter(t, w, func(*projtest.Env) {})
}

// projectedAfter is projected of a history that before starts.
func projectedAfter(t *testing.T, w projtest.Workload, before func(*projtest.Env)) *projtest.Env {
	t.Helper()
	env := projtest.New(t)
	before(env)
	env.Run(t, w)
	r, err := projections.NewRunner(env.Pool, env.Store, projections.Options{BatchSize: 37})
	if err != nil {
		t.Fatal(err)
	}
	devtest.CatchUp(t, r)
	return env
}

func run(t testing.TB, env *projtest.Env, opts audit.Options) *audit.Report {
	t.Helper()
	return runOn(t, env, env.Store, opts)
}

// runOn is run on another view of env's events (withoutDuplicateIDs).
func runOn(t testing.TB, env *projtest.Env, store audit.Store, opts audit.Options) *audit.Report {
	t.Helper()
	opts.ReadModels = env.Pool
	rep, err := audit.Run(context.Background(), store, opts)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	rep.Write(&b)
	t.Log("\n" + b.String())
	return rep
}

func exec(t *testing.T, env *projtest.Env, sql string, args ...any) {
	t.Helper()
	ct, err := env.Pool.Exec(context.Background(), sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	if ct.RowsAffected() != 1 {
		t.Fatalf("%s: %d rows", sql, ct.RowsAffected())
	}
}

func TestAuditPassesOnACleanLedger(t *testing.T) {
	env := projected(t, projtest.Workload{Commands: 300, Seed: 1})
	rep := run(t, env, audit.Options{VerifyChain: true})
	if !rep.OK() {
		t.Fatalf("violations on a clean ledger: %v", rep.Violations)
	}
	if rep.Events == 0 || len(rep.ReadModels) != len(projections.Names) {
		t.Fatalf("report: %+v", rep)
	}
	rep = run(t, env, audit.Options{Account: "w-acct-1"})
	if !rep.OK() {
		t.Fatalf("violations for one account: %v", rep.Violations)
	}
}

func TestAuditNamesAnEditedEvent(t *testing.T) {
	env := projected(t, projtest.Workload{Commands: 100, Seed: 2})
	// Raise the amount of one credit, keeping its JSON well-formed.
	var pos int64
	var stream string
	var rev int64
	if err := env.Pool.QueryRow(context.Background(), `SELECT position, stream, revision FROM events
		WHERE type = 'Credited' ORDER BY position LIMIT 1`).Scan(&pos, &stream, &rev); err != nil {
		t.Fatal(err)
	}
	exec(t, env, `UPDATE events SET data = convert_to(replace(convert_from(data, 'UTF8'), '"amount":', '"amount":1'), 'UTF8') WHERE position = $1`, pos)

	rep := run(t, env, audit.Options{})
	if rep.OK() || !rep.Has(audit.InvBalance, "") {
		t.Fatalf("an edited credit passed the audit: %v", rep.Violations)
	}
	rep = run(t, env, audit.Options{VerifyChain: true})
	found := false
	for _, v := range rep.Violations {
		if v.Invariant == audit.InvChain && v.Stream == stream && v.Revision == rev {
			found = true
		}
	}
	if !found {
		t.Fatalf("--verify-chain did not name %s@%d: %v", stream, rev, rep.Violations)
	}
}

func TestAuditNamesADeletedReadModelRow(t *testing.T) {
	env := projected(t, projtest.Workload{Commands: 100, Seed: 3})
	var id string
	if err := env.Pool.QueryRow(context.Background(), `SELECT event_id::text FROM readmodel.entries ORDER BY at DESC LIMIT 1`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	exec(t, env, `DELETE FROM readmodel.entries WHERE event_id = $1`, id)
	rep := run(t, env, audit.Options{})
	if !rep.Has(audit.InvReadModel, "read_model_mismatch") || !strings.Contains(rep.Violations[0].Message, id) {
		t.Fatalf("a deleted entry was not named: %v", rep.Violations)
	}
}

func TestAuditNamesAChangedBalance(t *testing.T) {
	env := projected(t, projtest.Workload{Commands: 100, Seed: 4})
	exec(t, env, `UPDATE readmodel.accounts SET balance = balance + 1 WHERE account_id = 'w-acct-2'`)
	rep := run(t, env, audit.Options{})
	if !rep.Has(audit.InvReadModel, "read_model_mismatch") || !strings.Contains(rep.Violations[0].Message, `"w-acct-2"`) {
		t.Fatalf("a changed balance was not named: %v", rep.Violations)
	}
}

// TestAuditNamesAMissingAndAnExtraAccountRow: the accounts table, compared a
// row at a time (compareRows), names the rows deleted or renamed and the row
// it has that the fold does not.
func TestAuditNamesAMissingAndAnExtraAccountRow(t *testing.T) {
	env := projected(t, projtest.Workload{Commands: 100, Seed: 4})
	exec(t, env, `UPDATE readmodel.accounts SET account_id = 'w-ghost' WHERE account_id = 'w-acct-3'`)
	exec(t, env, `DELETE FROM readmodel.accounts WHERE account_id = 'w-acct-2'`)
	rep := run(t, env, audit.Options{})
	if len(rep.Violations) == 0 {
		t.Fatal("a deleted and a renamed account row passed the audit")
	}
	m := rep.Violations[0].Message
	if !rep.Has(audit.InvReadModel, "read_model_mismatch") || !strings.Contains(m, `"w-acct-2"`) || !strings.Contains(m, `"w-acct-3"`) || !strings.Contains(m, `"w-ghost"`) {
		t.Fatalf("a deleted and an extra account row were not named: %v", rep.Violations)
	}
}

// TestAuditChecksSnapshots: a snapshot that is its stream's fold passes; one
// with a well-formed state the stream never had (its hash recomputed), one whose
// bytes no longer match its hash, and one beyond its stream are each named
// (invariant 7).
func TestAuditChecksSnapshots(t *testing.T) {
	env := projected(t, projtest.Workload{Commands: 200, Seed: 5})
	ctx := context.Background()
	stream := domain.AccountStream("w-acct-1")
	evs, err := env.Store.ReadStream(ctx, stream, 0, eventstore.Forwards, 0)
	if err != nil || len(evs) < 4 {
		t.Fatalf("stream %s: %d events, %v", stream, len(evs), err)
	}
	acc := accountAt(t, env, "w-acct-1", len(evs)/2)
	write := func(a *domain.Account, rev uint64, corrupt func([]byte) []byte) {
		t.Helper()
		writeSnapshot(t, env, a, rev, corrupt)
	}
	rev := uint64(acc.Revision)
	write(acc, rev, nil)
	if rep := run(t, env, audit.Options{}); !rep.OK() || rep.Snapshots != 1 {
		t.Fatalf("a true snapshot: %d checked, %v", rep.Snapshots, rep.Violations)
	}
	rich := *acc
	rich.Balance += 1000
	write(&rich, rev, nil)
	if rep := run(t, env, audit.Options{}); !rep.Has(audit.InvSnapshot, "snapshot_mismatch") {
		t.Fatalf("a snapshot of a state the stream never had: %v", rep.Violations)
	}
	write(acc, rev, func(b []byte) []byte { return bytes.Replace(b, []byte(`"held":`), []byte(`"held":1`), 1) })
	if rep := run(t, env, audit.Options{}); !rep.Has(audit.InvSnapshot, "snapshot_unreadable") {
		t.Fatalf("a snapshot whose bytes changed: %v", rep.Violations)
	}
	beyond := *acc
	beyond.Revision = int64(len(evs) + 5)
	write(&beyond, uint64(beyond.Revision), nil)
	if rep := run(t, env, audit.Options{}); !rep.Has(audit.InvSnapshot, "snapshot_beyond_stream") {
		t.Fatalf("a snapshot beyond its stream: %v", rep.Violations)
	}
	if rep := run(t, env, audit.Options{Account: "w-acct-2"}); !rep.OK() || rep.Snapshots != 0 {
		t.Fatalf("another account's audit: %d snapshots checked, %v", rep.Snapshots, rep.Violations)
	}
}

// TestAuditChecksTransactions: a ledger with transactions passes; a posted
// transaction whose recorded postings no longer match its legs (its amount
// edited) is named (invariant 2: transaction_unbalanced).
func TestAuditChecksTransactions(t *testing.T) {
	env := projected(t, projtest.Workload{Commands: 300, Seed: 6})
	ctx := context.Background()
	var n int
	if err := env.Pool.QueryRow(ctx, `SELECT count(*) FROM events WHERE type = 'TransactionPosted'`).Scan(&n); err != nil || n == 0 {
		t.Fatalf("the workload posted %d transactions: %v", n, err)
	}
	if rep := run(t, env, audit.Options{}); !rep.OK() {
		t.Fatalf("violations with transactions: %v", rep.Violations)
	}
	var pos int64
	if err := env.Pool.QueryRow(ctx, `SELECT position FROM events WHERE type = 'TransactionPosted' ORDER BY position LIMIT 1`).Scan(&pos); err != nil {
		t.Fatal(err)
	}
	exec(t, env, `UPDATE events SET data = convert_to(replace(convert_from(data, 'UTF8'), '"amount":', '"amount":1'), 'UTF8') WHERE position = $1`, pos)
	if rep := run(t, env, audit.Options{}); !rep.Has(audit.InvConservation, "transaction_unbalanced") {
		t.Fatalf("postings edited under their legs: %v", rep.Violations)
	}
}

// TestAuditCatchesPlantedCorruptions plants, each on a ledger of its own, the
// corruptions the chaos checker's self-test plants, and runs the audit through
// its streamed path (its sets in PostgreSQL, the read models compared by a
// join there): each is caught by the check that names it.
func TestAuditCatchesPlantedCorruptions(t *testing.T) {
	deposits := func(t *testing.T, env *projtest.Env) (d1, d2 deposit) {
		rows, err := env.Pool.Query(context.Background(), `SELECT event_id::text, stream, revision FROM events
			WHERE type = 'Credited' AND convert_from(data, 'UTF8')::jsonb->>'reason' = 'deposit' ORDER BY position`)
		if err != nil {
			t.Fatal(err)
		}
		var all []deposit
		var d deposit
		for rows.Next() {
			if err := rows.Scan(&d.id, &d.stream, &d.rev); err != nil {
				t.Fatal(err)
			}
			all = append(all, d)
		}
		for _, o := range all[1:] {
			if o.stream != all[0].stream {
				return all[0], o
			}
		}
		t.Fatalf("too few deposits: %v", all)
		return
	}
	for _, c := range []struct {
		name      string
		opts      audit.Options
		invariant int
		kind      string
		plant     func(t *testing.T, env *projtest.Env, d1, d2 deposit)
		// idsInSets: the store's DuplicateIDs hidden, as KurrentDB has none,
		// so that the audit counts the event IDs in its sets (audit_ids).
		idsInSets bool
	}{
		{"a duplicated event", audit.Options{}, audit.InvStreams, "duplicate_event_id", duplicateEvent, false},
		{"a duplicated event, IDs counted in the audit's sets", audit.Options{}, audit.InvStreams, "duplicate_event_id", duplicateEvent, true},
		{"a deleted event", audit.Options{}, audit.InvStreams, "revision_gap", func(t *testing.T, env *projtest.Env, d1, _ deposit) {
			exec(t, env, `DELETE FROM events WHERE event_id = $1`, d1.id)
		}, false},
		{"a phantom event", audit.Options{}, audit.InvKeyOnce, "unclaimed_key", func(t *testing.T, env *projtest.Env, d1, _ deposit) {
			exec(t, env, `INSERT INTO events (stream, revision, event_id, type, data, metadata)
				SELECT stream, (SELECT max(revision) + 1 FROM events WHERE stream = $1), gen_random_uuid(), type, data,
					convert_to(jsonb_set(convert_from(metadata, 'UTF8')::jsonb, '{key}', '"phantom-key"')::text, 'UTF8')
				FROM events WHERE event_id = $2`, d1.stream, d1.id)
		}, false},
		{"a balance off by one", audit.Options{}, audit.InvReadModel, "read_model_mismatch", func(t *testing.T, env *projtest.Env, d1, _ deposit) {
			exec(t, env, `UPDATE readmodel.balance_history SET balance = balance + 1 WHERE event_id = $1`, d1.id)
		}, false},
		{"a swapped payload", audit.Options{}, audit.InvBalance, "", func(t *testing.T, env *projtest.Env, d1, d2 deposit) {
			exec0(t, env, `UPDATE events e SET data = o.data FROM events o
				WHERE (e.event_id, o.event_id) IN (($1::uuid, $2::uuid), ($2::uuid, $1::uuid))`, d1.id, d2.id)
		}, false},
		{"an edited event, chains verified", audit.Options{VerifyChain: true}, audit.InvChain, "chain_mismatch", func(t *testing.T, env *projtest.Env, d1, _ deposit) {
			exec(t, env, `UPDATE events SET data = convert_to(replace(convert_from(data, 'UTF8'), '"amount":', '"amount":1'), 'UTF8') WHERE event_id = $1`, d1.id)
		}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := projected(t, projtest.Workload{Commands: 80, Seed: 11})
			var store audit.Store = env.Store
			if c.idsInSets {
				store = withoutDuplicateIDs{env.Store, env.Store, env.Store, env.Store, env.Store}
			}
			// Pages of 7 of the ~143 events: every plant is read through the
			// streamed path across pages; a plant that edits an event is read
			// in a middle page, one that adds a row (a duplicated or phantom
			// event, at a new position) in the last.
			opts := c.opts
			opts.BatchSize = 7
			if rep := runOn(t, env, store, opts); !rep.OK() {
				t.Fatalf("violations before the corruption: %v", rep.Violations)
			}
			d1, d2 := deposits(t, env)
			c.plant(t, env, d1, d2)
			if rep := runOn(t, env, store, opts); !rep.Has(c.invariant, c.kind) {
				t.Fatalf("%s was not caught as invariant %d %q: %v", c.name, c.invariant, c.kind, rep.Violations)
			}
		})
	}
}

// deposit is a deposit's event, where a test plants a corruption.
type deposit struct {
	id, stream string
	rev        int64
}

// duplicateEvent stores the event d1 a second time, its constraints dropped.
func duplicateEvent(t *testing.T, env *projtest.Env, d1, _ deposit) {
	// The constraints would refuse it: drop them, so that the audit has to count.
	exec0(t, env, `ALTER TABLE events DROP CONSTRAINT events_event_id_key, DROP CONSTRAINT events_stream_revision_key`)
	exec(t, env, `INSERT INTO events (stream, revision, event_id, type, data, metadata)
		SELECT stream, revision, event_id, type, data, metadata FROM events WHERE event_id = $1`, d1.id)
}

// withoutDuplicateIDs is the PostgreSQL store with DuplicateIDs hidden, as a
// KurrentDB store has none: the audit then counts the event IDs it folds in
// its sets' audit_ids (pgIDCheck) instead of asking the store.
type withoutDuplicateIDs struct {
	audit.Store
	eventstore.StreamReader
	eventstore.SnapshotStore
	eventstore.SubjectReader
	eventstore.EventLocator
}

// exec0 runs a statement, whatever rows it touches.
func exec0(t *testing.T, env *projtest.Env, sql string, args ...any) {
	t.Helper()
	if _, err := env.Pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatal(err)
	}
}

// TestAuditForgetsSettledSagas: a fold that can read streams again forgets
// each transfer and transaction once its sagas are decided, folds a forgotten
// transfer again when its refund comes, and still passes a clean ledger and
// names a completion written twice in a forgotten transfer's stream.
func TestAuditForgetsSettledSagas(t *testing.T) {
	env := projtest.New(t)
	env.Run(t, projtest.Workload{Commands: 200, Seed: 8})
	ctx := context.Background()
	env.MustApply(t, "open_account", map[string]any{"idempotency_key": "fo1", "account_id": "fa", "currency": "EUR"})
	env.MustApply(t, "open_account", map[string]any{"idempotency_key": "fo2", "account_id": "fb", "currency": "EUR"})
	env.MustApply(t, "deposit", map[string]any{"idempotency_key": "fd0", "account_id": "fa", "amount": 1000, "currency": "EUR"})
	env.MustApply(t, "transfer", map[string]any{"idempotency_key": "ft1", "transfer_id": "ft1", "from": "fa", "to": "fb", "amount": 300, "currency": "EUR"})
	for i := range 40 {
		env.MustApply(t, "deposit", map[string]any{"idempotency_key": fmt.Sprintf("fd%d", i+1), "account_id": "fb", "amount": 1, "currency": "EUR"})
	}
	env.MustApply(t, "refund", map[string]any{"idempotency_key": "fr1", "original_key": "ft1", "amount": 100})
	catchUp(t, env)

	f := audit.NewFold()
	reloads := 0
	f.Reload = func(stream string, before uint64) ([]eventstore.RecordedEvent, error) {
		reloads++
		return env.Store.ReadStream(ctx, stream, 0, eventstore.Forwards, int(before))
	}
	all := devtest.ReadAll(t, env.Store)
	transfers := map[string]bool{}
	kept := 0
	for i, re := range all {
		f.Apply(re)
		if strings.HasPrefix(re.Stream, domain.TransferStreamPrefix) {
			transfers[re.Stream] = true
		}
		if i%10 == 9 {
			f.Settle()
			kept = max(kept, len(f.Transfers))
		}
	}
	f.Finish()
	if f.ViolationCount() != 0 || reloads == 0 || kept >= len(transfers) || len(transfers) < 5 {
		t.Fatalf("violations %v; %d streams read again; at most %d of %d transfers kept", f.Violations, reloads, kept, len(transfers))
	}
	if rep := run(t, env, audit.Options{VerifyChain: true}); !rep.OK() || rep.Transfers != len(transfers) {
		t.Fatalf("audit of a clean ledger: %d transfers of %d, %v", rep.Transfers, len(transfers), rep.Violations)
	}

	// The transfer's completion written again after its refund.
	exec(t, env, `INSERT INTO events (stream, revision, event_id, type, data, metadata)
		SELECT stream, (SELECT max(revision) + 1 FROM events WHERE stream = 'transfer-ft1'), gen_random_uuid(), type, data, metadata
		FROM events WHERE stream = 'transfer-ft1' AND type = 'TransferCompleted'`)
	devtest.Settle(t, env.Store) // the audit's head past the insert
	if rep := run(t, env, audit.Options{}); rep.OK() {
		t.Fatal("a completion written twice in a forgotten transfer passed the audit")
	}
}

// TestAuditChecksEffectiveTimes (invariant 9): a ledger with backdated
// postings passes; a balance-history row or an entry edited so that the
// balance by effective time at the end of time (as query.balance and the
// statement read it) differs from the balance by record time is named
// effective_balance_mismatch; an event whose metadata was edited to
// an effective time before its account's effective opening, or far after its
// record time, is named.
func TestAuditChecksEffectiveTimes(t *testing.T) {
	env := projtest.New(t)
	opened := devtest.Epoch.Add(-30 * 24 * time.Hour)
	at := func(d time.Duration) string { return opened.Add(d).Format(time.RFC3339Nano) }
	env.MustApply(t, "open_account", map[string]any{"idempotency_key": "o-m", "account_id": "m", "currency": "EUR", "effective_at": at(0)})
	env.MustApply(t, "open_account", map[string]any{"idempotency_key": "o-n", "account_id": "n", "currency": "EUR", "effective_at": at(time.Minute)})
	env.MustApply(t, "deposit", map[string]any{"idempotency_key": "d-1", "account_id": "m", "amount": 500, "currency": "EUR"})
	env.MustApply(t, "deposit", map[string]any{"idempotency_key": "d-2", "account_id": "m", "amount": 70, "currency": "EUR", "effective_at": at(24 * time.Hour)})
	env.MustApply(t, "transfer", map[string]any{"idempotency_key": "t-1", "transfer_id": "t-1", "from": "m", "to": "n", "amount": 20, "currency": "EUR", "effective_at": at(29 * 24 * time.Hour)})
	env.MustApply(t, "place_hold", map[string]any{"idempotency_key": "h-1", "account_id": "m", "hold_id": "h-1", "amount": 30, "currency": "EUR", "effective_at": at(time.Hour)})
	r, err := projections.NewRunner(env.Pool, env.Store, projections.Options{})
	if err != nil {
		t.Fatal(err)
	}
	devtest.CatchUp(t, r)
	if rep := run(t, env, audit.Options{}); !rep.OK() {
		t.Fatalf("violations on a ledger with backdated postings: %v", rep.Violations)
	}

	for _, c := range []struct{ what, edit, undo string }{
		{"the last balance-history row of m", `UPDATE readmodel.balance_history SET balance = balance + 5 WHERE account_id = 'm' AND revision = 4`,
			`UPDATE readmodel.balance_history SET balance = balance - 5 WHERE account_id = 'm' AND revision = 4`},
		{"an entry of m", `UPDATE readmodel.entries SET amount = amount + 5 WHERE account_id = 'm' AND revision = 1`,
			`UPDATE readmodel.entries SET amount = amount - 5 WHERE account_id = 'm' AND revision = 1`},
	} {
		exec(t, env, c.edit)
		if rep := run(t, env, audit.Options{}); !rep.Has(audit.InvEffective, "effective_balance_mismatch") {
			t.Fatalf("%s edited: %v", c.what, rep.Violations)
		}
		exec(t, env, c.undo)
	}

	edit := func(key, effective string) {
		exec(t, env, `UPDATE events SET metadata = convert_to(jsonb_set(convert_from(metadata, 'UTF8')::jsonb, '{effective_at}', to_jsonb($2::text))::text, 'UTF8')
			WHERE stream = 'account-m' AND convert_from(metadata, 'UTF8')::jsonb->>'key' = $1`, key, effective)
	}
	edit("d-1", at(-time.Hour))
	rep := run(t, env, audit.Options{})
	if !rep.Has(audit.InvEffective, "effective_before_opening") {
		t.Fatalf("a deposit effective before its account's opening: %v", rep.Violations)
	}
	edit("d-1", devtest.Epoch.Add(time.Hour).Format(time.RFC3339Nano))
	if rep := run(t, env, audit.Options{}); !rep.Has(audit.InvEffective, "effective_after_record") {
		t.Fatalf("a deposit effective an hour after its record time: %v", rep.Violations)
	}
}

// TestAuditNamesAnEditedValueOfAFewValuedColumn: a row of the read models
// whose type, reason, currency or status is changed to another value the same
// table holds (a value the audit's read already met, so the one string it
// keeps for it: rows.go, interned) is a read-model mismatch.
func TestAuditNamesAnEditedValueOfAFewValuedColumn(t *testing.T) {
	env := projected(t, projtest.Workload{Commands: 80, Seed: 11})
	if rep := run(t, env, audit.Options{}); !rep.OK() {
		t.Fatalf("violations before the edit: %v", rep.Violations)
	}
	// alt is the value written where the table holds one value only (the
	// workload's one currency): one the audit's read meets first there.
	for _, c := range []struct{ table, column, alt string }{
		{"entries", "type", ""}, {"entries", "reason", ""}, {"entries", "currency", "USD"},
		{"balance_history", "type", ""}, {"balance_history", "currency", "USD"}, {"balance_history", "status", "closed"},
	} {
		t.Run(c.table+"."+c.column, func(t *testing.T) {
			// One row's value swapped for another of the table's values, and back after.
			tag := fmt.Sprintf(`UPDATE readmodel.%[1]s r SET %[2]s = o.v
				FROM (SELECT event_id, %[2]s AS old, coalesce((SELECT %[2]s FROM readmodel.%[1]s x WHERE x.%[2]s IS DISTINCT FROM t.%[2]s AND x.%[2]s IS NOT NULL LIMIT 1), nullif($1, '')) AS v
					FROM readmodel.%[1]s t WHERE %[2]s IS NOT NULL ORDER BY event_id LIMIT 1) o
				WHERE r.event_id = o.event_id AND o.v IS NOT NULL AND r.%[2]s = o.old
				RETURNING r.event_id, o.old`, c.table, c.column)
			var id any
			var old string
			if err := env.Pool.QueryRow(context.Background(), tag, c.alt).Scan(&id, &old); err != nil {
				t.Fatalf("no row of %s has two values of %s to swap: %v", c.table, c.column, err)
			}
			defer exec0(t, env, fmt.Sprintf(`UPDATE readmodel.%s SET %s = $1 WHERE event_id = $2`, c.table, c.column), old, id)
			if rep := run(t, env, audit.Options{}); !rep.Has(audit.InvReadModel, "read_model_mismatch") {
				t.Fatalf("%s.%s edited was not named: %v", c.table, c.column, rep.Violations)
			}
		})
	}
}

// An incremental audit's progress counts as done the events after its
// checkpoint, and the checkpoint's as carried: its bar no longer starts full
// (config.EventsProgress).
func TestIncrementalAuditProgressCountsFromItsCheckpoint(t *testing.T) {
	env, cp := spanned(t)
	total := int64(len(devtest.SettledAll(t, env.Store)))
	var done, carried int64
	rep := run(t, env, audit.Options{From: &cp.ID, BatchSize: 16, Progress: func(d, c int64) { done, carried = d, c }})
	if !rep.OK() || done == 0 || carried == 0 || done+carried != total {
		t.Fatalf("an incremental audit of %d events: progress %d done after %d carried, ok %v: %v", total, done, carried, rep.OK(), rep.Violations)
	}
}
