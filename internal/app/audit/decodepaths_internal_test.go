package audit

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"testing"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/eventstore/memory"
	"github.com/ledgerworks/ledger/internal/app/ledger"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/projections"
)

// TestBrokenPayloadOnEveryDecodePath: an account's, a transfer's and a
// transaction's event whose data does not decode is named by the fold with
// the violation its stream names it (fold_failed of invariant 3 or 2,
// transaction_rewritten) and domain.DecodeEvent's error, whichever decoded
// it: the fold itself (Fold.Apply), the audit's page reader (decodeAll) or
// the rebuild's build, whose decode its check takes (builtMeta). The events
// after it still fold as they did (no other violation is named).
func TestBrokenPayloadOnEveryDecodePath(t *testing.T) {
	all := decodePathsLog(t)
	paths := map[string]func(re eventstore.RecordedEvent) meta{
		"fold":  func(re eventstore.RecordedEvent) meta { return decodeMeta(re) },
		"pages": decodeAll,
		"build": func(re eventstore.RecordedEvent) meta {
			evs, err := projections.DecodeAll([]eventstore.RecordedEvent{re})
			if err != nil {
				t.Fatal(err)
			}
			return builtMeta(evs[0])
		},
	}
	for _, c := range []struct {
		stream, typ string
		inv         int
		kind        string
	}{
		{"account-b", domain.EvCredited, InvBalance, "fold_failed"},
		{"transfer-t-1", domain.EvTransferRequested, InvConservation, "fold_failed"},
		{"transaction-tx-1", domain.EvTransactionPosted, InvStreams, "transaction_rewritten"},
	} {
		at := slices.IndexFunc(all, func(re eventstore.RecordedEvent) bool { return re.Stream == c.stream && re.Type == c.typ })
		if at < 0 {
			t.Fatalf("no %s in %s", c.typ, c.stream)
		}
		broken := slices.Clone(all)
		broken[at].Data = []byte(`{"amount":`)
		_, decodeErr := domain.DecodeEvent(broken[at].Type, broken[at].Data)
		want := Violation{Invariant: c.inv, Kind: c.kind, Stream: c.stream, Revision: int64(broken[at].Revision), EventID: broken[at].ID.String(), Message: fmt.Sprint(decodeErr)}
		for name, decode := range paths {
			f := NewFold()
			for _, re := range broken {
				f.apply(re, decode(re))
			}
			if len(f.Violations) != 1 || f.Violations[0] != want {
				t.Errorf("%s decoded by the %s: %+v, want %+v alone", c.typ, name, f.Violations, want)
			}
		}
	}
}

// decodePathsLog is a ledger's log with an account, a transfer and a
// transaction event (a transaction decided by its saga, through the memory
// store without atomic appends).
func decodePathsLog(t *testing.T) []eventstore.RecordedEvent {
	t.Helper()
	ctx := context.Background()
	st := memory.New()
	svc := ledger.New(devtest.WithoutMultiAppend(st), ledger.Options{Logger: slog.New(slog.DiscardHandler)})
	for _, c := range []struct{ typ, body string }{
		{"open_account", `{"idempotency_key":"o-a","account_id":"a","currency":"EUR"}`},
		{"open_account", `{"idempotency_key":"o-b","account_id":"b","currency":"EUR"}`},
		{"deposit", `{"idempotency_key":"d-a","account_id":"a","amount":100,"currency":"EUR"}`},
		{"transfer", `{"idempotency_key":"t-1","transfer_id":"t-1","from":"a","to":"b","amount":40,"currency":"EUR"}`},
		{"post_transaction", `{"idempotency_key":"tx-1","transaction_id":"tx-1","postings":[{"from":"a","to":"b","amount":10,"currency":"EUR"}]}`},
	} {
		if r := svc.HandleRaw(ctx, c.typ, []byte(c.body)); r.Status != "applied" {
			t.Fatalf("%s: %+v", c.body, r)
		}
	}
	all, err := st.ReadAll(ctx, eventstore.Start, 0)
	if err != nil {
		t.Fatal(err)
	}
	return all
}
