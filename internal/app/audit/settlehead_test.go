package audit_test

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/eventstore/postgres"
	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/projections/projtest"
)

// streamCounting is a store that counts the transfer and transaction streams
// an audit reads again (the fold's reload of a stream it forgot or carried).
type streamCounting struct {
	*postgres.Store
	reads atomic.Int64
}

func (s *streamCounting) ReadStream(ctx context.Context, stream string, from eventstore.Revision, dir eventstore.Direction, max int) ([]eventstore.RecordedEvent, error) {
	if strings.HasPrefix(stream, domain.TransferStreamPrefix) || domain.IsTransactionStream(stream) {
		s.reads.Add(1)
	}
	return s.Store.ReadStream(ctx, stream, from, dir, max)
}

// TestCheckpointAtTheHeadCarriesNoDecidedStream: an audit that reads to the
// store's head settles the last append too (it is whole there), so the
// checkpoint it stores carries none of that append's decided streams and the
// audit from it, with no event after it, reads no transfer or transaction
// stream again from the store (before, it read the last append's again);
// both count every stream of the store.
func TestCheckpointAtTheHeadCarriesNoDecidedStream(t *testing.T) {
	env := projtest.New(t)
	env.Run(t, projtest.Workload{Commands: 60, Seed: 31})
	for _, id := range []string{"head-a", "head-b"} {
		env.MustApply(t, "open_account", map[string]any{"idempotency_key": "open-" + id, "account_id": id, "currency": "EUR"})
	}
	env.MustApply(t, "deposit", map[string]any{"idempotency_key": "head-dep", "account_id": "head-a", "amount": 10, "currency": "EUR"})
	env.MustApply(t, "post_transaction", map[string]any{"idempotency_key": "head-tx", "transaction_id": "head-tx", "postings": []map[string]any{{"from": "head-a", "to": "head-b", "amount": 2, "currency": "EUR"}}})
	env.MustApply(t, "transfer", map[string]any{"idempotency_key": "last-t", "transfer_id": "last-t", "from": "head-a", "to": "head-b", "amount": 1, "currency": "EUR"})
	catchUp(t, env)
	first := run(t, env, audit.Options{SaveCheckpoint: true})
	if !first.OK() || first.Checkpoint == nil {
		t.Fatalf("the first audit: ok %v, checkpoint %v: %v", first.OK(), first.Checkpoint, first.Violations)
	}
	st := &streamCounting{Store: env.Store}
	inc := runOn(t, env, st, audit.Options{From: &first.Checkpoint.ID, SaveCheckpoint: true})
	if !inc.OK() || inc.Events != first.Events {
		t.Fatalf("from the checkpoint: ok %v over %d events (%d before): %v", inc.OK(), inc.Events, first.Events, inc.Violations)
	}
	if n := st.reads.Load(); n != 0 {
		t.Fatalf("the audit from a checkpoint at the head read %d transfer or transaction streams again", n)
	}
	if !reflect.DeepEqual(inc.Totals, first.Totals) || inc.Transfers != first.Transfers {
		t.Fatalf("from the checkpoint %+v (%d transfers), the first %+v (%d)", inc.Totals, inc.Transfers, first.Totals, first.Transfers)
	}
	// Both count every stream the store holds, the settled transfer and
	// transaction streams too.
	var streams int
	if err := env.Pool.QueryRow(context.Background(), `SELECT count(DISTINCT stream) FROM events`).Scan(&streams); err != nil {
		t.Fatal(err)
	}
	if first.Streams != streams || inc.Streams != streams {
		t.Fatalf("the store holds %d streams; the full audit counted %d, the one from its checkpoint %d", streams, first.Streams, inc.Streams)
	}
}

// TestIncrementalAuditFollowsASagaHalfWrittenAtItsCheckpoint: a transfer saga
// written in several appends (a store without multi-stream appends), its
// debit in the last append before the checkpoint and its credit and outcome
// after it, is followed across the checkpoint although the audit settled the
// last append at the head: an undecided saga is carried, not forgotten, and
// the audit from the checkpoint agrees with a full one; a second credit of
// the saga planted after the checkpoint is named by both.
func TestIncrementalAuditFollowsASagaHalfWrittenAtItsCheckpoint(t *testing.T) {
	all := sagaLog(t, []sagaCommand{
		{"open_account", `{"idempotency_key":"o-a","account_id":"a","currency":"EUR"}`, "applied"},
		{"open_account", `{"idempotency_key":"o-b","account_id":"b","currency":"EUR"}`, "applied"},
		{"deposit", `{"idempotency_key":"d-a","account_id":"a","amount":100,"currency":"EUR"}`, "applied"},
		{"transfer", `{"idempotency_key":"t-1","transfer_id":"t-1","from":"a","to":"b","amount":40,"currency":"EUR"}`, "applied"},
	})
	cut := slices.IndexFunc(all, func(re eventstore.RecordedEvent) bool {
		return re.Stream == "account-b" && re.Type == domain.EvCredited
	})
	if cut < 0 || !slices.ContainsFunc(all[:cut], func(re eventstore.RecordedEvent) bool { return re.Stream == "account-a" && re.Type == domain.EvDebited }) {
		t.Fatalf("no credit of b after a's debit in %d events", len(all))
	}
	for _, c := range []struct {
		name  string
		after []eventstore.RecordedEvent
		ok    bool
	}{
		{"as written", all[cut:], true},
		{"credited twice", append([]eventstore.RecordedEvent{all[cut], again(all[cut])}, all[cut+1:]...), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := projtest.New(t)
			load(t, env, all[:cut]) // the saga's request and debit in the last append before the checkpoint
			catchUp(t, env)
			first := run(t, env, audit.Options{SaveCheckpoint: true})
			if !first.OK() || first.Checkpoint == nil || len(first.Totals) != 1 || first.Totals[0].PendingSaga != 1 {
				t.Fatalf("at the checkpoint: ok %v, checkpoint %v, totals %+v: %v", first.OK(), first.Checkpoint, first.Totals, first.Violations)
			}
			load(t, env, c.after)
			catchUp(t, env)
			inc := run(t, env, audit.Options{From: &first.Checkpoint.ID})
			full := run(t, env, audit.Options{})
			if inc.OK() != c.ok || full.OK() != c.ok || inc.Events != full.Events {
				t.Fatalf("incremental ok %v over %d events, full ok %v over %d; want ok %v: %v / %v", inc.OK(), inc.Events, full.OK(), full.Events, c.ok, inc.Violations, full.Violations)
			}
			if c.ok && (!reflect.DeepEqual(inc.Totals, full.Totals) || inc.Totals[0].PendingSaga != 0) {
				t.Fatalf("incremental %+v, full %+v", inc.Totals, full.Totals)
			}
			if !c.ok && kinds(inc.Violations) != kinds(full.Violations) {
				t.Fatalf("incremental names %s, full %s", kinds(inc.Violations), kinds(full.Violations))
			}
		})
	}
}

// again is re's event stored once more: the next revision of its stream, a new ID.
func again(re eventstore.RecordedEvent) eventstore.RecordedEvent {
	re.ID, re.Revision = uuid.New(), re.Revision+1
	return re
}

// kinds lists the violations' invariants and kinds, each once (a full audit
// names every read-model row, an incremental one those of the rows it read).
func kinds(vs []audit.Violation) string {
	var out []string
	for _, v := range vs {
		out = append(out, fmt.Sprintf("%d/%s", v.Invariant, v.Kind))
	}
	slices.Sort(out)
	return strings.Join(slices.Compact(out), " ")
}

// load writes recs to env's store in one append (one commit), each at its
// stream's next revision as recorded.
func load(t *testing.T, env *projtest.Env, recs []eventstore.RecordedEvent) {
	t.Helper()
	parts := make([]eventstore.StreamAppend, 0, len(recs))
	for _, re := range recs {
		parts = append(parts, eventstore.StreamAppend{Stream: re.Stream, Expected: eventstore.ExactOrNoStream(int64(re.Revision) - 1), Events: []eventstore.EventData{{ID: re.ID, Type: re.Type, Data: re.Data, Metadata: re.Metadata}}})
	}
	if err := env.Store.Load(context.Background(), parts); err != nil {
		t.Fatal(err)
	}
}

// TestAccountAuditKeepsASettledTransfersViolation: a transfer of the last
// commit whose credit moved 30 of its 40 (money conserved: 10 in flight) is a
// saga_mismatch of its transfer stream alone. The fold settles it at the head
// and forgets it; `--account` of either party still lists the violation, as
// the whole-ledger audit does (review r504: it reported such an account clean).
func TestAccountAuditKeepsASettledTransfersViolation(t *testing.T) {
	all := sagaLog(t, []sagaCommand{
		{"open_account", `{"idempotency_key":"o-a","account_id":"a","currency":"EUR"}`, "applied"},
		{"open_account", `{"idempotency_key":"o-b","account_id":"b","currency":"EUR"}`, "applied"},
		{"open_account", `{"idempotency_key":"o-c","account_id":"c","currency":"EUR"}`, "applied"},
		{"deposit", `{"idempotency_key":"d-a","account_id":"a","amount":100,"currency":"EUR"}`, "applied"},
		{"transfer", `{"idempotency_key":"t-1","transfer_id":"t-1","from":"a","to":"b","amount":40,"currency":"EUR"}`, "applied"},
	})
	forged := make([]eventstore.RecordedEvent, len(all))
	for i, re := range all {
		if re.Stream == "account-b" && re.Type == domain.EvCredited {
			re.Data = []byte(strings.NewReplacer(`"amount":40`, `"amount":30`, `"balance_after":40`, `"balance_after":30`).Replace(string(re.Data)))
		}
		forged[i] = re
	}
	env := projtest.New(t)
	load(t, env, forged)
	catchUp(t, env)
	whole := run(t, env, audit.Options{})
	if !whole.Has(audit.InvConservation, "saga_mismatch") {
		t.Fatalf("whole: %v", whole.Violations)
	}
	for _, account := range []string{"a", "b"} {
		acct := run(t, env, audit.Options{Account: account})
		if acct.OK() || !acct.Has(audit.InvConservation, "saga_mismatch") {
			t.Errorf("--account %s: ok %v, %s; the whole-ledger audit: %s", account, acct.OK(), kinds(acct.Violations), kinds(whole.Violations))
		}
	}
	// An account not party to the transfer is not told of it.
	if c := run(t, env, audit.Options{Account: "c"}); c.Has(audit.InvConservation, "saga_mismatch") {
		t.Errorf("--account c lists another transfer's saga_mismatch: %s", kinds(c.Violations))
	}
}

// TestSettledAtTheHeadThenMore (review r504): settleAtHead with saga logs of a store without
// multi-stream appends, loaded into PostgreSQL: the part before the cut in
// one commit (the checkpoint's last append, settled at the head), the part
// after in another.
func TestSettledAtTheHeadThenMore(t *testing.T) {
	base := []sagaCommand{
		{"open_account", `{"idempotency_key":"o-a","account_id":"a","currency":"EUR"}`, "applied"},
		{"open_account", `{"idempotency_key":"o-b","account_id":"b","currency":"EUR"}`, "applied"},
		{"deposit", `{"idempotency_key":"d-a","account_id":"a","amount":100,"currency":"EUR"}`, "applied"},
		{"transfer", `{"idempotency_key":"t-1","transfer_id":"t-1","from":"a","to":"b","amount":40,"currency":"EUR"}`, "applied"},
	}
	refund := sagaCommand{"refund", `{"idempotency_key":"r-1","original_key":"t-1","amount":40}`, "applied"}
	tx := sagaCommand{"post_transaction", `{"idempotency_key":"tx-1","transaction_id":"tx-1","postings":[{"from":"a","to":"b","amount":10,"currency":"EUR"}]}`, "applied"}
	withRefund := sagaLog(t, append(append([]sagaCommand{}, base...), refund))
	withTx := sagaLog(t, append(append([]sagaCommand{}, base...), tx))
	cutT := len(sagaLog(t, base))
	r1 := sagaCommand{"refund", `{"idempotency_key":"r-1","original_key":"t-1","amount":30}`, "applied"}
	r2 := sagaCommand{"refund", `{"idempotency_key":"r-2","original_key":"t-1","amount":10}`, "applied"}
	twoRefunds := sagaLog(t, append(append([]sagaCommand{}, base...), r1, r2))
	cutR := len(sagaLog(t, append(append([]sagaCommand{}, base...), r1)))
	// overRefund: r-2's request forged to 20, over the 10 left of t-1 (settled at the head with r-1).
	overRefund := func() []eventstore.RecordedEvent {
		var out []eventstore.RecordedEvent
		for _, re := range twoRefunds[cutR:] {
			if re.Type == domain.EvTransferRefundRequested {
				re.Data = []byte(strings.Replace(string(re.Data), `"amount":10`, `"amount":20`, 1))
				if !strings.Contains(string(re.Data), `"amount":20`) {
					t.Fatalf("no amount in %s", re.Data)
				}
			}
			out = append(out, re)
		}
		return out
	}()
	// next is a copy of re at the next revision of its stream after recs.
	next := func(recs []eventstore.RecordedEvent, re eventstore.RecordedEvent) eventstore.RecordedEvent {
		n := 0
		for _, r := range recs {
			if r.Stream == re.Stream {
				n++
			}
		}
		re.Revision = uint64(n) - 1
		return again(re)
	}
	lastOf := func(recs []eventstore.RecordedEvent, stream, typ string) eventstore.RecordedEvent {
		var out eventstore.RecordedEvent
		for _, r := range recs {
			if r.Stream == stream && r.Type == typ {
				out = r
			}
		}
		if out.Stream == "" {
			t.Fatalf("no %s in %s", typ, stream)
		}
		return out
	}
	// cutTx: mid tx-1, after its first event on an account stream.
	cutTx := -1
	for i := cutT; i < len(withTx); i++ {
		if withTx[i].Stream == "account-a" {
			cutTx = i + 1
			break
		}
	}
	credit := lastOf(withRefund[:cutT], "account-b", domain.EvCredited)
	for _, c := range []struct {
		name          string
		before, after []eventstore.RecordedEvent
		ok            bool
	}{
		{"transfer settled at head, refunded after", withRefund[:cutT], withRefund[cutT:], true},
		{"transfer settled at head, its credit stored twice after", withRefund[:cutT], []eventstore.RecordedEvent{next(withRefund[:cutT], credit)}, false},
		{"transfer settled at head, refund credited twice after", withRefund[:cutT], func() []eventstore.RecordedEvent {
			rc := lastOf(withRefund, "account-a", domain.EvCredited)
			return append(append([]eventstore.RecordedEvent{}, withRefund[cutT:]...), next(withRefund, rc))
		}(), false},
		{"transfer and a refund settled at head, refunded over it after", twoRefunds[:cutR], overRefund, false},
		{"transaction saga carried at head", withTx[:cutTx], withTx[cutTx:], true},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := projtest.New(t)
			load(t, env, c.before)
			catchUp(t, env)
			first := run(t, env, audit.Options{SaveCheckpoint: true})
			if !first.OK() || first.Checkpoint == nil {
				t.Fatalf("at the checkpoint: ok %v, checkpoint %v: %v", first.OK(), first.Checkpoint, first.Violations)
			}
			load(t, env, c.after)
			catchUp(t, env)
			inc := run(t, env, audit.Options{From: &first.Checkpoint.ID})
			full := run(t, env, audit.Options{})
			var streams int
			if err := env.Pool.QueryRow(context.Background(), `SELECT count(DISTINCT stream) FROM events`).Scan(&streams); err != nil {
				t.Fatal(err)
			}
			t.Logf("streams: store %d, first %d, incremental %d, full %d; incremental %s; full %s", streams, first.Streams, inc.Streams, full.Streams, kinds(inc.Violations), kinds(full.Violations))
			if inc.OK() != c.ok || full.OK() != c.ok {
				t.Fatalf("incremental ok %v, full ok %v; want %v: %v / %v", inc.OK(), full.OK(), c.ok, inc.Violations, full.Violations)
			}
			if c.ok && (inc.Streams != streams || full.Streams != streams) {
				t.Fatalf("the store holds %d streams; incremental counted %d, full %d", streams, inc.Streams, full.Streams)
			}
		})
	}
}
