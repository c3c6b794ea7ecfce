package natsapi

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/app/reply"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// TestAtomicBatchThroughRequestReplyAndJetStream (PROTOCOL.md v1.2 §2.2): an
// atomic batch by request-reply applies all of it, or is refused as a whole
// and answers so again; ledger.v1.query.command on its key answers its
// reply; one published to LEDGER_COMMANDS is decided by the consumer and
// acknowledged (refused included, by a rejected or an invalid element: its
// refusal is recorded), none of them dead-lettered.
func TestAtomicBatchThroughRequestReplyAndJetStream(t *testing.T) {
	r := newRig(t)
	r.intake(Options{BackOff: []time.Duration{time.Second}})
	applied := []byte(`{"atomic":true,"idempotency_key":"b1","commands":[
		{"type":"open_account","idempotency_key":"o-a","account_id":"a","currency":"EUR"},
		{"type":"open_account","idempotency_key":"o-b","account_id":"b","currency":"EUR"},
		{"type":"deposit","idempotency_key":"d-a","account_id":"a","amount":100,"currency":"EUR"},
		{"type":"transfer","idempotency_key":"t-1","transfer_id":"t-1","from":"a","to":"b","amount":30,"currency":"EUR"}]}`)
	refused := []byte(`{"atomic":true,"idempotency_key":"b2","commands":[
		{"type":"deposit","idempotency_key":"d-b","account_id":"b","amount":5,"currency":"EUR"},
		{"type":"withdraw","idempotency_key":"w-a","account_id":"a","amount":500,"currency":"EUR"}]}`)
	if rep := r.request("batch", applied); rep.Status != domain.StatusApplied || len(rep.Replies) != 4 || rep.Replies[3].Transfer == nil {
		t.Fatalf("applied: %+v", rep)
	}
	for _, dup := range []bool{false, true} {
		rep := r.request("batch", refused)
		if rep.Status != domain.StatusRejected || rep.Code != domain.CodeInsufficientFunds || rep.Index == nil || *rep.Index != 1 || rep.Duplicate != dup ||
			rep.Replies[0].Code != domain.CodeLinkedEventFailed {
			t.Fatalf("refused (duplicate %v): %+v", dup, rep)
		}
	}
	invalid := []byte(`{"atomic":true,"idempotency_key":"b5","commands":[
		{"type":"deposit","idempotency_key":"d-b5","account_id":"b","amount":5,"currency":"EUR"},
		{"type":"deposit","idempotency_key":"x-b5","account_id":"a","amount":0,"currency":"EUR"}]}`)
	for _, dup := range []bool{false, true} {
		rep := r.request("batch", invalid)
		if rep.Status != domain.StatusInvalid || rep.Code != domain.CodeInvalidRequest || rep.Index == nil || *rep.Index != 1 || rep.Duplicate != dup {
			t.Fatalf("refused by an invalid element (duplicate %v): %+v", dup, rep)
		}
	}
	for key, code := range map[string]domain.Code{"b2": domain.CodeInsufficientFunds, "b5": domain.CodeInvalidRequest} {
		m, err := r.nc.Request(CommandQuerySubject, fmt.Appendf(nil, `{"idempotency_key":%q}`, key), 20*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var q reply.Reply
		if err := json.Unmarshal(m.Data, &q); err != nil || q.Code != code || q.Index == nil || *q.Index != 1 {
			t.Fatalf("query.command %s: %s (%v)", key, m.Data, err)
		}
	}

	ctx := context.Background()
	js, err := jetstream.New(r.nc)
	if err != nil {
		t.Fatal(err)
	}
	published := `{"atomic":true,"idempotency_key":"b3","commands":[
		{"type":"deposit","idempotency_key":"d-b2","account_id":"b","amount":7,"currency":"EUR"},
		{"type":"transfer","idempotency_key":"t-2","transfer_id":"t-2","from":"b","to":"a","amount":37,"currency":"EUR"}]}`
	for _, body := range []string{published, `{"atomic":true,"idempotency_key":"b4","commands":[{"type":"withdraw","idempotency_key":"w-b","account_id":"b","amount":1,"currency":"EUR"}]}`,
		`{"atomic":true,"idempotency_key":"b6","commands":[{"type":"deposit","idempotency_key":"x-b6","account_id":"b","amount":0,"currency":"EUR"}]}`} {
		if _, err := js.Publish(ctx, CommandSubject("batch"), []byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	cons, err := js.Consumer(ctx, StreamName, DefaultDurable)
	if err != nil {
		t.Fatal(err)
	}
	devtest.Eventually(t, 30*time.Second, "every stream message settled", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending == 0 && info.NumPending == 0
	})
	if a, b := devtest.Account(t, r.store, "a").Balance, devtest.Account(t, r.store, "b").Balance; a != 107 || b != 0 {
		t.Fatalf("balances a %d b %d, want 107 and 0 (b3 applied; b2, b4, b5, b6 refused)", a, b)
	}
	for key, status := range map[string]domain.Status{"b3": domain.StatusApplied, "b4": domain.StatusRejected, "b6": domain.StatusInvalid} {
		if rep, err := r.svc.Lookup(ctx, key); err != nil || rep == nil || rep.Status != status {
			t.Fatalf("%s: %v %+v", key, err, rep)
		}
	}
	dlq, err := js.Stream(ctx, DLQStreamName)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := dlq.Info(ctx); err != nil || info.State.Msgs != 0 {
		t.Fatalf("dead letters: %v %+v", err, info)
	}
}
