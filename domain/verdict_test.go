package domain

import (
	"reflect"
	"testing"
)

// TestJudgeBatch: an atomic batch whose canonical request matched its key's
// claim is a duplicate only with the elements' keys its decision recorded
// (Keys, in order); another key at any valid element, or a record that does
// not list every element, is a conflict naming commands. An invalid
// element is hashed as sent, its key with it, so its recorded key is not
// compared (a record may hold "" for it, where the key was not valid).
func TestJudgeBatch(t *testing.T) {
	batch := func(keys ...string) Batch {
		body := `{"atomic":true,"idempotency_key":"b","commands":[`
		for i, k := range keys {
			if i > 0 {
				body += ","
			}
			if k == "bad" {
				body += `{"type":"deposit","idempotency_key":"bad","account_id":"a","amount":0,"currency":"EUR"}`
				continue
			}
			body += `{"type":"deposit","idempotency_key":"` + k + `","account_id":"a","amount":5,"currency":"EUR"}`
		}
		b, err := DecodeBatch([]byte(body + `]}`))
		if err != nil {
			t.Fatal(err)
		}
		for i, k := range keys {
			if (k == "bad") != (b.Commands[i].Invalid != nil) {
				t.Fatalf("element %d (%s): invalid %v", i, k, b.Commands[i].Invalid)
			}
		}
		return b
	}
	conflict := Judgement{Verdict: KeyConflict, Fields: []string{"commands"}}
	for _, c := range []struct {
		name     string
		recorded []string
		b        Batch
		want     Judgement
	}{
		{"the same keys", []string{"d1", "d2"}, batch("d1", "d2"), Judgement{Verdict: KeyDuplicate}},
		{"one key changed", []string{"d1", "d2"}, batch("d1", "d3"), conflict},
		{"the keys swapped", []string{"d1", "d2"}, batch("d2", "d1"), conflict},
		{"an invalid element's key recorded as given", []string{"d1", "bad"}, batch("d1", "bad"), Judgement{Verdict: KeyDuplicate}},
		{"an invalid element's key recorded empty", []string{"d1", ""}, batch("d1", "bad"), Judgement{Verdict: KeyDuplicate}},
		{"a valid key changed beside an invalid element", []string{"d1", "bad"}, batch("d3", "bad"), conflict},
		{"a record without keys", nil, batch("d1"), conflict},
	} {
		if got := JudgeBatch(&BatchDecided{Keys: c.recorded}, c.b); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}
