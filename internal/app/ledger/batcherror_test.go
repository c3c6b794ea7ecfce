package ledger

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// The element after an error (PROTOCOL.md §2.2): in a batch that is not
// atomic, a command that comes after one that answered error (it shares an
// account, a key, a transfer or a transaction ID with it, directly or through
// the commands between them) answers error too, nothing written for it, so
// that the client's resend of the batch decides it after the failed one, as
// sending them one after another would (ErrEarlierUndecided).

// TestBatchElementAfterAnError: batch [k1 deposit 100 to the empty account
// d, k2 withdraw 80 from d], k1's commit failing once. k2 answers error and
// its key stays undecided; the batch resent applies both (d: 20). Before the
// rule (main at a5f103f) k2 answered rejected insufficient_funds, decided on
// d without k1, and the resend answered that refusal, duplicate. Held: k1's
// commit is held until k2 is queued on the state it leaves (refused with its
// chain, then decided again); not held: k1 fails as soon as it is sent.
func TestBatchElementAfterAnError(t *testing.T) {
	devtest.Stores(t, devtest.MultiAppend, func(t *testing.T, st eventstore.Store) {
		for _, held := range []bool{false, true} {
			name := map[bool]string{false: "failing", true: "held"}[held]
			t.Run(name, func(t *testing.T) {
				d := "d-" + name // one store for both: an account and keys of their own
				s, failing := failingService(t, st, d+"-k1", d)
				cmds := []batchCmd{
					{"deposit", map[string]any{"idempotency_key": d + "-k1", "account_id": d, "amount": 100, "currency": "EUR"}},
					{"withdraw", map[string]any{"idempotency_key": d + "-k2", "account_id": d, "amount": 80, "currency": "EUR"}},
				}
				if !held {
					failing.open()
				}
				done := make(chan Reply, 1)
				go func() { done <- s.HandleBatch(context.Background(), batchBody(cmds), 0) }()
				if held {
					devtest.Eventually(t, time.Minute, "k1 and k2 queued on d", func() bool {
						return s.pipes.inflightCount(domain.AccountStream(d)) == 2
					})
					failing.open()
				}
				checkReplies(t, awaitBatch(t, done), cmds, []wantReply{{domain.StatusError, ""}, {domain.StatusError, ""}})
				checkUndecided(t, s, st, d+"-k2")
				failing.healed.Store(true)
				r := s.HandleBatch(context.Background(), batchBody(cmds), 0)
				checkReplies(t, r, cmds, []wantReply{{domain.StatusApplied, ""}, {domain.StatusApplied, ""}})
				if got := r.Replies[1]; got.Duplicate || got.Account == nil || got.Account.Balance != 20 {
					t.Fatalf("k2 resent: %+v, want applied leaving 20", got)
				}
			})
		}
	})
}

// TestBatchChainAfterAnError: batch [e1 deposit 100 to a (its commit
// failing once), e2 transfer 50 a->b, e3 deposit 10 to b, e4 deposit 10 to
// c]: e2 comes after e1 (a), e3 after e2 (b), so both answer error, nothing
// written for them (no transfer recorded, no key decided); e4 shares nothing
// with them and applies. Resent, the batch applies e1, e2 and e3, e4 a
// duplicate. Before the rule, e2 was rejected (insufficient_funds, a empty)
// and e3 applied.
func TestBatchChainAfterAnError(t *testing.T) {
	devtest.Stores(t, devtest.MultiAppend, func(t *testing.T, st eventstore.Store) {
		s, failing := failingService(t, st, "e1", "a", "b", "c")
		failing.open()
		checkChainAfterAnError(t, s, st, &failing.healed)
	})
}

// TestBatchChainAfterAnErrorSaga is TestBatchChainAfterAnError on the stores
// without multi-stream appends, where the transfer is a saga whose request
// is recorded on its stream before its first step: e2 is never started (its
// batch's elements start once the ones they come after have answered), so no
// transfer request stands that a step refused with error would leave behind.
func TestBatchChainAfterAnErrorSaga(t *testing.T) {
	devtest.Stores(t, devtest.SingleAppend, func(t *testing.T, st eventstore.Store) {
		s := newService(st)
		for _, id := range []string{"a", "b", "c"} {
			mustApply(t, s, "open_account", `{"idempotency_key":"open-`+id+`","account_id":"`+id+`","currency":"EUR"}`)
		}
		s.Close()
		failing := &failingAppends{Store: st, stream: domain.AccountStream("a")}
		s = New(failing, Options{Clock: clock, Logger: quietLog})
		defer s.Close()
		checkChainAfterAnError(t, s, st, &failing.healed)
	})
}

// checkChainAfterAnError sends TestBatchChainAfterAnError's batch to s, whose
// store fails e1's first append, and checks its replies and its resend's.
func checkChainAfterAnError(t *testing.T, s *Service, st eventstore.Store, healed *atomic.Bool) {
	t.Helper()
	cmds := []batchCmd{
		{"deposit", map[string]any{"idempotency_key": "e1", "account_id": "a", "amount": 100, "currency": "EUR"}},
		{"transfer", map[string]any{"idempotency_key": "e2", "transfer_id": "t2", "from": "a", "to": "b", "amount": 50, "currency": "EUR"}},
		{"deposit", map[string]any{"idempotency_key": "e3", "account_id": "b", "amount": 10, "currency": "EUR"}},
		{"deposit", map[string]any{"idempotency_key": "e4", "account_id": "c", "amount": 10, "currency": "EUR"}},
	}
	ctx := context.Background()
	checkReplies(t, s.HandleBatch(ctx, batchBody(cmds), 0), cmds, []wantReply{
		{domain.StatusError, ""}, {domain.StatusError, ""}, {domain.StatusError, ""}, {domain.StatusApplied, ""}})
	checkUndecided(t, s, st, "e2", "e3")
	if evs := devtest.StreamEvents(t, st, domain.TransferStream("t2")); len(evs) != 0 {
		t.Fatalf("transfer t2 recorded: %d events", len(evs))
	}
	healed.Store(true)
	r := s.HandleBatch(ctx, batchBody(cmds), 0)
	checkReplies(t, r, cmds, []wantReply{
		{domain.StatusApplied, ""}, {domain.StatusApplied, ""}, {domain.StatusApplied, ""}, {domain.StatusApplied, ""}})
	for i, dup := range []bool{false, false, false, true} {
		if r.Replies[i].Duplicate != dup {
			t.Errorf("element %d resent: duplicate %v, want %v", i, r.Replies[i].Duplicate, dup)
		}
	}
}

// checkUndecided fails t unless each key is undecided: ledger.v1.query.command
// (Lookup) does not know it and the store holds no claim of it.
func checkUndecided(t *testing.T, s *Service, st eventstore.Store, keys ...string) {
	t.Helper()
	for _, key := range keys {
		if got, err := s.Lookup(context.Background(), key); err != nil || got != nil {
			t.Fatalf("key %s decided (%v): %+v", key, err, got)
		}
		if evs := devtest.StreamEvents(t, st, domain.KeyStream(key)); len(evs) != 0 {
			t.Fatalf("key %s claimed: %d events", key, len(evs))
		}
	}
}

// failingService is a service over st (memory or PostgreSQL), on the open
// accounts accs, whose appends of key's claim fail, having written nothing,
// until the returned store is healed (the first one waits for its open).
func failingService(t *testing.T, st eventstore.Store, key string, accs ...string) (*Service, *failingKeyMulti) {
	s := newService(st)
	for _, id := range accs {
		mustApply(t, s, "open_account", `{"idempotency_key":"open-`+id+`","account_id":"`+id+`","currency":"EUR"}`)
	}
	s.Close()
	failing := &failingKeyMulti{MultiAppender: st.(eventstore.MultiAppender), key: key, release: make(chan struct{})}
	s = New(struct {
		eventstore.Store
		eventstore.MultiAppender
	}{st, failing}, Options{Clock: clock, Logger: quietLog})
	t.Cleanup(s.Close)
	t.Cleanup(failing.open) // when the test fails before it opens it (cleanups run last first)
	return s, failing
}

// failingAppends fails every single-stream append to stream, having written
// nothing, until healed is set; the others pass.
type failingAppends struct {
	eventstore.Store
	stream string
	healed atomic.Bool
}

func (f *failingAppends) Append(ctx context.Context, stream string, exp eventstore.ExpectedRevision, evs []eventstore.EventData) (eventstore.AppendResult, error) {
	if stream == f.stream && !f.healed.Load() {
		return eventstore.AppendResult{}, errInjected
	}
	return f.Store.Append(ctx, stream, exp, evs)
}

// TestTransferSagaFirstStepError: on a store without multi-stream appends, a
// transfer whose first step (the debit of a) fails answers error with its
// request already recorded on its stream (the saga's request is its first
// write). What a batch's element after an error could once leave behind
// (TestBatchChainAfterAnErrorSaga: no longer, the element is not started),
// and what any infrastructure failure of a step still leaves. Its resend
// drives the saga on and answers its outcome: applied, a debited and b
// credited once; a second resend answers the same reply, duplicate.
func TestTransferSagaFirstStepError(t *testing.T) {
	devtest.Stores(t, devtest.SingleAppend, func(t *testing.T, st eventstore.Store) {
		s := newService(st)
		for _, id := range []string{"a", "b"} {
			mustApply(t, s, "open_account", `{"idempotency_key":"open-`+id+`","account_id":"`+id+`","currency":"EUR"}`)
		}
		mustApply(t, s, "deposit", `{"idempotency_key":"fund-a","account_id":"a","amount":100,"currency":"EUR"}`)
		s.Close()
		failing := &failingAppends{Store: st, stream: domain.AccountStream("a")}
		s = New(failing, Options{Clock: clock, Logger: quietLog})
		defer s.Close()
		body := `{"idempotency_key":"tk","transfer_id":"t1","from":"a","to":"b","amount":30,"currency":"EUR"}`
		if r := post(t, s, "transfer", body); r.Status != domain.StatusError {
			t.Fatalf("the transfer, its debit failing: %+v, want error", r)
		}
		if evs := devtest.StreamEvents(t, st, domain.TransferStream("t1")); len(evs) == 0 {
			t.Fatal("no request recorded: the case this test is for was not reached")
		}
		failing.healed.Store(true)
		r := post(t, s, "transfer", body)
		if r.Status != domain.StatusApplied || r.Transfer == nil || r.Transfer.Status != "completed" {
			t.Fatalf("the transfer resent: %+v, want applied, completed", r)
		}
		if again := post(t, s, "transfer", body); !again.Duplicate || again.Status != r.Status || again.Transfer == nil || again.Transfer.Status != r.Transfer.Status {
			t.Fatalf("resent again: %+v, want %s %s, duplicate", again, r.Status, r.Transfer.Status)
		}
		if a, b := devtest.Account(t, st, "a"), devtest.Account(t, st, "b"); a.Balance != 70 || b.Balance != 30 {
			t.Fatalf("a folds to %d, b to %d; want 70 and 30", a.Balance, b.Balance)
		}
	})
}
