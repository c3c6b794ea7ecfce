package reply_test

import (
	"bytes"
	"encoding/json"
	"math/rand"
	"reflect"
	"slices"
	"testing"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/app/reply"
	"github.com/ledgerworks/ledger/internal/app/reply/replytest"
)

// TestAppendJSONMatchesMarshal: AppendJSON writes exactly what json.Marshal
// writes, over many replies of every shape, their strings hostile
// (replytest.Text: every escaping rule of encoding/json), appended after
// bytes already in the buffer.
func TestAppendJSONMatchesMarshal(t *testing.T) {
	rng := rand.New(rand.NewSource(23))
	for i := range 50000 {
		r := replytest.Reply(rng)
		if i%4 == 0 {
			r = replytest.BatchReply(rng)
		}
		got := reply.AppendJSON([]byte("x"), r)
		want, err := json.Marshal(r)
		if err != nil || !bytes.Equal(got[1:], want) || got[0] != 'x' {
			t.Fatalf("reply %d %+v:\n got %s\nwant %s (%v)", i, r, got, want, err)
		}
	}
}

// TestAppendJSONKnowsEveryField: AppendJSON is proven equal to json.Marshal
// over random replies of today's types. A field added to one of them would
// be missed silently where it is omitempty or zero in those replies: this
// test fails first.
func TestAppendJSONKnowsEveryField(t *testing.T) {
	for _, c := range []struct {
		typ    reflect.Type
		fields []string
	}{
		{reflect.TypeFor[reply.Reply](), []string{"Status", "Code", "Message", "IdempotencyKey", "Duplicate", "Fields", "Events", "Account", "Transfer", "Transaction", "Accounts", "Posting", "Moved", "Position", "Replies", "Index"}},
		{reflect.TypeFor[reply.TransferView](), []string{"TransferID", "Status"}},
		{reflect.TypeFor[reply.TransactionView](), []string{"TransactionID", "Status"}},
		{reflect.TypeFor[domain.EventRef](), []string{"ID", "Stream", "Revision", "Type"}},
		{reflect.TypeFor[domain.AccountView](), []string{"AccountID", "Currency", "Balance", "Held", "Available", "Revision"}},
	} {
		var got []string
		for f := range c.typ.Fields() {
			got = append(got, f.Name)
		}
		if !slices.Equal(got, c.fields) {
			t.Errorf("%s has fields %v; AppendJSON was written for %v: teach it the change", c.typ, got, c.fields)
		}
	}
}
