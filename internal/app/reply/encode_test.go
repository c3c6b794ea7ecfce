package reply_test

import (
	"encoding/json"
	"fmt"
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
	replytest.MatchesMarshal(t, 23, 50000, func(r reply.Reply) ([]byte, error) {
		b := reply.AppendJSON([]byte("x"), r)
		if b[0] != 'x' {
			return nil, fmt.Errorf("the buffer's bytes overwritten: %q", b)
		}
		return b[1:], nil
	}, func(r reply.Reply) ([]byte, error) { return json.Marshal(r) })
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
