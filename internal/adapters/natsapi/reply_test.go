package natsapi

import (
	"bytes"
	"encoding/json"
	"math/rand"
	"testing"

	"github.com/google/uuid"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/app/reply"
)

// randomText covers every escaping rule of encoding/json: quotes, backslashes,
// control characters, HTML characters, U+2028/U+2029, multi-byte runes and
// invalid UTF-8.
func randomText(rng *rand.Rand) string {
	pieces := []string{"a", "Z", "0", "-", " ", "\"", "\\", "/", "<", ">", "&", "\n", "\r", "\t", "\b", "\f", "\x00", "\x1f", "\x7f",
		"é", "€", "\u2028", "\u2029", "😀", "\xff", "\xc3", "\xed\xa0\x80", "account-acc-42", "insufficient funds: 5 < 7"}
	var b []byte
	for range rng.Intn(6) {
		b = append(b, pieces[rng.Intn(len(pieces))]...)
	}
	return string(b)
}

func randomReply(rng *rand.Rand) reply.Reply {
	statuses := []domain.Status{domain.StatusApplied, domain.StatusRejected, domain.StatusInvalid, domain.StatusError, domain.Status(randomText(rng))}
	codes := []domain.Code{domain.CodeOK, domain.CodeInsufficientFunds, domain.CodeIdempotencyKeyConflict, domain.CodeInternalError, domain.Code(randomText(rng))}
	r := reply.Reply{
		Status: statuses[rng.Intn(len(statuses))], Code: codes[rng.Intn(len(codes))], Message: randomText(rng),
		IdempotencyKey: randomText(rng), Duplicate: rng.Intn(2) == 0, Position: randomText(rng),
	}
	switch rng.Intn(3) {
	case 0:
		r.Fields = []string{}
	case 1:
		for range 1 + rng.Intn(3) {
			r.Fields = append(r.Fields, randomText(rng))
		}
	}
	if rng.Intn(5) > 0 {
		r.Events = []domain.EventRef{}
		for range rng.Intn(4) {
			var id uuid.UUID
			rng.Read(id[:])
			r.Events = append(r.Events, domain.EventRef{ID: id, Stream: randomText(rng), Revision: rng.Uint64() >> uint(rng.Intn(64)), Type: randomText(rng)})
		}
	}
	if rng.Intn(3) > 0 {
		r.Account = &domain.AccountView{AccountID: randomText(rng), Currency: randomText(rng), Balance: rng.Int63() - rng.Int63(), Held: rng.Int63n(1000),
			Available: rng.Int63() - rng.Int63(), Revision: rng.Uint64()}
	}
	if rng.Intn(3) == 0 {
		r.Transfer = &reply.TransferView{TransferID: randomText(rng), Status: randomText(rng)}
	}
	if rng.Intn(3) == 0 {
		r.Transaction = &reply.TransactionView{TransactionID: randomText(rng), Status: randomText(rng)}
		for range rng.Intn(3) {
			r.Accounts = append(r.Accounts, domain.AccountView{AccountID: randomText(rng), Balance: rng.Int63() - rng.Int63(), Revision: rng.Uint64()})
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

// randomBatchReply is a batch's reply (v1.2 §2.2): random replies inside, an
// index now and then.
func randomBatchReply(rng *rand.Rand) reply.Reply {
	r := randomReply(rng)
	for range 1 + rng.Intn(4) {
		r.Replies = append(r.Replies, randomReply(rng))
	}
	if rng.Intn(2) == 0 {
		i := rng.Intn(1000)
		r.Index = &i
	}
	return r
}

// TestEncodeReplyMatchesMarshal: the intake's reply encoder writes exactly what
// json.Marshal(wire(r)) writes, over many replies of every shape.
func TestEncodeReplyMatchesMarshal(t *testing.T) {
	rng := rand.New(rand.NewSource(9))
	for i := range 50000 {
		r := randomReply(rng)
		if i%4 == 0 {
			r = randomBatchReply(rng)
		}
		got, err := encodeReply(r)
		want, werr := json.Marshal(wire(r))
		if err != nil || werr != nil || !bytes.Equal(got, want) {
			t.Fatalf("reply %d %+v:\n got %s (%v)\nwant %s (%v)", i, r, got, err, want, werr)
		}
	}
}
