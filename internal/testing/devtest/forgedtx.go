package devtest

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
)

// AppendForgedTransactionRefund appends to st a refund under key of the
// posted transaction originalTx (its client's key originalKey) in refund slot
// slot, moving postings, as no ledger decides it (no check of what is left of
// its original): the key's claim, the slot's TransactionPosted and every
// account's legs, decided by domain.DecideTransaction on the accounts as
// they are, chained and written one stream at a time.
func AppendForgedTransactionRefund(t testing.TB, st eventstore.Store, key, originalKey, originalTx string, slot int, postings []domain.Posting) {
	t.Helper()
	slotStream := domain.TransactionStream(domain.RefundTransactionID(originalTx, slot))
	AppendForgedTransactionRefundClaimed(t, st, key, originalKey, originalTx, slot, slotStream, postings)
}

// AppendForgedTransactionRefundClaimed is AppendForgedTransactionRefund with
// the key's claim naming claimed, which may be another stream than the slot
// the refund is written in; "": no claim is written (a key claimed before).
func AppendForgedTransactionRefundClaimed(t testing.TB, st eventstore.Store, key, originalKey, originalTx string, slot int, claimed string, postings []domain.Posting) {
	t.Helper()
	appendForgedTransactionRefund(t, st, key, originalKey, originalTx, slot, claimed, new(uint64), postings)
}

// AppendForgedTransactionRefundEarlierClaim is
// AppendForgedTransactionRefundClaimed with the claim as a build before
// claims gave their decision's revision wrote it: no revision, so that an
// incremental audit cannot read the decision it claims.
func AppendForgedTransactionRefundEarlierClaim(t testing.TB, st eventstore.Store, key, originalKey, originalTx string, slot int, claimed string, postings []domain.Posting) {
	t.Helper()
	appendForgedTransactionRefund(t, st, key, originalKey, originalTx, slot, claimed, nil, postings)
}

// appendForgedTransactionRefund is AppendForgedTransactionRefundClaimed with
// the claim's revision (nil: none).
func appendForgedTransactionRefund(t testing.TB, st eventstore.Store, key, originalKey, originalTx string, slot int, claimed string, revision *uint64, postings []domain.Posting) {
	t.Helper()
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	refund := domain.Command{Type: domain.CmdRefund, IdempotencyKey: key, OriginalKey: originalKey, At: at}
	if len(postings) == 1 {
		refund.HasAmount, refund.Amount = true, postings[0].Amount
	}
	tx := refund
	tx.TransactionID, tx.Postings = domain.RefundTransactionID(originalTx, slot), postings
	accounts := map[string]*domain.Account{}
	for _, id := range domain.TransactionAccounts(postings) {
		accounts[id] = Account(t, st, id)
	}
	d := domain.DecideTransaction(accounts, tx)
	if d.Invalid != nil || d.Rejection != nil {
		t.Fatalf("forged refund %s: %v %v", tx.TransactionID, d.Invalid, d.Rejection)
	}
	txStream, req := domain.TransactionStream(tx.TransactionID), refund.Canonical()
	m := domain.Metadata{Key: key, Command: string(domain.CmdRefund), RequestHash: req.Hash, Count: 1, At: at, Schema: 1}
	if claimed != "" {
		c := domain.KeyClaimed{Key: key, Command: m.Command, RequestHash: req.Hash, Request: req.JSON, Stream: claimed, Revision: revision}
		appendChained(t, st, domain.KeyStream(key), eventstore.NoStream, "", domain.StoredEvent{Type: domain.EvKeyClaimed, Data: mustJSON(t, c), Metadata: m})
	}
	m.Request = req.JSON
	appendChained(t, st, txStream, eventstore.NoStream, "", domain.StoredEvent{Type: d.Event.Type, Data: mustJSON(t, d.Event.Data), Metadata: m})
	for _, id := range domain.TransactionAccounts(postings) {
		appendLegs(t, st, accounts[id], domain.TransactionLegCommand(tx, id), d.Legs[id])
	}
}

// appendLegs appends a transaction's legs on account a under cmd (its leg
// command), after a's last event.
func appendLegs(t testing.TB, st eventstore.Store, a *domain.Account, cmd domain.Command, legs []domain.NewEvent) {
	t.Helper()
	req, prev := cmd.Canonical(), a.LastChain
	for j, ev := range legs {
		m := domain.Metadata{Key: cmd.IdempotencyKey, Command: string(cmd.Type), RequestHash: req.Hash, Index: j, Count: len(legs), At: cmd.At, Origin: cmd.Origin, Schema: 1, Subject: domain.EventSubject(ev)}
		if j == 0 {
			m.Request = req.JSON
		}
		rev := uint64(a.Revision + 1 + int64(j))
		prev = appendChained(t, st, domain.AccountStream(a.ID), eventstore.Exact(rev-1), prev, domain.StoredEvent{Revision: rev, Type: ev.Type, Data: mustJSON(t, ev.Data), Metadata: m})
	}
}

// mustJSON is v encoded, or the test's end.
func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
