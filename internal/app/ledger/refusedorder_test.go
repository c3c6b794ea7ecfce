package ledger

import (
	"context"
	"log/slog"
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

// heldWarning is a log handler that holds every record naming key (its
// "key" attribute: the warning of its failure) until release is closed.
type heldWarning struct {
	slog.Handler
	key     string
	release chan struct{}
}

func (*heldWarning) Enabled(context.Context, slog.Level) bool { return true }

func (h *heldWarning) Handle(ctx context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "key" && a.Value.String() == h.key {
			<-h.release
		}
		return true
	})
	return h.Handler.Handle(ctx, r)
}

// TestBatchRefusedWriteIsNotOvertaken: a batch's element whose write was
// refused (decided on a commit that failed) is decided again before any
// later element of its batch on the same account is decided, however long
// its re-decision waits, as if the batch were sent one command after
// another. Batch [d0 deposit a (its commit held, then failing; its answer
// then held: the warning it logs), w1 withdraw 100 from a (150; refused with
// d0's chain, then waiting, its locks released, for d0 to finish: afterEarlier),
// x deposit b (b's read held until d0 and w1 are refused and a's pipeline
// drained), j transfer 100 a->b]. j comes to a with w1 still to be decided
// again: the test lets d0 answer only once j was decided (tj written) or
// waited for the refusal (ledger_batch_refusal_waits_total). Sequentially w1
// applies (150 -> 50) and j is refused (insufficient_funds). Without the
// wait (refusedBefore answering nil) j reloaded a from the store, was decided
// first and applied, and w1 was refused: so it failed before that rule.
// (6b8226c's version waited for w1 to be written before j could start, and
// could no longer fail on the overtake.)
func TestBatchRefusedWriteIsNotOvertaken(t *testing.T) {
	st := devtest.Memory(t)
	bRead := &heldReads{Store: st, stream: domain.AccountStream("b"), release: make(chan struct{})}
	warning := &heldWarning{Handler: slog.DiscardHandler, key: "d0", release: make(chan struct{})}
	s, failing := refusalService(t, st, bRead, slog.New(warning))
	var once [2]sync.Once
	let := func(i int, ch chan struct{}) { once[i].Do(func() { close(ch) }) }
	defer let(0, bRead.release)
	defer let(1, warning.release)
	cmds := []batchCmd{
		{"deposit", map[string]any{"idempotency_key": "d0", "account_id": "a", "amount": 1, "currency": "EUR"}},
		{"withdraw", map[string]any{"idempotency_key": "w1", "account_id": "a", "amount": 100, "currency": "EUR"}},
		{"deposit", map[string]any{"idempotency_key": "x", "account_id": "b", "amount": 1, "currency": "EUR"}},
		{"transfer", map[string]any{"idempotency_key": "j", "transfer_id": "tj", "from": "a", "to": "b", "amount": 100, "currency": "EUR"}},
	}
	done := make(chan Reply, 1)
	go func() { done <- s.HandleBatch(context.Background(), batchBody(cmds), 0) }()
	devtest.Eventually(t, time.Minute, "d0 and w1 queued on a", func() bool { return s.pipes.inflightCount("account-a") == 2 })
	failing.open()
	devtest.Eventually(t, time.Minute, "d0 and w1 refused", func() bool { return s.pipes.inflightCount("account-a") == 0 })
	let(0, bRead.release)
	devtest.Eventually(t, time.Minute, "j decided, or waiting for w1", func() bool {
		evs, _ := st.ReadStream(context.Background(), domain.TransferStream("tj"), 0, eventstore.Forwards, 1)
		return len(evs) > 0 || counterValue(t, s.metrics.refusalWaits) > 0
	})
	let(1, warning.release)
	checkReplies(t, awaitBatch(t, done), cmds, []wantReply{
		{domain.StatusError, ""}, {domain.StatusApplied, ""}, {domain.StatusApplied, ""}, {domain.StatusRejected, domain.CodeInsufficientFunds}})
}

// refusalService is a service over st (reads: st's reads, or a wrapper of
// them) with Committers 1, logging to log, on a book of a (150 EUR) and b
// (open), whose append of d0's key waits for failing.open, then fails.
func refusalService(t *testing.T, st interface {
	eventstore.Store
	eventstore.MultiAppender
}, reads eventstore.Store, log *slog.Logger) (*Service, *failingKeyMulti) {
	s := newService(st)
	mustApply(t, s, "open_account", `{"idempotency_key":"oa","account_id":"a","currency":"EUR"}`)
	mustApply(t, s, "deposit", `{"idempotency_key":"da","account_id":"a","amount":150,"currency":"EUR"}`)
	mustApply(t, s, "open_account", `{"idempotency_key":"ob","account_id":"b","currency":"EUR"}`)
	s.Close()
	failing := &failingKeyMulti{MultiAppender: st, key: "d0", release: make(chan struct{})}
	s = New(struct {
		eventstore.Store
		eventstore.MultiAppender
	}{reads, failing}, Options{Clock: clock, Logger: log, Batch: BatchOptions{Committers: 1}})
	t.Cleanup(s.Close)
	t.Cleanup(failing.open) // when the test fails before it opens it (cleanups run last first)
	return s, failing
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
