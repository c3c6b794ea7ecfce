package natsapi

import (
	"reflect"
	"slices"
	"testing"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/app/reply"
)

// encodeReply is proven equal to json.Marshal(wire(r)) over random replies of
// today's types. A field added to one of them would be missed silently where it
// is omitempty or zero in those replies: this test fails first.
func TestEncodeReplyKnowsEveryField(t *testing.T) {
	for _, c := range []struct {
		typ    reflect.Type
		fields []string
	}{
		{reflect.TypeFor[WireReply](), []string{"Reply", "Stream", "Error"}},
		{reflect.TypeFor[WireError](), []string{"Code", "Description"}},
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
			t.Errorf("%s has fields %v; encodeReply was written for %v: teach it the change", c.typ, got, c.fields)
		}
	}
}
