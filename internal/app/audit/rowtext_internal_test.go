package audit

import (
	"strconv"
	"testing"
	"time"
)

// rowText.str renders every string as strconv.Quote does, through its
// printable-ASCII path or through Quote: the edges of that path (a quote, a
// backslash, the first and last printable bytes and their neighbours, other
// scripts, bytes that are not UTF-8) included.
func TestRowTextStrQuotesAsStrconv(t *testing.T) {
	for _, s := range []string{"", "acc-1", "0193a1f2-7c4e-7d2a-9b1e-3f5a6c7d8e9f", " ~", `a"b`, `a\b`, "a\x1fb", "a\x7fb",
		"tab\there", "line\n", "café", "ключ", "\xff\xfe", "emoji \U0001F600", "\u00a0nbsp", "\u2028"} {
		var buf [rowTextBytes]byte
		if got, want := string(newRowText(&buf).str(s).b), strconv.Quote(s); got != want {
			t.Errorf("str(%q) = %s, want %s", s, got, want)
		}
	}
}

// A statement's and a balance-history row's second time (effective) is
// rendered as its own field is, whether it is the instant of the row's time
// (its text copied, rowText.atAgain) or not: each row's digest is the digest
// of its fields rendered one by one (row), for effective times equal to the
// time, equal in another zone or below a microsecond, and a microsecond, a
// second or a day apart.
func TestRowSecondTimeRenderedAsItsField(t *testing.T) {
	at := time.Date(2026, 11, 29, 16, 30, 27, 123456000, time.UTC)
	berlin := time.FixedZone("CET", 3600)
	for _, effective := range []time.Time{at, at.In(berlin), at.Add(999 * time.Nanosecond), at.Add(time.Microsecond),
		at.Add(-time.Second), at.Add(24 * time.Hour), at.Truncate(time.Second)} {
		h := historyFields[string]{account: "acc-1", rev: 3, id: "0193a1f2-7c4e-7d2a-9b1e-3f5a6c7d8e9f", typ: "FundsDeposited",
			currency: "EUR", balance: 1200, held: 100, status: "open", at: at, effective: effective}
		want := digestOf([]byte(row(h.account, h.rev, h.id, h.typ, h.currency, h.balance, h.held, h.status, h.at, h.effective)))
		if got := h.digest().String(); got != want {
			t.Errorf("balance history, effective %v: digest %s, its fields' %s", effective, got, want)
		}
		md := map[string]string{"order": "o-1"}
		e := entryFields[string]{id: h.id, account: "acc-1", rev: 3, typ: "FundsDeposited", reason: "deposit", ref: "r-1", amount: 1200,
			currency: "EUR", balance: 1200, key: "k-1", at: at, md: md, effective: effective}
		want = digestOf([]byte(row(e.id, e.account, e.rev, e.typ, e.reason, e.ref, e.amount, e.currency, e.balance, e.key, e.at,
			metadataJSON(md), e.effective)))
		if got := e.digest().String(); got != want {
			t.Errorf("entry, effective %v: digest %s, its fields' %s", effective, got, want)
		}
	}
}
