package natsapi

import (
	"encoding/json"
	"testing"

	"github.com/google/uuid"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/app/reply"
)

// go test ./internal/natsapi -run '^$' -bench 'HotReply' -benchmem -count 5
func BenchmarkHotReplyEncode(b *testing.B) {
	r := reply.Reply{
		Status: domain.StatusApplied, Code: domain.CodeOK, IdempotencyKey: "k-123456", Duplicate: true,
		Events:   []domain.EventRef{{ID: uuid.MustParse("6ba7b810-9dad-51d1-80b4-00c04fd430c8"), Stream: "account-acc-42", Revision: 17, Type: domain.EvCredited}},
		Account:  &domain.AccountView{AccountID: "acc-42", Currency: "EUR", Balance: 125000, Available: 125000, Revision: 17},
		Position: "123456",
	}
	ways := []struct {
		name string
		enc  func(reply.Reply) ([]byte, error)
	}{{"marshal", func(r reply.Reply) ([]byte, error) { return json.Marshal(wire(r)) }}, {"direct", encodeReply}}
	for _, w := range ways {
		b.Run(w.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := w.enc(r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
