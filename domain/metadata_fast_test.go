package domain

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
)

// checkMetadataFast: whatever metadataFast takes, encoding/json reads the same
// Metadata from; fastTook reports whether it took it.
func checkMetadataFast(t *testing.T, b []byte) (fastTook bool) {
	t.Helper()
	for _, request := range []bool{true, false} {
		fast, ok := metadataFast(b, request)
		if !ok {
			return false
		}
		var general Metadata
		if err := json.Unmarshal(b, &general); err != nil {
			t.Fatalf("%q: the fast path took what encoding/json refuses: %v", b, err)
		}
		if !request {
			general.Request = nil
		}
		if !reflect.DeepEqual(fast, general) {
			t.Fatalf("%q (request %v):\nfast    %+v\ngeneral %+v", b, request, fast, general)
		}
	}
	return true
}

// metadataSamples are metadata as the ledger writes them (json.Marshal of Metadata).
func metadataSamples(t testing.TB) [][]byte {
	at := time.Date(2026, 11, 27, 1, 2, 3, 456789000, time.UTC)
	eff := at.Add(-time.Hour).In(time.FixedZone("x", 3600))
	var out [][]byte
	for _, m := range []Metadata{
		{Key: "k-1", Command: "deposit", RequestHash: strings.Repeat("ab", 32), Count: 1, At: at, Request: []byte(`{"amount":5}`), Chain: "c0ffee", Schema: 2, Producer: "node-1", Subject: "hold-9"},
		{Key: "k-2:debit", Command: "transfer", Index: 3, Count: 4, At: at, Origin: "k-2", Claimed: true, EffectiveAt: &eff},
		{Key: "ключ", At: at},
		{},
	} {
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

// TestMetadataFastAgrees compares the fast path with encoding/json on the
// ledger's own metadata (which the fast path must take) and on mutations of it
// that it must leave to encoding/json or read as encoding/json does.
func TestMetadataFastAgrees(t *testing.T) {
	samples := metadataSamples(t)
	for _, b := range samples[:3] {
		if !checkMetadataFast(t, b) {
			t.Fatalf("the fast path did not take the ledger's own metadata %s", b)
		}
	}
	mutations := []func(string) string{
		func(s string) string { return strings.Replace(s, `"key"`, `"Key"`, 1) },                   // another case
		func(s string) string { return strings.Replace(s, `"key":`, `"key":"x","key":`, 1) },       // repeated
		func(s string) string { return strings.Replace(s, `"key":`, `"other":1,"key":`, 1) },       // unknown
		func(s string) string { return strings.Replace(s, `"k-`, `"k\u002d`, 1) },                  // escape
		func(s string) string { return strings.Replace(s, `"k-`, "\"\xff", 1) },                    // invalid UTF-8
		func(s string) string { return strings.Replace(s, `"n":1`, `"n":1.0`, 1) },                 // fraction
		func(s string) string { return strings.Replace(s, `"n":`, `"n":99999999999999999999`, 1) }, // overflow
		func(s string) string { return strings.Replace(s, `"i":3`, `"i":true`, 1) },                // boolean for an int
		func(s string) string { return strings.Replace(s, `"claimed":true`, `"claimed":1`, 1) },    // int for a boolean
		func(s string) string { return strings.Replace(s, `"claimed":true`, `"claimed":false`, 1) },
		func(s string) string { return strings.Replace(s, `"claimed":true`, `"claimed":null`, 1) },
		func(s string) string { return strings.Replace(s, `"at":"2026`, `"at":"26`, 1) },      // bad time
		func(s string) string { return strings.Replace(s, `"at":"2026`, `"at":" 2026`, 1) },   // loose time
		func(s string) string { return strings.Replace(s, `"request":"`, `"request":"!`, 1) }, // bad base64
		func(s string) string { return strings.Replace(s, `"chain":"c0ffee"`, `"chain":7`, 1) },
		func(s string) string { return strings.Replace(s, `,`, " ,\n\t", -1) },
		func(s string) string { return strings.Replace(s, `}`, `}x`, 1) },
		func(s string) string { return strings.Replace(s, `"effective_at":`, `"effective_at":null,"x":`, 1) },
	}
	for _, b := range samples {
		for _, mut := range mutations {
			checkMetadataFast(t, []byte(mut(string(b))))
		}
	}
}

func FuzzDecodeMetadata(f *testing.F) {
	for _, b := range metadataSamples(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		checkMetadataFast(t, b)
		fast, ferr := DecodeMetadata(b)
		var general Metadata
		gerr := json.Unmarshal(b, &general)
		if (ferr == nil) != (gerr == nil) || ferr == nil && !reflect.DeepEqual(fast, general) {
			t.Fatalf("%q: DecodeMetadata %+v, %v; encoding/json %+v, %v", b, fast, ferr, general, gerr)
		}
	})
}

// BenchmarkDecodeMetadata: the read side's decoding of an event's metadata
// (DecodeMetadataNoRequest) against encoding/json's of the same fields, in one
// run (BENCHMARKS.md).
func BenchmarkDecodeMetadata(b *testing.B) {
	m := metadataSamples(b)[1]
	b.Run("encoding-json", func(b *testing.B) {
		for range b.N {
			var general Metadata
			if err := json.Unmarshal(m, &general); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("fast", func(b *testing.B) {
		for range b.N {
			if _, err := DecodeMetadataNoRequest(m); err != nil {
				b.Fatal(err)
			}
		}
	})
}
