package domain

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

// checkClaimFast: DecodeKeyClaimed reads what encoding/json reads, and refuses
// what it refuses; it returns whether the fast path took the body.
func checkClaimFast(t *testing.T, b []byte) (fastTook bool) {
	t.Helper()
	var general KeyClaimed
	generalErr := json.Unmarshal(b, &general)
	got, err := DecodeKeyClaimed(b)
	if (err != nil) != (generalErr != nil) {
		t.Fatalf("%q: DecodeKeyClaimed's error %v, encoding/json's %v", b, err, generalErr)
	}
	if err == nil && !reflect.DeepEqual(*got, general) {
		t.Fatalf("%q:\ndecoded %+v\ngeneral %+v", b, *got, general)
	}
	return claimFast(b, new(claimed))
}

// claimSamples are claims as the ledger writes them (json.Marshal of KeyClaimed).
func claimSamples(t testing.TB) [][]byte {
	rev := uint64(41)
	var out [][]byte
	for _, c := range []KeyClaimed{
		{Key: "k-1", Command: "deposit", RequestHash: strings.Repeat("ab", 32), Request: json.RawMessage(`{"type":"deposit","account_id":"a-1","amount":5,"metadata":{"x":"}{\"]"}}`), Stream: "account-a-1", Revision: &rev},
		{Key: "ключ", Command: "transfer", RequestHash: "00", Request: json.RawMessage(`{"legs":[{"a":1},{"b":[2,3]}]}`), Stream: "transfer-t"},
		{Key: "k-2", Command: "deposit", RequestHash: "01", Request: json.RawMessage(`{"account_id":"a-1","amount":5,"currency":"EUR","flag":true,"type":"deposit"}`), Stream: "account-a-1", Revision: &rev}, // a flat request (flatObject)
	} {
		b, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

// TestKeyClaimedFastAgrees compares DecodeKeyClaimed with encoding/json on the
// ledger's own claims (which the fast path must take) and on mutations of them
// that it must leave to encoding/json or read as encoding/json does.
func TestKeyClaimedFastAgrees(t *testing.T) {
	samples := claimSamples(t)
	for _, b := range samples {
		if !checkClaimFast(t, b) {
			t.Fatalf("the fast path did not take the ledger's own claim %s", b)
		}
	}
	mutations := []func(string) string{
		func(s string) string { return strings.Replace(s, `"key"`, `"Key"`, 1) },                   // another case
		func(s string) string { return strings.Replace(s, `"key":`, `"key":"x","key":`, 1) },       // repeated
		func(s string) string { return strings.Replace(s, `"key":`, `"other":1,"key":`, 1) },       // unknown
		func(s string) string { return strings.Replace(s, `"k-1"`, `"k\u002d1"`, 1) },              // escape
		func(s string) string { return strings.Replace(s, `"k-1"`, "\"\xff\"", 1) },                // invalid UTF-8
		func(s string) string { return strings.Replace(s, `"revision":41`, `"revision":4.1`, 1) },  // fraction
		func(s string) string { return strings.Replace(s, `"revision":41`, `"revision":-1`, 1) },   // negative
		func(s string) string { return strings.Replace(s, `"revision":41`, `"revision":041`, 1) },  // leading zero
		func(s string) string { return strings.Replace(s, `"revision":41`, `"revision":null`, 1) }, // null
		func(s string) string {
			return strings.Replace(s, `"revision":41`, `"revision":99999999999999999999`, 1)
		},
		func(s string) string { return strings.Replace(s, `"stream":"`, `"stream":7,"x":"`, 1) },
		func(s string) string { return strings.Replace(s, `"request":{`, `"request":{,`, 1) }, // invalid request
		func(s string) string { return strings.Replace(s, `"request":{`, `"request":[{`, 1) }, // unbalanced
		func(s string) string { return strings.Replace(s, `"request":{`, `"request":"x","y":{`, 1) },
		func(s string) string { return strings.Replace(s, `"request":`, `"request":null,"r":`, 1) },
		// Inside the request (a flat one is flatObject's, the rest json.Valid's):
		func(s string) string { return strings.Replace(s, `"request":{`, `"request":{"a":-1, "b" : false ,`, 1) }, // valid
		func(s string) string { return strings.Replace(s, `"request":{`, `"request":{"a":01,`, 1) },               // leading zero
		func(s string) string { return strings.Replace(s, `"request":{`, `"request":{"a":1,,`, 1) },               // two commas
		func(s string) string { return strings.Replace(s, `"request":{`, `"request":{"a" 1,`, 1) },                // no colon
		func(s string) string { return strings.Replace(s, `"request":{`, `"request":{"a":tru,`, 1) },              // no literal
		func(s string) string { return strings.Replace(s, `"request":{`, "\"request\":{\"a\":\"\x01\",", 1) },     // control character
		func(s string) string { return strings.Replace(s, `"request":{`, "\"request\":{\"a\":\"\xff\",", 1) },     // invalid UTF-8, valid JSON
		func(s string) string { return strings.Replace(s, `"request":{`, `"request":{"a":1e3,`, 1) },              // a number of another form
		func(s string) string { return strings.Replace(s, `,"stream"`, `x,"stream"`, 1) },                         // after the request
		func(s string) string { return strings.Replace(s, `,`, " ,\n\t", -1) },                                    // spaces
		func(s string) string { return strings.TrimSuffix(s, "}") },                                               // cut
		func(s string) string { return s + "}" },                                                                  // trailing
		func(s string) string { return "[" + s + "]" },                                                            // not an object
		func(s string) string { return `{}` },
	}
	for _, b := range samples {
		for i, m := range mutations {
			t.Run(strings.Repeat("m", i+1), func(t *testing.T) { checkClaimFast(t, []byte(m(string(b)))) })
		}
	}
}

// FuzzDecodeKeyClaimed: on any body, DecodeKeyClaimed agrees with encoding/json.
func FuzzDecodeKeyClaimed(f *testing.F) {
	for _, b := range claimSamples(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) { checkClaimFast(t, b) })
}

// BenchmarkDecodeKeyClaimed: the claim the synthetic history writes, through
// DecodeKeyClaimed and through encoding/json.
//
//	go test ./domain -run '^$' -bench DecodeKeyClaimed -benchmem
func BenchmarkDecodeKeyClaimed(b *testing.B) {
	claim := claimSamples(b)[0]
	b.Run("fast", func(b *testing.B) {
		for range b.N {
			if _, err := DecodeKeyClaimed(claim); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		for range b.N {
			var c KeyClaimed
			if err := json.Unmarshal(claim, &c); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestSetFastHasEveryTag: setFast spells KeyClaimed's JSON names again; it
// has a case for each of them (a field added to KeyClaimed without one would
// send every claim to encoding/json), each setting its field, with a bit of
// its own.
func TestSetFastHasEveryTag(t *testing.T) {
	values := map[reflect.Type]string{
		reflect.TypeOf(""): `"x"`, reflect.TypeOf((*uint64)(nil)): `7`, reflect.TypeOf(json.RawMessage(nil)): `{"a":1}`,
	}
	var seen uint8
	rt := reflect.TypeOf(KeyClaimed{})
	for i := range rt.NumField() {
		f := rt.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		v, ok := values[f.Type]
		if !ok {
			t.Fatalf("KeyClaimed.%s is a %s: give setFast and this test a case for it", f.Name, f.Type)
		}
		var c KeyClaimed
		var text claimText
		bit, ok := c.setFast(&flatScan{b: []byte(v)}, name, &text, new(uint64))
		if key, hash, stream := text.strings(); key+hash+stream != "" { // a text field's value is made a string at the end
			c.Key, c.RequestHash, c.Stream = key, hash, stream
		}
		if !ok || bit == 0 || seen&bit != 0 || reflect.ValueOf(c).Field(i).IsZero() {
			t.Fatalf("setFast(%q) on %s: bit %d (ok %v, bits taken %b), KeyClaimed.%s set: %v", name, v, bit, ok, seen, f.Name, !reflect.ValueOf(c).Field(i).IsZero())
		}
		seen |= bit
	}
}

// TestFlatObjectIsValidJSON: what flatObject takes, json.Valid takes (the
// claim's request it reads without json.Valid): random objects of flat
// members and of the bytes that break them.
func TestFlatObjectIsValidJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 2))
	pieces := []string{`{`, `}`, `"a"`, `"b\"`, "\"\x01\"", `:`, `,`, ` `, `0`, `01`, `-7`, `1.5`, `true`, `fals`, `null`, `[`, `]`, `"x":"y"`}
	took := 0
	for range 200_000 {
		var b strings.Builder
		b.WriteString(`{"k":1`)
		for range r.IntN(8) {
			b.WriteString(pieces[r.IntN(len(pieces))])
		}
		s := []byte(b.String())
		if flatObject(s) {
			took++
			if !json.Valid(s) {
				t.Fatalf("flatObject takes %q, which is not valid JSON", s)
			}
		}
	}
	if took == 0 {
		t.Fatal("flatObject took none")
	}
}

// BenchmarkFlatObject: a realistic claim's request checked by flatObject and
// by json.Valid, in one run.
func BenchmarkFlatObject(b *testing.B) {
	req := []byte(`{"account_id":"histirsjc-acc-62196","amount":240,"currency":"EUR","type":"deposit"}`)
	b.Run("flat", func(b *testing.B) {
		for range b.N {
			if !flatObject(req) {
				b.Fatal("not flat")
			}
		}
	})
	b.Run("json-valid", func(b *testing.B) {
		for range b.N {
			if !json.Valid(req) {
				b.Fatal("not valid")
			}
		}
	})
}

// TestKeyClaimedKeepsNoViewOfItsBody: a decoded claim's strings (key,
// command, request hash, stream: made in one allocation since claimFast)
// and its request are its own, not views of the event's body, which the
// reader reuses for the next event: overwritten and decoded again, the body
// leaves the claim as it was. (Review r495: a claim made of unsafe views
// passed every other test.)
func TestKeyClaimedKeepsNoViewOfItsBody(t *testing.T) {
	for _, b := range claimSamples(t) {
		body := append([]byte(nil), b...)
		got, err := DecodeKeyClaimed(body)
		if err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		want := fmt.Sprintf("%q %q %q %q %s", got.Key, got.Command, got.RequestHash, got.Stream, got.Request)
		for i := range body {
			body[i] = 'X'
		}
		if _, err := DecodeKeyClaimed(body); err == nil {
			t.Fatalf("a body of X decoded")
		}
		if after := fmt.Sprintf("%q %q %q %q %s", got.Key, got.Command, got.RequestHash, got.Stream, got.Request); after != want {
			t.Fatalf("the claim changed with its body:\nbefore %s\nafter  %s", want, after)
		}
	}
}
