package audit

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/app/reply"
)

// BenchmarkRowDigests renders and hashes the rows the fold notes for one
// account event (a balance-history row, an entries row, a command's reply,
// a transfers row) and the rows' hashes the sets keep (rowHash): the
// per-event cost of the fold's row rendering, with its allocations.
//
//	go test ./internal/app/audit -run '^$' -bench RowDigests -benchmem -count 5
func BenchmarkRowDigests(b *testing.B) {
	at := time.Date(2026, 11, 27, 22, 46, 0, 123456789, time.UTC)
	id := uuid.MustParse("0193a1f2-7c4e-7d2a-9b1e-3f5a6c7d8e9f")
	h := historyFields[string]{account: "hist-acc-12345", rev: 42, id: id.String(), typ: "FundsDeposited", currency: "EUR",
		balance: 123456, held: 500, status: "open", at: at, effective: at}
	e := entryFields[string]{id: id.String(), account: "hist-acc-12345", rev: 42, typ: "credit", reason: "deposit", ref: "",
		amount: 1000, currency: "EUR", balance: 123456, key: "hist-key-98765", at: at, effective: at}
	r := reply.Reply{Status: domain.StatusApplied, IdempotencyKey: "hist-key-98765",
		Events: []domain.EventRef{{ID: id, Stream: "account-hist-acc-12345", Revision: 42, Type: "FundsDeposited"}}}
	b.ReportAllocs()
	for b.Loop() {
		hd, ed, rd := h.digest(), e.digest(), replyRow(r)
		tr := row("hist-t-1", "hist-acc-1", "hist-acc-2", int64(1000), "EUR", "completed", int64(0))
		_, _, _, _ = rowHash(e.key, hd[:]), rowHash(e.key, ed[:]), rowHash(e.key, rd[:]), rowHash(e.key, tr)
	}
}

// BenchmarkReplyRow renders and hashes a command's reply (replyRow) of one
// event, an account command's, and of five, the size of a transfer's or
// transaction's reply in the realistic history (512-1,135 bytes): each
// rendered in replyRow's buffer on the stack, without an allocation.
//
//	go test ./internal/app/audit -run '^$' -bench ReplyRow -benchmem -count 5
func BenchmarkReplyRow(b *testing.B) {
	id := uuid.MustParse("0193a1f2-7c4e-7d2a-9b1e-3f5a6c7d8e9f")
	for _, n := range []int{1, 5} {
		r := reply.Reply{Status: domain.StatusApplied, IdempotencyKey: "hist-key-98765"}
		for i := range n {
			r.Events = append(r.Events, domain.EventRef{ID: id, Stream: "transaction-hist-tx-1234567", Revision: uint64(i), Type: "TransactionLegPosted"})
		}
		var buf [2 * replyBytes]byte
		b.Run(fmt.Sprintf("events=%d,bytes=%d", n, len(reply.AppendJSON(buf[:0], r))), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = replyRow(r)
			}
		})
	}
}
