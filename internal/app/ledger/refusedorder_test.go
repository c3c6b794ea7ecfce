package ledger

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// heldReads holds every read of stream until release is closed.
type heldReads struct {
	eventstore.Store
	stream  string
	release chan struct{}
}

func (h *heldReads) ReadStream(ctx context.Context, stream string, from eventstore.Revision, dir eventstore.Direction, max int) ([]eventstore.RecordedEvent, error) {
	if stream == h.stream {
		<-h.release
	}
	return h.Store.ReadStream(ctx, stream, from, dir, max)
}

// TestBatchRefusedWriteIsNotOvertaken: a batch's element whose write was
// refused (decided on a commit that failed) is decided again before any
// later element of its batch on the same account is decided, as if the
// batch were sent one command after another. Batch [c0 deposit c, d0
// deposit a (its commit fails), w1 withdraw 100 from a (150), x deposit b
// (b's read held), j transfer 100 a->b]; the commits are held until c0, d0
// and w1 are queued; c's lock is held (as by a decider loading c) so that
// the committer's continuations, c0's first, wait; the commits resolve, w1
// is decided again and written, then x and j may go. Each step waits for a
// state the store or the pipeline shows, not for time. Sequentially w1
// applies (150 -> 50) and j is refused (insufficient_funds). With 953312d (the pipeline told of the refusal on
// the committer, w1 decided again only when its continuation, queued behind
// c0's, took a's lock), w1 was not decided again while c's lock was held
// (the test fails at that wait); let go, j reloaded a from the store once
// the failed pipeline drained, was decided first and applied, and w1 was
// refused.
func TestBatchRefusedWriteIsNotOvertaken(t *testing.T) {
	st := devtest.Memory(t)
	s := newService(st)
	mustApply(t, s, "open_account", `{"idempotency_key":"oa","account_id":"a","currency":"EUR"}`)
	mustApply(t, s, "deposit", `{"idempotency_key":"da","account_id":"a","amount":150,"currency":"EUR"}`)
	mustApply(t, s, "open_account", `{"idempotency_key":"ob","account_id":"b","currency":"EUR"}`)
	mustApply(t, s, "open_account", `{"idempotency_key":"oc","account_id":"c","currency":"EUR"}`)
	s.Close()
	failing := &failingKeyMulti{MultiAppender: st, key: "d0", release: make(chan struct{})}
	failing.open()
	gate := &gatedMulti{MultiAppender: failing, release: make(chan struct{})}
	reads := &heldReads{Store: st, stream: domain.AccountStream("b"), release: make(chan struct{})}
	s = New(struct {
		eventstore.Store
		eventstore.MultiAppender
	}{reads, gate}, Options{Clock: clock, Logger: quietLog, Batch: BatchOptions{Committers: 1}})
	defer s.Close()
	var readsOnce, gateOnce bool
	defer func() { // when the test fails before it lets them go
		if !readsOnce {
			close(reads.release)
		}
		if !gateOnce {
			gate.open()
		}
	}()
	cmds := []batchCmd{
		{"deposit", map[string]any{"idempotency_key": "c0", "account_id": "c", "amount": 1, "currency": "EUR"}},
		{"deposit", map[string]any{"idempotency_key": "d0", "account_id": "a", "amount": 1, "currency": "EUR"}},
		{"withdraw", map[string]any{"idempotency_key": "w1", "account_id": "a", "amount": 100, "currency": "EUR"}},
		{"deposit", map[string]any{"idempotency_key": "x", "account_id": "b", "amount": 1, "currency": "EUR"}},
		{"transfer", map[string]any{"idempotency_key": "j", "transfer_id": "tj", "from": "a", "to": "b", "amount": 100, "currency": "EUR"}},
	}
	done := make(chan Reply, 1)
	go func() { done <- s.HandleBatch(context.Background(), batchBody(cmds), 0) }()
	devtest.Eventually(t, time.Minute, "c0, d0 and w1 queued behind the held commits", func() bool {
		return s.pipes.inflightCount("account-a") == 2 && s.pipes.inflightCount("account-c") == 1
	})
	unlockC, err := s.locks.lock(context.Background(), "account-c")
	if err != nil {
		t.Fatal(err)
	}
	unlocked := false
	defer func() { // when the test fails with c's lock held
		if !unlocked {
			unlockC()
		}
	}()
	gateOnce = true
	gate.open()
	// w1, refused with d0's commit, is decided again and written before j
	// may start (x's read is held), c's lock still held: its re-decision
	// waits for nothing of c's. With 953312d it waited behind c0's
	// continuation, which waits for c's lock, and once let go j overtook it.
	w1 := domain.EventID("w1", domain.AccountStream("a"), 0)
	devtest.Eventually(t, 30*time.Second, "w1 decided again and written while c's lock is held (its re-decision waits behind another account's lock)", func() bool {
		found, err := st.EventsExist(context.Background(), []uuid.UUID{w1})
		return err == nil && found[w1]
	})
	readsOnce = true
	close(reads.release)
	unlocked = true
	unlockC()
	var r Reply
	select {
	case r = <-done:
	case <-time.After(time.Minute):
		t.Fatal("the batch did not return")
	}
	want := []struct {
		status domain.Status
		code   domain.Code
	}{ // code "": any
		{domain.StatusApplied, ""}, {domain.StatusError, ""}, {domain.StatusApplied, ""}, {domain.StatusApplied, ""}, {domain.StatusRejected, domain.CodeInsufficientFunds}}
	for i, w := range want {
		if got := r.Replies[i]; got.Status != w.status || (w.code != "" && got.Code != w.code) {
			t.Errorf("element %d (%s): %s %s %s, want %s %s", i, cmds[i].typ, got.Status, got.Code, got.Message, w.status, w.code)
		}
	}
}
