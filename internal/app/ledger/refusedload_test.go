package ledger

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// TestBatchRefusalBetweenCheckAndLoad: a refusal that lands after a later
// command of the batch checked the account's pipeline (pipes.before: flowing,
// nothing refused) and before it loads the account does not let it be decided
// before the refused command (Service.refusedBefore), whether the later one
// is of one account or of several. Batch [d0 deposit 1 to a (its commit
// held, then failing), w1 withdraw 100 from a, j withdraw 100 from a (or
// transfer 100 from a to b)], a holding 150: d0 and w1 are queued on a's
// pipeline, j checks it (pipes.before; for the transfer, every account),
// and as j starts to load a (loadHook, a's lock held) d0's commit fails and
// the test waits until d0 and w1 are refused and a's pipeline drained. Sent
// one after another, w1 applies (150 -> 50) and j is refused
// (insufficient_funds). Main (bdd980d) answered w1 rejected
// (insufficient_funds) and j applied: j reloaded a from the store without w1
// and was decided first.
func TestBatchRefusalBetweenCheckAndLoad(t *testing.T) {
	for _, j := range []batchCmd{
		{"withdraw", map[string]any{"idempotency_key": "j", "account_id": "a", "amount": 100, "currency": "EUR"}},
		{"transfer", map[string]any{"idempotency_key": "j", "transfer_id": "tj", "from": "a", "to": "b", "amount": 100, "currency": "EUR"}},
	} {
		t.Run(j.typ, func(t *testing.T) { testRefusalBetweenCheckAndLoad(t, j) })
	}
}

func testRefusalBetweenCheckAndLoad(t *testing.T, j batchCmd) {
	st := devtest.Memory(t)
	s := newService(st)
	mustApply(t, s, "open_account", `{"idempotency_key":"oa","account_id":"a","currency":"EUR"}`)
	mustApply(t, s, "deposit", `{"idempotency_key":"da","account_id":"a","amount":150,"currency":"EUR"}`)
	mustApply(t, s, "open_account", `{"idempotency_key":"ob","account_id":"b","currency":"EUR"}`)
	s.Close()
	failing := &failingKeyMulti{MultiAppender: st, key: "d0", release: make(chan struct{})}
	s = New(struct {
		eventstore.Store
		eventstore.MultiAppender
	}{st, failing}, Options{Clock: clock, Logger: quietLog, Batch: BatchOptions{Committers: 1}})
	defer s.Close()
	defer failing.open() // when the test fails before it opens it
	var hooked sync.Once
	s.loadHook = func(ctx context.Context, stream string) {
		if e := batchElementOf(ctx); e == nil || e.index != 2 || stream != domain.AccountStream("a") {
			return
		}
		hooked.Do(func() {
			failing.open()
			devtest.Eventually(t, time.Minute, "d0 and w1 refused, a's pipeline drained", func() bool {
				return s.pipes.inflightCount(domain.AccountStream("a")) == 0
			})
		})
	}
	cmds := []batchCmd{
		{"deposit", map[string]any{"idempotency_key": "d0", "account_id": "a", "amount": 1, "currency": "EUR"}},
		{"withdraw", map[string]any{"idempotency_key": "w1", "account_id": "a", "amount": 100, "currency": "EUR"}},
		j,
	}
	done := make(chan Reply, 1)
	go func() { done <- s.HandleBatch(context.Background(), batchBody(cmds), 0) }()
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
		{domain.StatusError, ""}, {domain.StatusApplied, ""}, {domain.StatusRejected, domain.CodeInsufficientFunds}}
	for i, w := range want {
		if got := r.Replies[i]; got.Status != w.status || (w.code != "" && got.Code != w.code) {
			t.Errorf("element %d (%s): %s %s %s, want %s %s", i, cmds[i].typ, got.Status, got.Code, got.Message, w.status, w.code)
		}
	}
}
