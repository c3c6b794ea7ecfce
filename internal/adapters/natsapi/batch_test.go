package natsapi

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// TestBatchThroughRequestReplyAndJetStream (PROTOCOL.md v1.2 §2.2): a batch
// by request-reply gets one reply per command, in order; the body with
// a byte after its object is invalid alone and in a batch; a batch published
// to LEDGER_COMMANDS is decided and acknowledged once every command has its
// answer; one that can never be decoded goes to the DLQ, deciding nothing.
func TestBatchThroughRequestReplyAndJetStream(t *testing.T) {
	r := newRig(t)
	// The default grace: request-reply decides its batch before the consumer
	// meets the stream's copy of it (and confirms it from the records).
	r.intake(Options{BackOff: []time.Duration{time.Second}})
	batch := []byte(`{"commands":[
		{"type":"open_account","idempotency_key":"o-alice","account_id":"alice","currency":"EUR"},
		{"type":"deposit","idempotency_key":"d1","account_id":"alice","amount":5,"currency":"EUR"},
		{"type":"withdraw","idempotency_key":"w1","account_id":"alice","amount":50,"currency":"EUR"},
		{"type":"deposit","idempotency_key":"d1","account_id":"alice","amount":5,"currency":"EUR"},
		{"type":"deposit","idempotency_key":"d-bad","account_id":"alice","amount":0,"currency":"EUR"}
	]}`)
	rep := r.request("batch", batch)
	if rep.Status != domain.StatusApplied || rep.Code != domain.CodeOK || len(rep.Replies) != 5 {
		t.Fatalf("batch: %+v", rep)
	}
	want := []struct {
		status    domain.Status
		code      domain.Code
		duplicate bool
	}{
		{domain.StatusApplied, domain.CodeOK, false}, {domain.StatusApplied, domain.CodeOK, false},
		{domain.StatusRejected, domain.CodeInsufficientFunds, false}, {domain.StatusApplied, domain.CodeOK, true},
		{domain.StatusInvalid, domain.CodeInvalidRequest, false},
	}
	for i, w := range want {
		if got := rep.Replies[i]; got.Status != w.status || got.Code != w.code || got.Duplicate != w.duplicate {
			t.Errorf("element %d: %+v, want %v %v duplicate %v", i, got, w.status, w.code, w.duplicate)
		}
	}
	if a := rep.Replies[3].Account; a == nil || a.Balance != 5 {
		t.Errorf("the resent deposit: %+v", rep.Replies[3])
	}
	// Strict decoding (issue 24's example): applied before, invalid now.
	if rep := r.request("deposit", []byte(`{"idempotency_key":"d2","account_id":"alice","amount":5,"currency":"EUR"}x`)); rep.Status != domain.StatusInvalid || rep.Code != domain.CodeInvalidRequest {
		t.Fatalf("a byte after the object: %+v", rep)
	}
	if rep := r.request("batch", append(batch, 'x')); rep.Status != domain.StatusInvalid || len(rep.Replies) != 0 {
		t.Fatalf("a batch with a byte after the object: %+v", rep)
	}

	// Through JetStream: published, decided by the consumer, acknowledged.
	ctx := context.Background()
	js, err := jetstream.New(r.nc)
	if err != nil {
		t.Fatal(err)
	}
	var els string
	for i := range 20 {
		if i > 0 {
			els += ","
		}
		els += fmt.Sprintf(`{"type":"deposit","idempotency_key":"js-%d","account_id":"alice","amount":1,"currency":"EUR"}`, i)
	}
	if _, err := js.PublishAsync(CommandSubject("batch"), []byte(`{"commands":[`+els+`]}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := js.PublishAsync(CommandSubject("batch"), []byte(`{"commands":[`+els+`],"idempotency_key":"not-atomic"}`)); err != nil {
		t.Fatal(err)
	}
	devtest.Eventually(t, 30*time.Second, "the published batch decided", func() bool {
		return devtest.Account(t, r.store, "alice").Balance == 5+20
	})
	cons, err := js.Consumer(ctx, StreamName, DefaultDurable)
	if err != nil {
		t.Fatal(err)
	}
	devtest.Eventually(t, 30*time.Second, "every stream message settled", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending == 0 && info.NumPending == 0
	})
	dlq, err := js.Stream(ctx, DLQStreamName)
	if err != nil {
		t.Fatal(err)
	}
	// Dead letters: the invalid single deposit, the batch with a byte after
	// it, and the published batch with a key but not atomic.
	devtest.Eventually(t, 30*time.Second, "the undecodable batches dead-lettered", func() bool {
		info, err := dlq.Info(ctx)
		return err == nil && info.State.Msgs == 3
	})
	if got := devtest.Account(t, r.store, "alice").Balance; got != 25 {
		t.Fatalf("balance %d after everything settled, want 25", got)
	}
}
