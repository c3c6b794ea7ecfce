package ledger

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// TestBatchRefusalBetweenCheckAndLoad: a refusal that lands after a later
// command of the batch checked the account's pipeline (pipes.before: flowing,
// nothing refused) and before it loads the account does not let it be decided
// before the refused command (Service.refusedBefore), whether the later one
// is of one account or of several. Batch [d0 deposit 1 to a (its commit
// held, then refused: another instance deposits 1 to a first,
// conflictService), w1 withdraw 100 from a, j withdraw 100 from a (or
// transfer 100 from a to b)], a holding 150: d0 and w1 are queued on a's
// pipeline, j checks it (pipes.before; for the transfer, every account),
// and as j starts to load a (loadHook, a's lock held) d0's commit is refused
// and the test waits until d0 and w1 are refused and a's pipeline drained.
// Sent one after another, d0 and w1 apply (152 -> 52) and j is refused
// (insufficient_funds). Main (bdd980d) answered w1 rejected
// (insufficient_funds) and j applied: j reloaded a from the store without w1
// and was decided first. (Until the rule of the element after an error,
// d0's commit failed here instead: ErrEarlierUndecided now answers w1 and j
// error.)
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
	s, c := conflictService(t, st, st, 1, nil)
	c.let() // d0 decided again goes at once
	var hooked sync.Once
	s.loadHook = func(ctx context.Context, stream string) {
		if e := batchElementOf(ctx); e == nil || e.index != 2 || stream != domain.AccountStream("a") {
			return
		}
		hooked.Do(func() {
			c.open()
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
	checkReplies(t, awaitBatch(t, done), cmds, []wantReply{
		{domain.StatusApplied, ""}, {domain.StatusApplied, ""}, {domain.StatusRejected, domain.CodeInsufficientFunds}})
}

// TestBatchRefusalWaitHoldsNoStreamLock: a command of a batch that waits for
// an earlier refused command to be decided again holds no lock meanwhile,
// not even its own transfer's stream, which the refused command may need.
// Batch [d0 deposit 1 to a (its commit refused: another instance deposits 1
// to a first, conflictService; then, decided again, its commit held), e
// transfer tj 100 a->b (refused with d0's chain, then waiting for d0 to
// finish), j transfer tj 100 a->b under another key]: j takes tj's lock once
// e gave it up, finds e to be decided again, and waits; then d0's commit
// goes, and e is decided again, on tj's lock. Waiting in loadAccounts with
// only the accounts' locks released, j kept tj's and e waited for it forever
// (the batch did not return). (Until the rule of the element after an
// error, d0's commit failed here and its answer was held instead:
// ErrEarlierUndecided now answers e and j error.)
func TestBatchRefusalWaitHoldsNoStreamLock(t *testing.T) {
	st := devtest.Memory(t)
	s, c := conflictService(t, st, st, 1, nil)
	cmds := []batchCmd{
		{"deposit", map[string]any{"idempotency_key": "d0", "account_id": "a", "amount": 1, "currency": "EUR"}},
		{"transfer", map[string]any{"idempotency_key": "e", "transfer_id": "tj", "from": "a", "to": "b", "amount": 100, "currency": "EUR"}},
		{"transfer", map[string]any{"idempotency_key": "j", "transfer_id": "tj", "from": "a", "to": "b", "amount": 100, "currency": "EUR"}},
	}
	done := make(chan Reply, 1)
	go func() { done <- s.HandleBatch(context.Background(), batchBody(cmds), 0) }()
	devtest.Eventually(t, time.Minute, "d0 and e queued on a", func() bool { return s.pipes.inflightCount("account-a") == 2 })
	c.open()
	devtest.Eventually(t, time.Minute, "j waiting for e to be decided again", func() bool { return counterValue(t, s.metrics.refusalWaits) > 0 })
	c.let()
	r := awaitBatch(t, done)
	if got := r.Replies[0]; got.Status != domain.StatusApplied {
		t.Errorf("d0: %s %s, want applied", got.Status, got.Code)
	}
	if got := r.Replies[1]; got.Status != domain.StatusApplied {
		t.Errorf("e: %s %s %s, want applied", got.Status, got.Code, got.Message)
	}
	if got := r.Replies[2]; got.Status == domain.StatusApplied {
		t.Errorf("j: applied, want refused (tj is e's)")
	}
}
