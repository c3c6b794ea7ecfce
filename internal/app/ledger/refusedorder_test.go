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
// refused (decided on a commit that was refused) is decided again before
// any later element of its batch on the same account is decided, however
// long its re-decision waits, as if the batch were sent one command after
// another. Batch [d0 deposit a (its commit held, then refused: another
// instance deposits 1 to a first, conflictService; decided again, its commit
// then held), w1 withdraw 100 from a (150; refused with d0's chain, then
// waiting, its locks released, for d0 to finish: afterEarlier), x deposit b
// (b's read held until d0 and w1 are refused, d0 decided again and w1 gone
// from a's pipeline), j transfer 100 a->b]. j comes to a with w1 still to be
// decided again: the test lets d0's second commit go only once j was decided
// (tj written, or queued on a behind d0) or waited for the refusal
// (ledger_batch_refusal_waits_total).
// Sequentially w1 applies (152 -> 52) and j is refused (insufficient_funds).
// Without the wait (refusedBefore answering nil) j was decided on d0's
// pending state first and applied, and w1 was refused: so it failed before
// that rule. (6b8226c's version waited for w1 to be written before j could
// start, and could no longer fail on the overtake. Until the rule of the
// element after an error, d0's commit failed here and its answer was held
// instead: ErrEarlierUndecided now answers w1 and j error.)
func TestBatchRefusedWriteIsNotOvertaken(t *testing.T) {
	st := devtest.Memory(t)
	bRead := &heldReads{Store: st, stream: domain.AccountStream("b"), release: make(chan struct{})}
	s, c := conflictService(t, st, bRead, 2, nil)
	var once sync.Once
	let := func() { once.Do(func() { close(bRead.release) }) }
	defer let()
	cmds := []batchCmd{
		{"deposit", map[string]any{"idempotency_key": "d0", "account_id": "a", "amount": 1, "currency": "EUR"}},
		{"withdraw", map[string]any{"idempotency_key": "w1", "account_id": "a", "amount": 100, "currency": "EUR"}},
		{"deposit", map[string]any{"idempotency_key": "x", "account_id": "b", "amount": 1, "currency": "EUR"}},
		{"transfer", map[string]any{"idempotency_key": "j", "transfer_id": "tj", "from": "a", "to": "b", "amount": 100, "currency": "EUR"}},
	}
	done := make(chan Reply, 1)
	go func() { done <- s.HandleBatch(context.Background(), batchBody(cmds), 0) }()
	devtest.Eventually(t, time.Minute, "d0 and w1 queued on a", func() bool { return s.pipes.inflightCount("account-a") == 2 })
	c.open()
	// d0's second append under way: d0 was refused, and w1 with it before
	// (a's committer, in order); d0's new append alone in flight: w1 gone
	// from a's pipeline, so marked refused (finishHot)
	// (x's commit, on b, goes to the other committer, not behind d0's held one)
	devtest.Eventually(t, time.Minute, "d0 and w1 refused, d0 decided again", func() bool {
		return c.n.Load() == 2 && s.pipes.inflightCount("account-a") == 1
	})
	let()
	devtest.Eventually(t, time.Minute, "j decided (written, or queued behind d0 on a), or waiting for w1", func() bool {
		evs, _ := st.ReadStream(context.Background(), domain.TransferStream("tj"), 0, eventstore.Forwards, 1)
		return len(evs) > 0 || s.pipes.inflightCount("account-a") == 2 || counterValue(t, s.metrics.refusalWaits) > 0
	})
	c.let()
	checkReplies(t, awaitBatch(t, done), cmds, []wantReply{
		{domain.StatusApplied, ""}, {domain.StatusApplied, ""}, {domain.StatusApplied, ""}, {domain.StatusRejected, domain.CodeInsufficientFunds}})
}

// awaitBatch is the reply HandleBatch sends on done, within a minute.
func awaitBatch(t *testing.T, done <-chan Reply) Reply {
	t.Helper()
	select {
	case r := <-done:
		return r
	case <-time.After(time.Minute):
		t.Fatal("the batch did not return")
		return Reply{}
	}
}

// wantReply is a reply's status and code ("": any).
type wantReply struct {
	status domain.Status
	code   domain.Code
}

// checkReplies reports each reply of r unlike want.
func checkReplies(t *testing.T, r Reply, cmds []batchCmd, want []wantReply) {
	t.Helper()
	for i, w := range want {
		if got := r.Replies[i]; got.Status != w.status || (w.code != "" && got.Code != w.code) {
			t.Errorf("element %d (%s): %s %s %s, want %s %s", i, cmds[i].typ, got.Status, got.Code, got.Message, w.status, w.code)
		}
	}
}
