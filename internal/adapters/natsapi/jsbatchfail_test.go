package natsapi

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/eventstore/memory"
	"github.com/ledgerworks/ledger/internal/app/ledger"
	"github.com/ledgerworks/ledger/internal/app/reply"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/nats-io/nats.go"
)

// failingMulti fails every multi-stream append that writes key's claim,
// having written nothing, until healed; every other append passes.
type failingMulti struct {
	eventstore.MultiAppender
	key    string
	healed atomic.Bool
}

func (f *failingMulti) AppendMulti(ctx context.Context, parts []eventstore.StreamAppend) ([]eventstore.AppendResult, error) {
	for _, p := range parts {
		if p.Stream == domain.KeyStream(f.key) && !f.healed.Load() {
			return nil, errors.New("test: injected append failure")
		}
	}
	return f.MultiAppender.AppendMulti(ctx, parts)
}

// countedBatches counts the batches handed to its ledger, keeps the first
// reply, and heals the store once the first is answered.
type countedBatches struct {
	*ledger.Service
	store   *failingMulti
	batches atomic.Int32
	first   atomic.Pointer[reply.Reply]
}

func (c *countedBatches) HandleBatch(ctx context.Context, body []byte, maxReplyBytes int) reply.Reply {
	c.batches.Add(1)
	defer c.store.healed.Store(true)
	r := c.Service.HandleBatch(ctx, body, maxReplyBytes)
	c.first.CompareAndSwap(nil, &r)
	return r
}

// TestJetStreamBatchAckedOnlyWhenEveryElementDefinite (PROTOCOL.md §2.2): a
// batch published to LEDGER_COMMANDS whose element fails transiently (its
// append fails once, writing nothing) is not acknowledged: it is delivered
// again and then every element is decided, each once (the store fails the
// deposit's appends until the first delivery is answered). Batch [deposit 1 to
// alice, deposit 5 to bob (failing the first time), deposit 1 to alice]: the
// first delivery leaves bob's deposit error, the second applies it (alice's
// are duplicates then); alice folds to 2, bob to 5, and the batch was handled
// twice, no more. Acknowledged on the first delivery, bob's deposit would
// never be decided.
func TestJetStreamBatchAckedOnlyWhenEveryElementDefinite(t *testing.T) {
	st, h := jsFailingLedger(t, "js-fail", "alice", "bob")
	nc := publishBatch(t, h, `{"commands":[
		{"type":"deposit","idempotency_key":"js-a","account_id":"alice","amount":1,"currency":"EUR"},
		{"type":"deposit","idempotency_key":"js-fail","account_id":"bob","amount":5,"currency":"EUR"},
		{"type":"deposit","idempotency_key":"js-c","account_id":"alice","amount":1,"currency":"EUR"}
	]}`)
	devtest.Eventually(t, time.Minute, "bob's deposit decided", func() bool {
		return devtest.Account(t, st, "bob").Balance == 5
	})
	awaitSettledTwice(t, nc, h)
	if a := devtest.Account(t, st, "alice"); a.Balance != 2 {
		t.Fatalf("alice folds to %d, want 2: each deposit once", a.Balance)
	}
}

// TestJetStreamBatchElementAfterAnError (PROTOCOL.md §2.2): batch [deposit
// 100 to the empty account dave (failing the first time), withdraw 80 from
// dave]. On the first delivery the withdrawal comes after the failed
// deposit and answers error too, nothing written; the message is not
// acknowledged, and its redelivery applies both, each once: dave folds to
// 20. Before the rule the withdrawal was rejected (insufficient_funds) on
// the first delivery and that refusal answered the redelivery.
func TestJetStreamBatchElementAfterAnError(t *testing.T) {
	st, h := jsFailingLedger(t, "js-dep", "dave")
	nc := publishBatch(t, h, `{"commands":[
		{"type":"deposit","idempotency_key":"js-dep","account_id":"dave","amount":100,"currency":"EUR"},
		{"type":"withdraw","idempotency_key":"js-wd","account_id":"dave","amount":80,"currency":"EUR"}
	]}`)
	devtest.Eventually(t, time.Minute, "the batch handled twice", func() bool { return h.batches.Load() >= 2 })
	awaitSettledTwice(t, nc, h)
	for i, el := range h.first.Load().Replies {
		if el.Status != domain.StatusError {
			t.Errorf("first delivery, element %d: %s %s, want error", i, el.Status, el.Code)
		}
	}
	dave := devtest.Account(t, st, "dave")
	if dave.Balance != 20 {
		t.Fatalf("dave folds to %d, want 20: the deposit, then the withdrawal, each once", dave.Balance)
	}
}

// jsFailingLedger is a ledger over a memory store whose appends of failKey's
// claim fail until the first batch it handles is answered, with the
// accounts open.
func jsFailingLedger(t *testing.T, failKey string, accounts ...string) (*memory.Store, *countedBatches) {
	st := devtest.Memory(t)
	failing := &failingMulti{MultiAppender: st, key: failKey}
	svc := ledger.New(struct {
		eventstore.Store
		eventstore.MultiAppender
	}{st, failing}, ledger.Options{Logger: slog.New(slog.DiscardHandler)})
	t.Cleanup(svc.Close)
	for _, id := range accounts {
		if r := svc.HandleRaw(context.Background(), "open_account", []byte(`{"idempotency_key":"open-`+id+`","account_id":"`+id+`","currency":"EUR"}`)); r.Status != domain.StatusApplied {
			t.Fatalf("open %s: %+v", id, r)
		}
	}
	return st, &countedBatches{Service: svc, store: failing}
}

// publishBatch starts an intake for h (a back-off of 300 ms) and publishes
// body to the batch subject, with no reply subject: only the consumer
// handles it.
func publishBatch(t *testing.T, h *countedBatches, body string) *nats.Conn {
	nc := startIntake(t, h, Options{Grace: -1, Lookup: h.Service, BackOff: []time.Duration{300 * time.Millisecond}, MaxDeliver: 5})
	if err := nc.Publish(CommandSubject("batch"), []byte(body)); err != nil {
		t.Fatal(err)
	}
	return nc
}

// awaitSettledTwice waits until the consumer holds nothing pending, and
// fails t unless the batch was handled exactly twice: once failing, once
// with every element definite.
func awaitSettledTwice(t *testing.T, nc *nats.Conn, h *countedBatches) {
	t.Helper()
	ctx := context.Background()
	cons, err := jsOf(t, nc).Consumer(ctx, StreamName, DefaultDurable)
	if err != nil {
		t.Fatal(err)
	}
	devtest.Eventually(t, time.Minute, "the batch message settled", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending == 0 && info.NumPending == 0 && info.NumRedelivered == 0
	})
	if n := h.batches.Load(); n != 2 {
		t.Fatalf("the batch was handled %d times; want 2 (one failing element, then every element definite)", n)
	}
}
