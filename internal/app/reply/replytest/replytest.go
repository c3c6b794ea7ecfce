// Package replytest makes random replies of every shape, for the tests that
// compare an encoder of replies with encoding/json.
package replytest

import (
	"bytes"
	"math/rand"
	"testing"

	"github.com/google/uuid"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/app/reply"
)

// Text covers every escaping rule of encoding/json: quotes, backslashes,
// control characters, HTML characters, U+2028/U+2029, multi-byte runes and
// invalid UTF-8.
func Text(rng *rand.Rand) string {
	pieces := []string{"a", "Z", "0", "-", " ", "\"", "\\", "/", "<", ">", "&", "\n", "\r", "\t", "\b", "\f", "\x00", "\x1f", "\x7f",
		"é", "€", "\u2028", "\u2029", "😀", "\xff", "\xc3", "\xed\xa0\x80", "account-acc-42", "insufficient funds: 5 < 7"}
	var b []byte
	for range rng.Intn(6) {
		b = append(b, pieces[rng.Intn(len(pieces))]...)
	}
	return string(b)
}

// Reply is a random reply of any shape but a batch's, its strings Text.
func Reply(rng *rand.Rand) reply.Reply {
	statuses := []domain.Status{domain.StatusApplied, domain.StatusRejected, domain.StatusInvalid, domain.StatusError, domain.Status(Text(rng))}
	codes := []domain.Code{domain.CodeOK, domain.CodeInsufficientFunds, domain.CodeIdempotencyKeyConflict, domain.CodeInternalError, domain.Code(Text(rng))}
	r := reply.Reply{
		Status: statuses[rng.Intn(len(statuses))], Code: codes[rng.Intn(len(codes))], Message: Text(rng),
		IdempotencyKey: Text(rng), Duplicate: rng.Intn(2) == 0, Position: Text(rng),
	}
	switch rng.Intn(3) {
	case 0:
		r.Fields = []string{}
	case 1:
		for range 1 + rng.Intn(3) {
			r.Fields = append(r.Fields, Text(rng))
		}
	}
	if rng.Intn(5) > 0 {
		r.Events = []domain.EventRef{}
		for range rng.Intn(4) {
			var id uuid.UUID
			rng.Read(id[:])
			r.Events = append(r.Events, domain.EventRef{ID: id, Stream: Text(rng), Revision: rng.Uint64() >> uint(rng.Intn(64)), Type: Text(rng)})
		}
	}
	if rng.Intn(3) > 0 {
		r.Account = &domain.AccountView{AccountID: Text(rng), Currency: Text(rng), Balance: rng.Int63() - rng.Int63(), Held: rng.Int63n(1000),
			Available: rng.Int63() - rng.Int63(), Revision: rng.Uint64()}
	}
	if rng.Intn(3) == 0 {
		r.Transfer = &reply.TransferView{TransferID: Text(rng), Status: Text(rng)}
	}
	if rng.Intn(3) == 0 {
		r.Transaction = &reply.TransactionView{TransactionID: Text(rng), Status: Text(rng)}
		for range rng.Intn(3) {
			r.Accounts = append(r.Accounts, domain.AccountView{AccountID: Text(rng), Balance: rng.Int63() - rng.Int63(), Revision: rng.Uint64()})
		}
		if rng.Intn(2) == 0 {
			p := rng.Intn(64)
			r.Posting = &p
		}
	}
	if rng.Intn(3) == 0 { // v1.2 §2.3
		m := rng.Int63()
		r.Moved = &m
	}
	return r
}

// BatchReply is a batch's reply (v1.2 §2.2): random replies inside, an
// index now and then.
func BatchReply(rng *rand.Rand) reply.Reply {
	r := Reply(rng)
	for range 1 + rng.Intn(4) {
		r.Replies = append(r.Replies, Reply(rng))
	}
	if rng.Intn(2) == 0 {
		i := rng.Intn(1000)
		r.Index = &i
	}
	return r
}

// MatchesMarshal checks that encode writes what marshal writes over n random
// replies of every shape (every fourth a batch's) from seed, and fails t at
// the first that differs.
func MatchesMarshal(t testing.TB, seed int64, n int, encode func(reply.Reply) ([]byte, error), marshal func(reply.Reply) ([]byte, error)) {
	t.Helper()
	rng := rand.New(rand.NewSource(seed))
	for i := range n {
		r := Reply(rng)
		if i%4 == 0 {
			r = BatchReply(rng)
		}
		got, err := encode(r)
		want, werr := marshal(r)
		if err != nil || werr != nil || !bytes.Equal(got, want) {
			t.Fatalf("reply %d %+v:\n got %s (%v)\nwant %s (%v)", i, r, got, err, want, werr)
		}
	}
}
