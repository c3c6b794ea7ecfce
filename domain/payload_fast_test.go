package domain

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
)

// checkPayloadFast: whatever the plan of type t takes, encoding/json reads the
// same payload from, and DecodeEvent agrees with encoding/json on every body
// (both refuse it, or both read the same payload); fastTook reports whether
// the plan took it.
func checkPayloadFast(t *testing.T, et EventType, b []byte) (fastTook bool) {
	t.Helper()
	general := et.New()
	gerr := json.Unmarshal(b, general)
	if et.plan != nil {
		fast := et.New()
		if fastTook = et.plan.decode(fast, b); fastTook {
			if gerr != nil {
				t.Fatalf("%s %q: the plan took what encoding/json refuses: %v", et.Name, b, gerr)
			}
			if !reflect.DeepEqual(fast, general) {
				t.Fatalf("%s %q:\nplan    %+v\ngeneral %+v", et.Name, b, fast, general)
			}
		}
	}
	got, err := DecodeEvent(et.Name, b)
	if (err == nil) != (gerr == nil) || err == nil && !reflect.DeepEqual(got, general) {
		t.Fatalf("%s %q: DecodeEvent %+v, %v; encoding/json %+v, %v", et.Name, b, got, err, general, gerr)
	}
	return fastTook
}

// hostileStrings are strings a payload may hold that the plan must leave to
// encoding/json or read as it does.
var hostileStrings = []string{"", "EUR", "deposit", "ключ", "a\"b", `a\b`, "a\nb", "\x00", "\xff\xfe", "\u2028", "<&>", "e\u0301", strings.Repeat("x", 300)}

// randomPayload fills the payload v points to with random values, some
// fields left zero (so omitempty drops them).
func randomPayload(r *rand.Rand, v reflect.Value, hostile bool) {
	switch v.Kind() {
	case reflect.Pointer:
		if r.IntN(3) == 0 {
			return
		}
		v.Set(reflect.New(v.Type().Elem()))
		randomPayload(r, v.Elem(), hostile)
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[time.Time]() {
			v.Set(reflect.ValueOf(time.Unix(r.Int64N(4e9), r.Int64N(1e9)).In(time.FixedZone("z", 3600*(r.IntN(5)-2)))))
			return
		}
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() && r.IntN(4) != 0 {
				randomPayload(r, v.Field(i), hostile)
			}
		}
	case reflect.String:
		v.SetString(randomString(r, hostile))
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		n := r.Int64() >> r.IntN(64)
		if r.IntN(2) == 0 {
			n = -n
		}
		if !v.OverflowInt(n) {
			v.SetInt(n)
		}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if n := r.Uint64() >> r.IntN(64); !v.OverflowUint(n) {
			v.SetUint(n)
		}
	case reflect.Array: // a uuid.UUID
		for i := range v.Len() {
			randomPayload(r, v.Index(i), hostile)
		}
	case reflect.Bool:
		v.SetBool(r.IntN(2) == 0)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		for range r.IntN(4) {
			k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
			randomPayload(r, k, hostile)
			randomPayload(r, e, hostile)
			m.SetMapIndex(k, e)
		}
		v.Set(m)
	case reflect.Slice:
		if v.Type().Elem().Kind() == reflect.Uint8 { // json.RawMessage: an object
			v.SetBytes([]byte(fmt.Sprintf(`{"n":%d}`, r.IntN(100))))
			return
		}
		s := reflect.MakeSlice(v.Type(), r.IntN(3), r.IntN(3)+3)
		for i := range s.Len() {
			randomPayload(r, s.Index(i), hostile)
		}
		v.Set(s)
	}
}

func randomString(r *rand.Rand, hostile bool) string {
	if hostile && r.IntN(3) == 0 {
		return hostileStrings[r.IntN(len(hostileStrings))]
	}
	return fmt.Sprintf("s-%d", r.IntN(1000))
}

// payloadMutations turn a body into one the plan must leave to encoding/json
// or read as encoding/json does: each replaces the first member's name or
// value, or the text around them.
var payloadMutations = []func(string) string{
	func(s string) string { return strings.Replace(s, `{"`, `{"Zz":1,"`, 1) },                              // unknown
	func(s string) string { return strings.Replace(s, `{"`, `{"Amount":1,"`, 1) },                          // another case
	func(s string) string { return upperFirstName(s) },                                                     // another case
	func(s string) string { return repeatFirstMember(s) },                                                  // repeated
	func(s string) string { return strings.Replace(s, `":"`, `":null,"x":"`, 1) },                          // null
	func(s string) string { return strings.Replace(s, `":"`, `":"\u0041`, 1) },                             // escape
	func(s string) string { return strings.Replace(s, `":"`, "\":\"\xff", 1) },                             // invalid UTF-8
	func(s string) string { return strings.Replace(s, `":"`, "\":\"\x01", 1) },                             // control character
	func(s string) string { return replaceFirstNumber(s, "1.0") },                                          // fraction
	func(s string) string { return replaceFirstNumber(s, "1e3") },                                          // exponent
	func(s string) string { return replaceFirstNumber(s, "99999999999999999999") },                         // overflow
	func(s string) string { return replaceFirstNumber(s, "-0") },                                           // negative zero
	func(s string) string { return replaceFirstNumber(s, "01") },                                           // leading zero
	func(s string) string { return replaceFirstNumber(s, "true") },                                         // a boolean for an integer
	func(s string) string { return replaceFirstNumber(s, `"7"`) },                                          // a string for an integer
	func(s string) string { return replaceFirstNumber(s, `{}`) },                                           // an object for an integer
	func(s string) string { return strings.Replace(s, `":"`, `":7,"y":"`, 1) },                             // an integer for a string
	func(s string) string { return strings.Replace(s, `"metadata":{`, `"metadata":{"a":"1","a":"2",`, 1) }, // a repeated map key
	func(s string) string { return strings.Replace(s, `"metadata":{`, `"metadata":{"a":1,`, 1) },
	func(s string) string { return strings.Replace(s, `"metadata":{`, "\"metadata\":{\"\xff\":\"1\",", 1) }, // invalid UTF-8 in a map key
	func(s string) string { return strings.Replace(s, `"metadata":{`, "\"metadata\":{\"\x01\":\"1\",", 1) }, // a control character in a map key
	func(s string) string { return strings.Replace(s, `{"`, `{"metadata":{},"`, 1) },                        // an empty map (json.Marshal omits it)
	func(s string) string {
		return strings.Replace(s, `"metadata":{`, `"metadata":{"z":"9"},"metadata":{`, 1)
	}, // a repeated map           // an integer in a map
	func(s string) string { return strings.Replace(s, `"metadata":{`, `"metadata":{"a":{"b":"c"},`, 1) }, // nesting
	func(s string) string { return strings.Replace(s, `"expires_at":"`, `"expires_at":" `, 1) },          // a loose time
	func(s string) string { return strings.Replace(s, `"expires_at":"2`, `"expires_at":"x`, 1) },         // a bad time
	func(s string) string { return strings.Replace(s, `"up_to":true`, `"up_to":1`, 1) },
	func(s string) string { return strings.Replace(s, `"up_to":true`, `"up_to":false`, 1) }, // an integer for a boolean
	func(s string) string { return strings.ReplaceAll(s, `,`, " ,\n\t") },                   // space
	func(s string) string { return " " + s + "\n" },                                         // space
	func(s string) string { return s + "x" },                                                // trailing
	func(s string) string { return s + "{}" },                                               // trailing
	func(s string) string { return s[:len(s)/2] },                                           // truncated
	func(s string) string { return strings.Replace(s, `,`, `,,`, 1) },                       // malformed
	func(s string) string { return strings.Replace(s, `}`, `,}`, 1) },                       // malformed
	// Inside an array of objects (a transaction's postings, legs, accounts):
	func(s string) string { return strings.Replace(s, `[{"`, `[{"Zz":1,"`, 1) },                      // unknown
	func(s string) string { return strings.Replace(s, `[{"`, `[{"From":"x","`, 1) },                  // another case
	func(s string) string { return strings.Replace(s, `[{"`, `[null,{"`, 1) },                        // a null element
	func(s string) string { return strings.Replace(s, `[{"`, `[{},{"`, 1) },                          // an empty element
	func(s string) string { return strings.Replace(s, `[{"`, `[7,{"`, 1) },                           // an element of another kind
	func(s string) string { return strings.Replace(s, `[{"`, `[{"amount":1,"amount":2,"`, 1) },       // repeated
	func(s string) string { return strings.Replace(s, `},{`, `} , {`, 1) },                           // space
	func(s string) string { return strings.Replace(s, `},{`, `},,{`, 1) },                            // malformed
	func(s string) string { return strings.Replace(s, `}]`, `},]`, 1) },                              // malformed
	func(s string) string { return strings.Replace(s, `}]`, `}`, 1) },                                // unclosed
	func(s string) string { return strings.Replace(s, `":[{`, `":[[{`, 1) },                          // nested
	func(s string) string { return strings.Replace(s, `":[{`, `":null,"x":[{`, 1) },                  // null
	func(s string) string { return strings.Replace(s, `":[{`, `":[],"x":[{`, 1) },                    // empty
	func(s string) string { return strings.Replace(s, `"revision":`, `"revision":-`, 1) },            // a negative unsigned
	func(s string) string { return strings.Replace(s, `"revision":`, `"revision":1`, 1) },            // a larger unsigned
	func(s string) string { return strings.Replace(s, `"revision":`, `"revision":184467440737`, 1) }, // overflow
	func(s string) string { return strings.Replace(s, `"id":"`, `"id":"x`, 1) },                      // a bad UUID
	func(s string) string { return strings.Replace(s, `"id":"`, `"id":"urn:uuid:`, 1) },              // another form of UUID
	func(s string) string { return strings.Replace(s, `"id":"00000000-`, `"id":"`, 1) },              // a short UUID
	func(s string) string { return strings.Replace(s, `"id":"`, `"id":7,"i":"`, 1) },                 // an integer for a UUID
	func(string) string { return `{}` },
	func(string) string { return `[]` },
	func(string) string { return `null` },
	func(string) string { return `}` },
	func(string) string { return `` },
}

func upperFirstName(s string) string {
	if i := strings.Index(s, `{"`); i >= 0 && i+2 < len(s) {
		return s[:i+2] + strings.ToUpper(s[i+2:i+3]) + s[i+3:]
	}
	return s
}

func repeatFirstMember(s string) string {
	if end := strings.IndexAny(s, ",}"); strings.HasPrefix(s, "{") && end > 1 {
		return "{" + s[1:end] + "," + s[1:]
	}
	return s
}

func replaceFirstNumber(s, with string) string {
	for i := 1; i < len(s); i++ {
		if s[i-1] == ':' && (s[i] == '-' || s[i] >= '0' && s[i] <= '9') {
			j := i + 1
			for j < len(s) && s[j] >= '0' && s[j] <= '9' {
				j++
			}
			return s[:i] + with + s[j:]
		}
	}
	return s
}

// TestPayloadFastAgrees compares DecodeEvent with encoding/json on random
// payloads of every registered type as json.Marshal writes them (which the
// plan of every flat type must take, hostile strings apart), and on
// mutations of them: unknown and repeated names, names in another case,
// escapes, invalid UTF-8, null, values of another kind, malformed bodies.
func TestPayloadFastAgrees(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 1))
	for _, et := range eventTypes {
		took := 0
		for i := range 400 {
			v := et.New()
			randomPayload(r, reflect.ValueOf(v).Elem(), i%2 == 1)
			b, err := json.Marshal(v)
			if err != nil {
				t.Fatal(err)
			}
			if checkPayloadFast(t, et, b) {
				took++
			}
			for _, mut := range payloadMutations {
				checkPayloadFast(t, et, []byte(mut(string(b))))
			}
		}
		if flat := et.plan != nil && !planHasOther(et.plan); flat && took < 100 {
			t.Errorf("%s: the plan took %d of 400 bodies json.Marshal wrote", et.Name, took)
		}
	}
}

// planHasOther reports whether a plan has a field it leaves to encoding/json.
func planHasOther(p *payloadPlan) bool {
	for _, f := range p.fields {
		if f.kind == planOther {
			return true
		}
	}
	return false
}

// TestPayloadPlanReadsTheLedgersEvents: the plan takes every account event the
// registry's samples hold, as the ledger writes them.
func TestPayloadPlanReadsTheLedgersEvents(t *testing.T) {
	for name, evs := range registrySamples() {
		et, _ := LookupEventType(name)
		ev := evs[len(evs)-1]
		b, err := json.Marshal(ev.Data)
		if err != nil {
			t.Fatal(err)
		}
		if took := checkPayloadFast(t, et, b); !took && et.Kind == StreamAccount {
			t.Errorf("%s: the plan left %s to encoding/json", name, b)
		}
	}
}

func FuzzDecodeEvent(f *testing.F) {
	for name, evs := range registrySamples() {
		for _, ev := range evs {
			b, err := json.Marshal(ev.Data)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(name, b)
			f.Add(ev.Type, b)
		}
	}
	// What json.Marshal never writes: an empty map, a map key of invalid
	// UTF-8 or with a control character.
	for _, md := range []string{`{}`, "{\"\xff\":\"1\"}", "{\"\x01\":\"1\"}", "{\"a\":\"1\",\"\xfe\":\"2\"}"} {
		f.Add(EvCredited, []byte(`{"amount":1,"currency":"EUR","metadata":`+md+`}`))
	}
	f.Fuzz(func(t *testing.T, name string, b []byte) {
		if et, ok := LookupEventType(name); ok {
			checkPayloadFast(t, et, b)
		}
	})
}

// BenchmarkDecodeEvent: payloads decoded by DecodeEvent against
// encoding/json, in one run: a credit and a transaction's posting (the
// plans'), a claim (no plan: its own decoder), a refusal whose message
// json.Marshal escapes (the plan gives up half-way).
func BenchmarkDecodeEvent(b *testing.B) {
	held, rev := int64(0), uint64(3)
	for _, c := range []struct {
		name, typ string
		payload   any
	}{
		{"credited", EvCredited, Credited{Amount: 100, Currency: "EUR", Reason: ReasonDeposit, BalanceAfter: 100, HeldAfter: &held}},
		{"transaction-posted", EvTransactionPosted, TransactionPosted{TransactionID: "tx-1",
			Postings: []Posting{{From: "acc-1", To: "acc-2", Amount: 100, Currency: "EUR"}},
			Legs:     []EventRef{{Stream: "account-acc-1", Revision: 4, Type: EvDebited}},
			Accounts: []AccountView{{AccountID: "acc-1", Currency: "EUR", Balance: 900, Available: 900, Revision: 5}}}},
		{"key-claimed", EvKeyClaimed, KeyClaimed{Key: "k-1", Command: "deposit", RequestHash: "ab12",
			Request: json.RawMessage(`{"account_id":"acc-1","amount":100}`), Stream: "account-acc-1", Revision: &rev}},
		{"command-rejected-escaped", EvCommandRejected, CommandRejected{Command: "withdraw", Code: "insufficient_funds",
			Message: "amount <= available", BalanceAfter: &held, HeldAfter: &held}},
	} {
		data, err := json.Marshal(c.payload)
		if err != nil {
			b.Fatal(err)
		}
		et, _ := LookupEventType(c.typ)
		b.Run(c.name+"/encoding-json", func(b *testing.B) {
			for range b.N {
				if err := json.Unmarshal(data, et.New()); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"/fast", func(b *testing.B) {
			for range b.N {
				if _, err := DecodeEvent(c.typ, data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// Payload types the plan must leave to encoding/json: their own decoder, a
// pointer field whose element has one, a tag name encoding/json does not take,
// two fields of one name.
type (
	planOwnJSON struct{ N int64 }
	planOwnText struct{ N int64 }
	hundredfold int64
	planPtrJSON struct{ N *hundredfold }
	shout       string
	planPtrText struct{ S *shout }
	planBadTag  struct {
		N int64 `json:"a'b"`
	}
	planTwoNames struct {
		N int64
		A int64 `json:"N"` // encoding/json's field N: a tag beats a Go name
	}
)

func (p *planOwnJSON) UnmarshalJSON([]byte) error { p.N = 500; return nil }
func (p *planOwnText) UnmarshalText([]byte) error { p.N = 500; return nil }
func (h *hundredfold) UnmarshalJSON(b []byte) error {
	n, err := strconv.ParseInt(string(b), 10, 64)
	*h = hundredfold(100 * n)
	return err
}
func (s *shout) UnmarshalText(b []byte) error { *s = shout(strings.ToUpper(string(b))); return nil }

// TestPayloadPlanLeavesCustomDecoders: what a plan takes of a type with its
// own decoding, or names encoding/json reads otherwise, it reads as
// encoding/json does (no such type gets a plan).
func TestPayloadPlanLeavesCustomDecoders(t *testing.T) {
	for _, c := range []struct {
		typ  reflect.Type
		body string
	}{
		{reflect.TypeFor[planOwnJSON](), `{"N":5}`},
		{reflect.TypeFor[planOwnText](), `{"N":5}`},
		{reflect.TypeFor[planPtrJSON](), `{"N":5}`},
		{reflect.TypeFor[planPtrText](), `{"S":"a"}`},
		{reflect.TypeFor[planBadTag](), `{"a'b":5}`},
		{reflect.TypeFor[planTwoNames](), `{"N":5}`},
		{reflect.TypeFor[planNumber](), `{"N":"abc"}`},
		{reflect.TypeFor[planNumberPtr](), `{"N":"abc"}`},
		{reflect.TypeFor[planUnnamedText](), `{"v":"6ba7b810-9dad-11d1-80b4-00c04fd430c8"}`},
		{reflect.TypeFor[planTextAndJSON](), `{"v":"a"}`},
	} {
		p := newPayloadPlan(c.typ)
		if p == nil {
			continue
		}
		fast, general := reflect.New(c.typ).Interface(), reflect.New(c.typ).Interface()
		gerr := json.Unmarshal([]byte(c.body), general)
		if p.decode(fast, []byte(c.body)) && (gerr != nil || !reflect.DeepEqual(fast, general)) {
			t.Errorf("%s %s: plan %+v; encoding/json %+v, %v", c.typ, c.body, fast, general, gerr)
		}
	}
}

// planUnnamedText has a field of an unnamed struct embedding a uuid.UUID:
// its pointer has UnmarshalText (promoted), which encoding/json never calls
// (it takes the address of a named type alone) and so refuses the string
// (review r486).
type planUnnamedText struct {
	V struct{ uuid.UUID } `json:"v"`
}

// planTextAndJSON has a field whose pointer decodes it both ways:
// encoding/json calls UnmarshalJSON, not UnmarshalText (review r486).
type planTextAndJSON struct {
	V textAndJSON `json:"v,omitempty"`
}

type textAndJSON string

func (p *textAndJSON) UnmarshalText([]byte) error { *p = "text"; return nil }
func (p *textAndJSON) UnmarshalJSON([]byte) error { *p = "json"; return nil }

// planTree is a payload type holding a slice of itself.
type planTree struct {
	Name string     `json:"name"`
	Kids []planTree `json:"kids"`
}

// TestPayloadPlanOfARecursiveType: a type holding a slice of itself is
// planned in bounded steps (it has no plan), where planning its element
// again without end overflowed the stack when the package's event types were
// registered (review r486).
func TestPayloadPlanOfARecursiveType(t *testing.T) {
	defer debug.SetMaxStack(debug.SetMaxStack(1 << 20))
	if p := newPayloadPlan(reflect.TypeFor[planTree]()); p != nil {
		t.Errorf("a recursive type has a plan: %+v", p)
	}
}

// planNumber and planNumberPtr have a json.Number, a string kind that
// encoding/json reads as a number (it refuses "abc").
type planNumber struct {
	N json.Number `json:",omitempty"`
}

type planNumberPtr struct {
	N *json.Number `json:",omitempty"`
}

// planNullable has a pointer and a map written without omitempty: json.Marshal
// writes them null when nil, which the plan does not read.
type planNullable struct {
	P *int64
	M map[string]string
	S string
}

// TestPayloadPlanNotStartedOnNull: a type whose pointer or map is written
// without omitempty gets no plan (its nil values are written null, which the
// plan would start to read and hand over, costing more than encoding/json).
func TestPayloadPlanNotStartedOnNull(t *testing.T) {
	if p := newPayloadPlan(reflect.TypeFor[planNullable]()); p != nil {
		t.Fatalf("a plan for %T, whose nil pointer and map json.Marshal writes null", planNullable{})
	}
}

// TestPayloadPlansOfTheLedgersTypes: which registered event types have a plan
// is what this list says, so a rule of newPayloadPlan too broad (or too
// narrow) shows here, not only in a benchmark. The types without one have a
// member the plan never reads that json.Marshal always writes.
func TestPayloadPlansOfTheLedgersTypes(t *testing.T) {
	none := map[string]bool{EvKeyClaimed: true, EvBatchDecided: true}
	for _, et := range eventTypes {
		if got := et.plan != nil; got == none[et.Name] {
			t.Errorf("%s: has a plan %v, want %v", et.Name, got, !none[et.Name])
		}
	}
}
