package devtest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/migrations"
)

// AppendLegacyRefund appends to account id's stream in st a refund of amount
// of its deposit originalKey under key, with its key's claim, as a build
// before refunds had subjects wrote it: a Debited of reason refund whose
// metadata and row carry no subject (domain.EventSubject), chained to the
// stream's last event, with the balance and held sum it leaves.
func AppendLegacyRefund(t testing.TB, st eventstore.Store, id, key, originalKey string, amount int64) {
	t.Helper()
	appendRefund(t, st, id, key, originalKey, amount, "")
}

// AppendForgedRefund is AppendLegacyRefund with the refund's subject
// (domain.RefundSubject), as this build writes one: a refund decided by no
// ledger (no check of what is left of its original), found by the store's
// subject reads as the ledger's own are.
func AppendForgedRefund(t testing.TB, st eventstore.Store, id, key, originalKey string, amount int64) {
	t.Helper()
	appendRefund(t, st, id, key, originalKey, amount, domain.RefundSubject(originalKey))
}

// appendRefund is AppendLegacyRefund written with subject ("": none).
func appendRefund(t testing.TB, st eventstore.Store, id, key, originalKey string, amount int64, subject string) {
	t.Helper()
	a := Account(t, st, id)
	held := a.Held
	data, err := json.Marshal(domain.Debited{Amount: amount, Currency: a.Currency, Reason: domain.ReasonRefund, Ref: originalKey, BalanceAfter: a.Balance - amount, HeldAfter: &held})
	if err != nil {
		t.Fatal(err)
	}
	req := fmt.Appendf(nil, `{"type":"refund","idempotency_key":%q,"original_key":%q,"amount":%d}`, key, originalKey, amount)
	sum := sha256.Sum256(req)
	stream, rev := domain.AccountStream(id), uint64(a.Revision+1)
	m := domain.Metadata{Key: key, Command: string(domain.CmdRefund), RequestHash: hex.EncodeToString(sum[:]), Count: 1, At: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), Request: req, Schema: 1}
	claim, err := json.Marshal(domain.KeyClaimed{Key: key, Command: m.Command, RequestHash: m.RequestHash, Request: req, Stream: stream, Revision: &rev})
	if err != nil {
		t.Fatal(err)
	}
	appendChained(t, st, domain.KeyStream(key), eventstore.NoStream, "", domain.StoredEvent{Type: domain.EvKeyClaimed, Data: claim, Metadata: m})
	m.Subject = subject
	appendChained(t, st, stream, eventstore.Exact(uint64(a.Revision)), a.LastChain, domain.StoredEvent{Revision: rev, Type: domain.EvDebited, Data: data, Metadata: m})
}

// appendChained appends ev to stream, its ID derived from its key and its
// index in its command's write, and its chain hash linked to prev, with its
// metadata's subject; its chain hash.
func appendChained(t testing.TB, st eventstore.Store, stream string, expected eventstore.ExpectedRevision, prev string, ev domain.StoredEvent) string {
	t.Helper()
	ev.Stream, ev.ID = stream, domain.EventID(ev.Metadata.Key, stream, ev.Metadata.Index)
	ev.Metadata.Chain = domain.ChainHash(prev, ev)
	meta, err := domain.EncodeMetadata(ev.Metadata)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Append(context.Background(), stream, expected, []eventstore.EventData{{ID: ev.ID, Type: ev.Type, Data: ev.Data, Metadata: meta, Subject: ev.Metadata.Subject}}); err != nil {
		t.Fatal(err)
	}
	return ev.Metadata.Chain
}

// MigrateAgain rolls the database of pool back to version and applies the
// migrations after it again, as an upgrade from a build at version does.
func MigrateAgain(t testing.TB, pool *pgxpool.Pool, version int64) {
	t.Helper()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	p, err := migrations.NewProvider(db)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := p.DownTo(ctx, version); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatal(err)
	}
}
