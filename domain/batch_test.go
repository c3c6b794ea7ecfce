package domain

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

const depositElement = `{"type":"deposit","idempotency_key":"d1","account_id":"alice","amount":5,"currency":"EUR"}`

// TestDecodeBatchRejectsWhole: a batch outside PROTOCOL.md v1.2 §2.2's limits,
// or with its key where it must not be (or without it where it must), is
// invalid as a whole, naming the field.
func TestDecodeBatchRejectsWhole(t *testing.T) {
	many := func(n int, el string) string { return `{"commands":[` + strings.Repeat(el+",", n-1) + el + `]}` }
	tx := func(n int) string {
		ps := strings.Repeat(`{"from":"a","to":"b","amount":1,"currency":"EUR"},`, n-1) + `{"from":"a","to":"b","amount":1,"currency":"EUR"}`
		return `{"type":"post_transaction","idempotency_key":"t","transaction_id":"t","postings":[` + ps + `]}`
	}
	bigElement := `{"type":"deposit","idempotency_key":"d1","account_id":"alice","amount":5,"currency":"EUR","metadata":{"a":"` + strings.Repeat("x", MaxBodyBytes) + `"}}`
	cases := []struct{ name, body, field string }{
		{"no commands", `{}`, "commands"},
		{"empty commands", `{"commands":[]}`, "commands"},
		{"commands not an array", `{"commands":{}}`, "commands"},
		{"over 1,000 commands", many(MaxBatchCommands+1, `{}`), "commands"},
		{"over 4,096 postings", many(MaxBatchPostings/64+1, tx(64)), "commands"},
		{"body over 512 KiB", many(MaxBatchCommands, `{"type":"deposit","idempotency_key":"`+strings.Repeat("k", 128)+`","account_id":"`+strings.Repeat("a", 64)+`","amount":5,"currency":"EUR","metadata":{"a":"`+strings.Repeat("x", 256)+`"}}`), "commands"},
		{"element over 64 KiB", `{"commands":[` + bigElement + `]}`, "commands"},
		{"key on a batch that is not atomic", `{"commands":[` + depositElement + `],"idempotency_key":"b"}`, "idempotency_key"},
		{"atomic without key", `{"commands":[` + depositElement + `],"atomic":true}`, "idempotency_key"},
		{"atomic with a bad key", `{"commands":[` + depositElement + `],"atomic":true,"idempotency_key":""}`, "idempotency_key"},
		{"atomic with an element under the batch's key", `{"commands":[` + depositElement + `],"atomic":true,"idempotency_key":"d1"}`, "commands"},
		{"atomic not a boolean", `{"commands":[` + depositElement + `],"atomic":"yes"}`, "atomic"},
		{"unknown field", `{"commands":[` + depositElement + `],"linger":1}`, "linger"},
		{"trailing byte", `{"commands":[` + depositElement + `]}x`, ""},
		{"not an object", `[` + depositElement + `]`, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := DecodeBatch([]byte(c.body))
			if err == nil {
				t.Fatalf("decoded without error")
			}
			if err.Field != c.field {
				t.Fatalf("field = %q, want %q (%s)", err.Field, c.field, err.Message)
			}
		})
	}
}

// TestDecodeBatchLimitsAreInclusive: exactly 1,000 commands and exactly 4,096
// postings decode.
func TestDecodeBatchLimitsAreInclusive(t *testing.T) {
	els := make([]string, MaxBatchCommands)
	for i := range els {
		els[i] = fmt.Sprintf(`{"type":"deposit","idempotency_key":"d%d","account_id":"a%d","amount":5,"currency":"EUR"}`, i, i)
	}
	b, err := DecodeBatch([]byte(`{"commands":[` + strings.Join(els, ",") + `]}`))
	if err != nil || len(b.Commands) != MaxBatchCommands || b.Atomic {
		t.Fatalf("1,000 commands: %v, %d decoded", err, len(b.Commands))
	}
	ps := strings.TrimSuffix(strings.Repeat(`{"from":"a","to":"b","amount":1,"currency":"EUR"},`, MaxPostings), ",")
	els = els[:MaxBatchPostings/MaxPostings]
	for i := range els {
		els[i] = fmt.Sprintf(`{"type":"post_transaction","idempotency_key":"t%d","transaction_id":"t%d","postings":[%s]}`, i, i, ps)
	}
	if _, err := DecodeBatch([]byte(`{"commands":[` + strings.Join(els, ",") + `],"atomic":true,"idempotency_key":"b"}`)); err != nil {
		t.Fatalf("4,096 postings: %v", err)
	}
}

// TestDecodeBatchElements: a malformed element is invalid alone (its field
// named), and a good one decodes to what its body decodes to sent alone.
func TestDecodeBatchElements(t *testing.T) {
	bad := []struct{ el, field string }{
		{`{"idempotency_key":"x","account_id":"a","amount":5,"currency":"EUR"}`, "type"},
		{`{"type":"batch","idempotency_key":"x"}`, "type"},
		{`{"type":"mint","idempotency_key":"x"}`, "type"},
		{`{"type":7,"idempotency_key":"x"}`, "type"},
		{`{"type":"deposit","idempotency_key":"x","account_id":"a","amount":5.5,"currency":"EUR"}`, "amount"},
		{`{"type":"deposit","idempotency_key":"x","account_id":"a","amount":5,"currency":"EUR","memo":"m"}`, "memo"},
		{`{"type":"deposit","type":"deposit","idempotency_key":"x","account_id":"a","amount":5,"currency":"EUR"}`, "type"},
		{`"deposit"`, ""},
	}
	good := []string{
		`{"type":"deposit","idempotency_key":"d1","account_id":"alice","amount":5,"currency":"EUR"}`,
		`{"idempotency_key":"d1","account_id":"alice","type":"withdraw","amount":5,"currency":"EUR","metadata":{"k":"v"}}`,
		`{"type":"transfer","idempotency_key":"t\u0031","transfer_id":"t1","from":"a","to":"b","amount":5,"currency":"EUR"}`,
		`{"type":"post_transaction","idempotency_key":"p1","transaction_id":"p1","postings":[{"from":"a","to":"b","amount":1,"currency":"EUR"}]}`,
		`{"type":"capture_hold","idempotency_key":"c1","account_id":"a","hold_id":"h","to":"b"}`,
	}
	els := []string{}
	for _, b := range bad {
		els = append(els, b.el)
	}
	els = append(els, good...)
	batch, err := DecodeBatch([]byte(`{"commands":[` + strings.Join(els, ",") + `], "atomic": false}`))
	if err != nil {
		t.Fatal(err)
	}
	for i, b := range bad {
		if inv := batch.Commands[i].Invalid; inv == nil || inv.Field != b.field {
			t.Errorf("element %s: invalid %v, want field %q", b.el, inv, b.field)
		}
	}
	for i, g := range good {
		el := batch.Commands[len(bad)+i]
		if el.Invalid != nil {
			t.Fatalf("element %s: %v", g, el.Invalid)
		}
		alone, ierr := DecodeCommand(el.Type, []byte(strings.Replace(strings.Replace(g, `"type":"`+string(el.Type)+`",`, "", 1), `,"type":"`+string(el.Type)+`"`, "", 1)))
		if ierr != nil {
			t.Fatalf("%s alone: %v", g, ierr)
		}
		if !reflect.DeepEqual(alone, el.Command) || alone.Canonical().Hash != el.Command.Canonical().Hash {
			t.Fatalf("%s: in a batch %+v, alone %+v", g, el.Command, alone)
		}
	}
	fast, ok := decodeElementFast([]byte(good[0]))
	if !ok || fast.Type != CmdDeposit || fast.IdempotencyKey != "d1" {
		t.Fatalf("the fast path did not take a flat element: %+v %v", fast, ok)
	}
}

// batchBodies are batch bodies the fast split takes and bodies it leaves to
// the general path, for TestSplitBatchFastIsTheGeneralPath and its fuzzing.
var batchBodies = []string{
	`{"commands":[` + depositElement + `]}`,
	" {\n \"commands\" : [ " + depositElement + " ,\t" + depositElement + " ] } \n",
	`{"commands":[{"type":"post_transaction","idempotency_key":"t","transaction_id":"t","postings":[{"from":"a","to":"b","amount":1,"currency":"EUR"}],"metadata":{"n":"} ] \" {"}}]}`,
	`{"commands":[{"type":"deposit","idempotency_key":"d\u00e9","account_id":"a\\\"b","amount":5,"currency":"EUR"},{}]}`,
	`{"commands":[{"type":"batch"},{"type":"deposit"}]}`,
	`{"commands":[]}`,
	`{"commands":[1,{}]}`,
	`{"commands":[{},[]]}`,
	`{"commands":{}}`,
	`{"commands":[{}],"atomic":false}`,
	`{"atomic":true,"idempotency_key":"b","commands":[` + depositElement + `]}`,
	`{"commands":[{}],"commands":[{}]}`,
	`{"comm\u0061nds":[{}]}`,
	`{"commands":[{}]}x`,
	`{"commands":[{}]`,
	`{"commands":[{"a":1 "b":2}]}`,
	`{"commands":null}`,
	`{}`,
	`[]`,
}

// TestSplitBatchFastIsTheGeneralPath: every body decodes to what the general
// path (encoding/json's decoder) makes of it, whichever path DecodeBatch
// takes; the fast split takes the plain bodies among them (the first five).
func TestSplitBatchFastIsTheGeneralPath(t *testing.T) {
	fast := 0
	for _, body := range batchBodies {
		if _, ok := splitBatchFast([]byte(body)); ok {
			fast++
		}
		checkBatchPaths(t, []byte(body))
	}
	if fast != 5 {
		t.Fatalf("the fast split took %d of the bodies, want the first 5", fast)
	}
}

func checkBatchPaths(t *testing.T, body []byte) {
	t.Helper()
	got, gerr := DecodeBatch(body)
	if len(body) > MaxBatchBodyBytes || !utf8.Valid(body) {
		return // refused before either path
	}
	want, werr := decodeBatchGeneral(body)
	if !reflect.DeepEqual(got, want) || !reflect.DeepEqual(gerr, werr) {
		t.Fatalf("%q decodes to\n%+v, %v\nthe general path to\n%+v, %v", body, got, gerr, want, werr)
	}
}

func FuzzSplitBatchFast(f *testing.F) {
	for _, body := range batchBodies {
		f.Add([]byte(body))
	}
	f.Fuzz(checkBatchPaths)
}
