package client_test

import (
	"encoding"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/client"
	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/adapters/natsapi"
	"github.com/ledgerworks/ledger/internal/app/query"
	"github.com/ledgerworks/ledger/internal/app/reply"
)

// The wire shapes have one home on each side: the server's types
// (internal/app/reply, internal/app/query, the domain's decoder) and this
// package's exported ones, which a Go caller compiles against. These tests
// hold the two to the same JSON, field by field, so neither drifts.

// pending23 are the fields of PROTOCOL.md §2.3 that the client carries before
// the ledger serves them: none now (issue 25). A field added here must match
// like any other once the server has it.
var pending23 []string

// shape is a JSON shape: a field name (with its path) -> its JSON kind.
func shape(t reflect.Type) map[string]string {
	out := map[string]string{}
	walk(t, "", out, 0)
	return out
}

var textMarshaler = reflect.TypeFor[encoding.TextMarshaler]()

func kind(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == reflect.TypeFor[time.Time](), t.Implements(textMarshaler), reflect.PointerTo(t).Implements(textMarshaler):
		return "string"
	}
	switch t.Kind() {
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "bool"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64, reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "number"
	case reflect.Slice, reflect.Array:
		return "array of " + kind(t.Elem())
	case reflect.Map:
		return "object of " + kind(t.Elem())
	case reflect.Struct:
		return "object"
	}
	return t.Kind().String()
}

func walk(t reflect.Type, path string, out map[string]string, depth int) {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || kind(t) != "object" || depth > 4 {
		return
	}
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		if f.Anonymous {
			walk(f.Type, path, out, depth)
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[path+name] = kind(f.Type)
		walk(f.Type, path+name+".", out, depth+1)
	}
}

// sameShape fails t where server and client differ (shapeDiff).
func sameShape(t *testing.T, what string, server, cl any, serverOnly ...string) {
	t.Helper()
	for _, d := range shapeDiff(server, cl, serverOnly...) {
		t.Errorf("%s: %s", what, d)
	}
}

// shapeDiff lists where the JSON shapes of server and client differ, but for
// the client's fields of §2.3 the server does not have yet and the server's
// fields listed in serverOnly (with what they hold).
func shapeDiff(server, cl any, serverOnly ...string) []string {
	s, c := shape(reflect.TypeOf(server)), shape(reflect.TypeOf(cl))
	var out []string
	only := func(name string) bool {
		for _, o := range serverOnly {
			if name == o || strings.HasPrefix(name, o+".") {
				return true
			}
		}
		return false
	}
	for name, k := range s {
		if !only(name) && c[name] != k {
			out = append(out, fmt.Sprintf("the server's %s is %s, the client's %q", name, k, c[name]))
		}
	}
	for name, k := range c {
		leaf := name[strings.LastIndex(name, ".")+1:]
		if _, ok := s[name]; !ok && !slices.Contains(pending23, leaf) {
			out = append(out, fmt.Sprintf("the client has %s (%s), the server has not", name, k))
		}
	}
	sort.Strings(out)
	return out
}

// The types the client aliases (its codes and statuses, Account, and the
// answers of the account, entries, balances and transfer queries) are the
// server's, so the compiler holds them; the others are held here.
func TestWireShapesMatchTheServers(t *testing.T) {
	// The server answers a batch with its reply type too (replies, index): the
	// client's home for those is BatchReply, held below.
	sameShape(t, "command reply", reply.Reply{}, client.Reply{}, "replies", "index")
	batchFields := []string{"status", "code", "message", "idempotency_key", "duplicate", "fields", "index", "replies"}
	var notBatch []string
	for name := range shape(reflect.TypeFor[reply.Reply]()) {
		if !strings.Contains(name, ".") && !slices.Contains(batchFields, name) {
			notBatch = append(notBatch, name)
		}
	}
	// A batch's replies are command replies, which hold no batch of their own.
	sameShape(t, "batch reply", reply.Reply{}, client.BatchReply{}, append(notBatch, "replies.replies", "replies.index")...)
	sameShape(t, "query error", reply.QueryError{}, client.QueryError{})
	sameShape(t, "transaction detail", reply.TransactionDetail{}, client.TransactionDetail{})
	sameShape(t, "balance", query.Balance{}, client.Balance{})
	sameShape(t, "account query", query.AccountRequest{}, client.AccountQuery{})
	sameShape(t, "entries query", query.EntriesRequest{}, client.EntriesQuery{})
	sameShape(t, "balance query", query.BalanceRequest{}, client.BalanceQuery{})
	sameShape(t, "balances query", query.BalancesRequest{}, client.BalancesQuery{})
	sameShape(t, "transfer query", query.TransferRequest{}, client.TransferQuery{})
	// The intake answers commands with the reply plus the fields that make it
	// a JetStream acknowledgement (natsapi.WireReply): the client reads past them.
	sameShape(t, "wire reply", natsapi.WireReply{}, client.Reply{}, "stream", "error", "replies", "index")
}

// The checker fails on shapes that differ: a renamed field, a field of another
// kind, a field one side lacks.
func TestSameShapeFailsOnADifference(t *testing.T) {
	type server struct {
		A string `json:"a"`
		B int64  `json:"b"`
		C []struct {
			D string `json:"d"`
		} `json:"c"`
	}
	type renamed struct {
		A string `json:"a_"`
		B int64  `json:"b"`
		C []struct {
			D string `json:"d"`
		} `json:"c"`
	}
	type kinded struct {
		A string `json:"a"`
		B string `json:"b"`
		C []struct {
			D string `json:"d"`
		} `json:"c"`
	}
	type nested struct {
		A string `json:"a"`
		B int64  `json:"b"`
		C []struct {
			D int `json:"d"`
		} `json:"c"`
	}
	for name, cl := range map[string]any{"renamed": renamed{}, "kind": kinded{}, "nested": nested{}} {
		if d := shapeDiff(server{}, cl); len(d) == 0 {
			t.Errorf("%s: shapeDiff found no difference", name)
		}
	}
	if d := shapeDiff(server{}, server{}); len(d) != 0 {
		t.Errorf("shapeDiff of a shape with itself: %v", d)
	}
}

// Every client command has a struct whose JSON fields are the decoder's, and
// every command type the ledger takes from a client has its struct.
func TestCommandStructsMatchTheDecoder(t *testing.T) {
	structs := map[domain.CommandType]any{
		domain.CmdOpenAccount: client.OpenAccount{}, domain.CmdDeposit: client.Deposit{}, domain.CmdWithdraw: client.Withdraw{},
		domain.CmdTransfer: client.Transfer{}, domain.CmdPlaceHold: client.PlaceHold{}, domain.CmdCaptureHold: client.CaptureHold{},
		domain.CmdReleaseHold: client.ReleaseHold{}, domain.CmdRefund: client.Refund{}, domain.CmdCloseAccount: client.CloseAccount{},
		domain.CmdPostTransaction: client.PostTransaction{},
	}
	for _, typ := range domain.ClientCommandTypes {
		s, ok := structs[typ]
		if !ok {
			t.Errorf("no client struct for %s", typ)
			continue
		}
		want := append([]string{"idempotency_key"}, domain.CommandFieldNames(typ)...)
		var got []string
		for name := range shape(reflect.TypeOf(s)) {
			if !strings.Contains(name, ".") {
				got = append(got, name)
			}
		}
		sort.Strings(got)
		sort.Strings(want)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: the client's fields %v, the decoder's %v", typ, got, want)
		}
	}
	sameShape(t, "posting", domain.Posting{}, client.Posting{})
}
