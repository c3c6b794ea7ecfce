package audit_test

import (
	"context"
	"encoding/json"
	"reflect"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/eventstore/kurrentdb"
	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/internal/app/ledger"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/projections"
	"github.com/ledgerworks/ledger/projections/projtest"
)

// slotHeld is a KurrentDB store that holds the first append to stream until
// release is closed, closing reached as it starts: a ledger over it that
// refunds into stream's slot has claimed its key for the slot and not yet
// written the slot.
type slotHeld struct {
	*kurrentdb.Store
	stream           string
	reached, release chan struct{}
	once             sync.Once
}

func (s *slotHeld) Append(ctx context.Context, stream string, expected eventstore.ExpectedRevision, events []eventstore.EventData) (eventstore.AppendResult, error) {
	if stream == s.stream {
		s.once.Do(func() { close(s.reached); <-s.release })
	}
	return s.Store.Append(ctx, stream, expected, events)
}

// kurrentTransaction is a ledger on a KurrentDB test server with read models
// in env's database: x and y open, x paid 1000, transaction x-t (x pays y
// 1000) posted under x-post.
func kurrentTransaction(t *testing.T) (*kurrentdb.Store, *projtest.Env) {
	t.Helper()
	st := devtest.KurrentDB(t)
	env := projtest.New(t)
	env.Ledger = ledger.New(st, ledger.Options{})
	t.Cleanup(env.Ledger.Close)
	env.MustApply(t, "open_account", map[string]any{"idempotency_key": "x-open", "account_id": "x", "currency": "EUR"})
	env.MustApply(t, "open_account", map[string]any{"idempotency_key": "y-open", "account_id": "y", "currency": "EUR"})
	env.MustApply(t, "deposit", map[string]any{"idempotency_key": "x-d1", "account_id": "x", "amount": 1000, "currency": "EUR"})
	env.MustApply(t, "post_transaction", map[string]any{"idempotency_key": "x-post", "transaction_id": "x-t",
		"postings": []map[string]any{{"from": "x", "to": "y", "amount": 1000, "currency": "EUR"}}})
	return st, env
}

// auditKurrent runs the audits of st named in runs, the read models in env's
// database caught up first; runs nil: in memory, and with its sets in env's
// database (the read models compared).
func auditKurrent(t *testing.T, st *kurrentdb.Store, env *projtest.Env, runs map[string]audit.Options) map[string]*audit.Report {
	t.Helper()
	r, err := projections.NewRunner(env.Pool, st, projections.Options{})
	if err != nil {
		t.Fatal(err)
	}
	devtest.CatchUp(t, r)
	if runs == nil {
		runs = map[string]audit.Options{"in memory": {}, "sets in PostgreSQL": {ReadModels: env.Pool}}
	}
	reps := map[string]*audit.Report{}
	for name, opts := range runs {
		rep, err := audit.Run(context.Background(), st, opts)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		reps[name] = rep
	}
	return reps
}

// claimedStream is the stream key's claim names.
func claimedStream(t *testing.T, st *kurrentdb.Store, key string) string {
	t.Helper()
	evs := devtest.StreamEvents(t, st, domain.KeyStream(key))
	var c domain.KeyClaimed
	if len(evs) != 1 || json.Unmarshal(evs[0].Data, &c) != nil {
		t.Fatalf("claim of %q: %d events", key, len(evs))
	}
	return c.Stream
}

// TestKurrentDBRefundInALostSlotPassesAudit: two ledger instances refund
// x-t at once on KurrentDB. Instance a claims its key for slot 0 and is held
// before it writes the slot (slotHeld); instance b refunds meanwhile and
// takes slot 0; a, released, decides its refund in slot 1 under the claim
// that names slot 0. Money and answers are right: a resend of a's refund to
// a fresh instance and the lookup of its key answer slot 1, and the audits
// (in memory, with sets in PostgreSQL, and incremental from a checkpoint
// stored while a was held: its claim before it, its decision after) are
// clean: every slot from the claimed one up to the refund's holds another
// key's decision, written before it.
func TestKurrentDBRefundInALostSlotPassesAudit(t *testing.T) {
	ctx := context.Background()
	st, env := kurrentTransaction(t)
	held := &slotHeld{Store: st, stream: domain.TransactionStream(domain.RefundTransactionID("x-t", 0)), reached: make(chan struct{}), release: make(chan struct{})}
	a, b := ledger.New(held, ledger.Options{}), ledger.New(st, ledger.Options{})
	t.Cleanup(a.Close)
	t.Cleanup(b.Close)
	aBody := []byte(`{"idempotency_key":"a-f","original_key":"x-post","amount":10}`)
	var ra ledger.Reply
	done := make(chan struct{})
	go func() { defer close(done); ra = a.HandleRaw(ctx, "refund", aBody) }()
	select {
	case <-held.reached:
	case <-done:
		t.Fatalf("a was never held: %+v", ra)
	case <-time.After(time.Minute):
		t.Fatal("a did not reach slot 0 within a minute")
	}
	rb := b.HandleRaw(ctx, "refund", []byte(`{"idempotency_key":"b-f","original_key":"x-post","amount":20}`))
	cp := auditKurrent(t, st, env, map[string]audit.Options{"": {ReadModels: env.Pool, SaveCheckpoint: true}})[""]
	close(held.release)
	<-done
	if rb.Code != domain.CodeOK || rb.Transaction == nil || rb.Transaction.TransactionID != domain.RefundTransactionID("x-t", 0) {
		t.Fatalf("b: %+v", rb)
	}
	if ra.Code != domain.CodeOK || ra.Transaction == nil || ra.Transaction.TransactionID != domain.RefundTransactionID("x-t", 1) {
		t.Fatalf("a: %+v", ra)
	}
	if got := claimedStream(t, st, "a-f"); got != held.stream {
		t.Fatalf("a's claim names %s, not the slot it lost", got)
	}
	fresh := ledger.New(st, ledger.Options{})
	t.Cleanup(fresh.Close)
	again := fresh.HandleRaw(ctx, "refund", aBody)
	found, err := fresh.Lookup(ctx, "a-f")
	if err != nil {
		t.Fatal(err)
	}
	for name, r := range map[string]*ledger.Reply{"resent": &again, "looked up": found} {
		if r == nil || r.Code != ra.Code || !reflect.DeepEqual(r.Transaction, ra.Transaction) || !reflect.DeepEqual(r.Events, ra.Events) {
			t.Errorf("%s: %+v, first %+v", name, r, ra)
		}
	}
	if cp.Checkpoint == nil {
		t.Fatalf("no checkpoint while a was held: %v", cp.Violations)
	}
	for name, rep := range auditKurrent(t, st, env, map[string]audit.Options{"in memory": {}, "sets in PostgreSQL": {ReadModels: env.Pool},
		"incremental": {ReadModels: env.Pool, From: &cp.Checkpoint.ID}}) {
		if !rep.OK() {
			t.Errorf("%s: %v", name, rep.Violations)
		}
	}
}

// TestAuditNamesAForgedClaimOfARefundSlot: refunds of transactions forged
// in a KurrentDB store (devtest.AppendForgedTransactionRefundClaimed) whose
// key's claim names another refund slot than the one they are decided in
// are named claim_mismatch, in memory and with the sets in PostgreSQL,
// unless every slot from the claimed one up to theirs holds another key's
// decision written before (g-g: accepted as a lost slot): a claim of an
// empty slot (a-g), of a later slot (b-g), of a slot before an empty one
// (c-g), of a slot another key took only after (d-g), of a slot holding the
// key's own second decision (e-g, also key_decided_twice, and that
// decision, z paying w, refund_not_reversal), of another transaction's slot
// (f-g).
func TestAuditNamesAForgedClaimOfARefundSlot(t *testing.T) {
	st, env := kurrentTransaction(t)
	env.MustApply(t, "open_account", map[string]any{"idempotency_key": "z-open", "account_id": "z", "currency": "EUR"})
	env.MustApply(t, "open_account", map[string]any{"idempotency_key": "w-open", "account_id": "w", "currency": "EUR"})
	env.MustApply(t, "deposit", map[string]any{"idempotency_key": "z-d1", "account_id": "z", "amount": 1000, "currency": "EUR"})
	env.MustApply(t, "deposit", map[string]any{"idempotency_key": "x-d2", "account_id": "x", "amount": 1000, "currency": "EUR"})
	slot := func(tx string, n int) string { return domain.TransactionStream(domain.RefundTransactionID(tx, n)) }
	back := []domain.Posting{{From: "y", To: "x", Amount: 10, Currency: "EUR"}}
	forge := func(tx string, n int, claimed string, postings []domain.Posting) {
		devtest.AppendForgedTransactionRefundClaimed(t, st, tx[:1]+"-g", tx[:1]+"-post", tx, n, claimed, postings)
	}
	refund := func(tx string) {
		env.MustApply(t, "refund", map[string]any{"idempotency_key": tx[:1] + "-f0", "original_key": tx[:1] + "-post", "amount": 10})
	}
	for _, tx := range []string{"a-t", "b-t", "c-t", "d-t", "e-t", "f-t", "g-t"} {
		env.MustApply(t, "post_transaction", map[string]any{"idempotency_key": tx[:1] + "-post", "transaction_id": tx,
			"postings": []map[string]any{{"from": "x", "to": "y", "amount": 100, "currency": "EUR"}}})
	}
	forge("a-t", 1, slot("a-t", 0), back)
	refund("b-t")
	forge("b-t", 1, slot("b-t", 2), back)
	refund("c-t")
	forge("c-t", 2, slot("c-t", 0), back)
	forge("d-t", 1, slot("d-t", 0), back)
	refund("d-t")
	forge("e-t", 1, slot("e-t", 0), back)
	forge("e-t", 0, "", []domain.Posting{{From: "z", To: "w", Amount: 10, Currency: "EUR"}})
	refund("g-t")
	forge("f-t", 1, slot("g-t", 0), back)
	forge("g-t", 1, slot("g-t", 0), back)
	want := map[string]bool{"claim_mismatch a-g": true, "claim_mismatch b-g": true, "claim_mismatch c-g": true, "claim_mismatch d-g": true,
		"claim_mismatch e-g": true, "key_decided_twice e-g": true, "claim_mismatch f-g": true,
		"refund_not_reversal ": true} // e-g's second decision (z pays w) reverses nothing of e-t
	for name, rep := range auditKurrent(t, st, env, nil) {
		if got := named(rep, 0); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: named %v, want %v: %v", name, got, want, rep.Violations)
		}
	}
}

// keyOf finds the key a violation's message names.
var keyOf = regexp.MustCompile(`key "([^"]+)"`)

// named is the violations of rep (of invariant inv; 0: all) as "kind key",
// the key the message names ("" for none).
func named(rep *audit.Report, inv int) map[string]bool {
	got := map[string]bool{}
	for _, v := range rep.Violations {
		if inv != 0 && v.Invariant != inv {
			continue
		}
		key := ""
		if m := keyOf.FindStringSubmatch(v.Message); m != nil {
			key = m[1]
		}
		got[v.Kind+" "+key] = true
	}
	return got
}

// TestIncrementalAuditNamesAKeyDecidedAgainPastItsClaimedSlot: key h-g's
// refund of x-t is decided in slot 0 under a claim of slot 0 that gives no
// revision (devtest.AppendForgedTransactionRefundEarlierClaim, as a build
// before claims gave one wrote it) and, after a checkpoint, forged again in
// slot 1 (its legs under the event IDs of the first: the read models keep
// the first, and the audits say so). The full audits name the key
// key_decided_twice. The incremental audit from the checkpoint cannot (the
// claim gives no revision to read the first decision at: trusted by
// design); the claim names slot 0 where the key is decided in slot 1, and
// slot 0 begins with no other key's decision but h-g's own, written before
// slot 1: not a lost slot, so claim_mismatch. slotsLost's m.Key == key
// guard alone decides that: without it the incremental audit names no key.
func TestIncrementalAuditNamesAKeyDecidedAgainPastItsClaimedSlot(t *testing.T) {
	st, env := kurrentTransaction(t)
	slot := func(n int) string { return domain.TransactionStream(domain.RefundTransactionID("x-t", n)) }
	back := []domain.Posting{{From: "y", To: "x", Amount: 10, Currency: "EUR"}}
	devtest.AppendForgedTransactionRefundEarlierClaim(t, st, "h-g", "x-post", "x-t", 0, slot(0), back)
	cp := auditKurrent(t, st, env, map[string]audit.Options{"": {ReadModels: env.Pool, SaveCheckpoint: true}})[""]
	if cp.Checkpoint == nil {
		t.Fatalf("no checkpoint after slot 0: %v", cp.Violations)
	}
	devtest.AppendForgedTransactionRefundClaimed(t, st, "h-g", "x-post", "x-t", 1, "", back)
	twice := map[string]bool{"key_decided_twice h-g": true, "key_decided_twice h-g:leg:x": true, "key_decided_twice h-g:leg:y": true}
	want := map[string]map[string]bool{"in memory": twice, "sets in PostgreSQL": twice, "incremental": {"claim_mismatch h-g": true}}
	for name, rep := range auditKurrent(t, st, env, map[string]audit.Options{"in memory": {}, "sets in PostgreSQL": {ReadModels: env.Pool},
		"incremental": {ReadModels: env.Pool, From: &cp.Checkpoint.ID}}) {
		if got := named(rep, audit.InvKeyOnce); !reflect.DeepEqual(got, want[name]) {
			t.Errorf("%s: named %v, want %v: %v", name, got, want[name], rep.Violations)
		}
	}
}
