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
	"github.com/ledgerworks/ledger/internal/app/ledger"
	"github.com/ledgerworks/ledger/internal/app/reply"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
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

// countedBatches counts the batches handed to its ledger, and heals the
// store once the first is answered.
type countedBatches struct {
	*ledger.Service
	store   *failingMulti
	batches atomic.Int32
}

func (c *countedBatches) HandleBatch(ctx context.Context, body []byte, maxReplyBytes int) reply.Reply {
	c.batches.Add(1)
	defer c.store.healed.Store(true)
	return c.Service.HandleBatch(ctx, body, maxReplyBytes)
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
	st := devtest.Memory(t)
	failing := &failingMulti{MultiAppender: st, key: "js-fail"}
	svc := ledger.New(struct {
		eventstore.Store
		eventstore.MultiAppender
	}{st, failing}, ledger.Options{Logger: slog.New(slog.DiscardHandler)})
	defer svc.Close()
	for _, id := range []string{"alice", "bob"} {
		if r := svc.HandleRaw(context.Background(), "open_account", []byte(`{"idempotency_key":"open-`+id+`","account_id":"`+id+`","currency":"EUR"}`)); r.Status != domain.StatusApplied {
			t.Fatalf("open %s: %+v", id, r)
		}
	}
	h := &countedBatches{Service: svc, store: failing}
	nc := startIntake(t, h, Options{Grace: -1, Lookup: svc, BackOff: []time.Duration{300 * time.Millisecond}, MaxDeliver: 5})
	batch := []byte(`{"commands":[
		{"type":"deposit","idempotency_key":"js-a","account_id":"alice","amount":1,"currency":"EUR"},
		{"type":"deposit","idempotency_key":"js-fail","account_id":"bob","amount":5,"currency":"EUR"},
		{"type":"deposit","idempotency_key":"js-c","account_id":"alice","amount":1,"currency":"EUR"}
	]}`)
	if err := nc.Publish(CommandSubject("batch"), batch); err != nil { // no reply subject: only the consumer handles it
		t.Fatal(err)
	}
	devtest.Eventually(t, time.Minute, "bob's deposit decided", func() bool {
		return devtest.Account(t, st, "bob").Balance == 5
	})
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
	if a := devtest.Account(t, st, "alice"); a.Balance != 2 {
		t.Fatalf("alice folds to %d, want 2: each deposit once", a.Balance)
	}
}
