package client

import (
	"bytes"
	"encoding/json"
	"testing"
)

// TestBatchBodyIsMarshals: a batch body built from element's output is the
// very body json.Marshal made of the same elements (which compacts each), and
// an element carries its type first, then the body's members, compacted; a
// body that is not one JSON object is no element.
func TestBatchBodyIsMarshals(t *testing.T) {
	bodies := []string{
		`{"idempotency_key":"d1","account_id":"alice","amount":5,"currency":"EUR"}`,
		"{ \"idempotency_key\" : \"d2\",\n\t\"metadata\": {\"a\": [1, 2, {}]}, \"s\": \"x y\" }",
		`{}`,
		" {\n} ",
		`{"k":"<&>"}`,
	}
	want := []string{
		`{"type":"deposit","idempotency_key":"d1","account_id":"alice","amount":5,"currency":"EUR"}`,
		`{"type":"deposit","idempotency_key":"d2","metadata":{"a":[1,2,{}]},"s":"x y"}`,
		`{"type":"deposit"}`,
		"", // does not start with '{': judged alone
		`{"type":"deposit","k":"<&>"}`,
	}
	var elems []json.RawMessage
	for i, b := range bodies {
		e, ok := element("deposit", []byte(b))
		if string(e) != want[i] || ok != (want[i] != "") {
			t.Fatalf("element of %q: %q, %v; want %q", b, e, ok, want[i])
		}
		if ok && i < 4 { // json.Marshal escapes HTML; the ledger reads both alike
			elems = append(elems, e)
		}
	}
	got := batchBody(len(elems), func(i int) []byte { return elems[i] })
	marshalled, err := json.Marshal(batchRequest{Commands: elems})
	if err != nil || !bytes.Equal(got, marshalled) {
		t.Fatalf("batch body\n%s\nwant (json.Marshal, %v)\n%s", got, err, marshalled)
	}
	for _, bad := range []string{`{`, `{"a":}`, `{}x`, `{"a":1}{}`, `{"a":1`} {
		if e, ok := element("deposit", []byte(bad)); ok {
			t.Fatalf("element of %q: %q, ok", bad, e)
		}
	}
}
