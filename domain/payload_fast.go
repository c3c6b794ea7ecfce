package domain

import (
	"bytes"
	"encoding"
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// payloadPlan is how DecodeEvent reads one payload type without encoding/json:
// the JSON names of its fields and how each is set, built once by reflection
// from the type's own declaration (its json tags), so the type stays the one
// home of its wire form. The common payload (an object of plain strings,
// integers, booleans, a flat object of strings for a map[string]string, an
// RFC 3339 string for a *time.Time, a string a uuid.UUID decodes, arrays of
// objects of the same for a slice of structs) is read member by member
// (decode); any other body (escapes, null, unknown or repeated names, a name
// in another case, invalid UTF-8, a value of another kind, an empty element,
// a field of a kind the plan does not read) is left to encoding/json, which
// decides it. On the bodies
// the plan takes it yields what encoding/json yields (TestPayloadFastAgrees,
// FuzzDecodeEvent).
type payloadPlan struct {
	fields []planField
}

// planField is one field of a payload type: its JSON name, its index in the
// struct and how its value is read.
type planField struct {
	name  string
	index int
	kind  planKind
	bits  int // an integer's size
	// repeats: a string of one of the few values that repeat across events
	// (repeatedMembers), interned.
	repeats bool
	// elem is the plan of a slice's elements (planStructs).
	elem *payloadPlan
}

// repeatedMembers names the payloads' members whose values are a few that
// repeat across every event (a currency, a reason, a rejection's code and
// command): their strings are interned (interner), not copied for each event.
var repeatedMembers = map[string]bool{"currency": true, "reason": true, "code": true, "command": true}

type planKind uint8

const (
	planOther   planKind = iota // a kind decode leaves to encoding/json
	planString                  // a string (or a type whose kind is string)
	planInt                     // a signed integer
	planIntPtr                  // a pointer to a signed integer
	planBool                    // a boolean
	planStrMap                  // a map[string]string
	planTimePtr                 // a *time.Time
	planUint                    // an unsigned integer
	planText                    // a value whose pointer decodes a string itself (encoding.TextUnmarshaler): a uuid.UUID
	planStructs                 // a slice of structs that have a plan (elem)
)

// planMembers bounds the fields of a type a plan reads (a bit each).
const planMembers = 64

var (
	jsonUnmarshalerType = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()
	strMapType          = reflect.TypeFor[map[string]string]()
	timePtrType         = reflect.TypeFor[*time.Time]()
	jsonNumberType      = reflect.TypeFor[json.Number]()
	intKindsBits        = map[reflect.Kind]int{reflect.Int: strconv.IntSize, reflect.Int8: 8, reflect.Int16: 16, reflect.Int32: 32, reflect.Int64: 64}
	uintKindsBits       = map[reflect.Kind]int{reflect.Uint: strconv.IntSize, reflect.Uint8: 8, reflect.Uint16: 16, reflect.Uint32: 32, reflect.Uint64: 64}
)

// newPayloadPlan is the plan of struct type t, or nil when encoding/json
// alone is to read its payloads: t decodes itself (json.Unmarshaler or
// encoding.TextUnmarshaler on the type or its pointer), a field's name is not
// its tag's or its Go name alone (an embedded struct, the ",string" option, a
// tag name encoding/json does not take, two fields of one name), or a field that is not a plain string, bool or integer,
// a text value or a slice of structs (writtenNotNull) is written without omitempty (one the plan cannot read, or a pointer or a
// map written null when nil, which the plan does not read either: it would
// start such bodies only to hand them over). A field that decodes itself
// (or a json.Number) with omitempty keeps the plan: the plan hands a body over
// when it meets that field.
func newPayloadPlan(t reflect.Type) *payloadPlan { return planOfType(t, map[reflect.Type]bool{}) }

// planOfType is newPayloadPlan's plan of t, planning the types being planned
// around it (a slice of structs' element): a type holding a slice of itself,
// or of a type that holds it, has no plan (it would be planned without end).
func planOfType(t reflect.Type, planning map[reflect.Type]bool) *payloadPlan {
	if t.Kind() != reflect.Struct || t.NumField() > planMembers || decodesItself(t) || planning[t] {
		return nil
	}
	planning[t] = true
	defer delete(planning, t)
	p := &payloadPlan{}
	names := map[string]bool{}
	for i := range t.NumField() {
		f, use, ok := planFieldOf(t.Field(i), i, planning)
		if !ok || names[f.name] {
			return nil
		}
		if use {
			names[f.name] = true
			p.fields = append(p.fields, f)
		}
	}
	return p
}

// planFieldOf is the plan's field of struct field sf, its i-th; use false for
// a field encoding/json skips, ok false when the type is to have no plan.
func planFieldOf(sf reflect.StructField, i int, planning map[reflect.Type]bool) (f planField, use, ok bool) {
	if sf.Anonymous {
		return planField{}, false, false
	}
	tag := sf.Tag.Get("json")
	if !sf.IsExported() || tag == "-" {
		return planField{}, false, true
	}
	name, opts, _ := strings.Cut(tag, ",")
	if strings.Contains(","+opts+",", ",string,") || name != "" && !validTagName(name) {
		return planField{}, false, false
	}
	if name == "" {
		name = sf.Name
	}
	f = planField{name: name, index: i, kind: planKindOf(sf.Type), bits: intBits(sf.Type)}
	f.repeats = f.kind == planString && repeatedMembers[name]
	if f.kind == planStructs {
		if f.elem = planOfType(sf.Type.Elem(), planning); f.elem == nil {
			f.kind = planOther
		}
	}
	if !writtenNotNull(f.kind) && !strings.Contains(","+opts+",", ",omitempty,") {
		// Always written, and as null when nil (a pointer, a map), which the
		// plan does not read: it would start such bodies only to hand them over.
		return planField{}, false, false
	}
	return f, true, true
}

// writtenNotNull: json.Marshal writes a field of the kind as a value the plan
// reads, never null; but a slice of structs, written null when nil, which
// none of the ledger's is when written (a transaction's postings, legs and
// accounts).
func writtenNotNull(k planKind) bool {
	switch k {
	case planString, planBool, planInt, planUint, planText, planStructs:
		return true
	}
	return false
}

// validTagName: encoding/json takes name from a tag (else it uses the Go name).
func validTagName(name string) bool {
	for _, c := range name {
		if !strings.ContainsRune("!#$%&()*+-./:;<=>?@[]^_{|}~ ", c) && !unicode.IsLetter(c) && !unicode.IsDigit(c) {
			return false
		}
	}
	return true
}

// decodesItself: encoding/json calls a method of t or *t to decode a t.
func decodesItself(t reflect.Type) bool {
	for _, u := range [...]reflect.Type{t, reflect.PointerTo(t)} {
		if u.Implements(jsonUnmarshalerType) || u.Implements(textUnmarshalerType) {
			return true
		}
	}
	return false
}

func planKindOf(t reflect.Type) planKind {
	switch {
	case t == strMapType:
		return planStrMap
	case t == timePtrType: // what encoding/json calls, decode calls
		return planTimePtr
	case decodesText(t):
		return planText
	case decodesItself(t) || t.Kind() == reflect.Pointer && decodesItself(t.Elem()):
		return planOther // encoding/json calls its method
	case t == jsonNumberType || t.Kind() == reflect.Pointer && t.Elem() == jsonNumberType:
		return planOther // a string kind encoding/json reads as a number
	case t.Kind() == reflect.String:
		return planString
	case t.Kind() == reflect.Bool:
		return planBool
	case intKindsBits[t.Kind()] != 0:
		return planInt
	case t.Kind() == reflect.Pointer && intKindsBits[t.Elem().Kind()] != 0:
		return planIntPtr
	case uintKindsBits[t.Kind()] != 0:
		return planUint
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Struct && !decodesItself(t.Elem()) && !decodesItself(t):
		return planStructs
	}
	return planOther
}

// decodesText: t is a named value (not a pointer) whose pointer alone
// decodes it from a JSON string's content (encoding.TextUnmarshaler, not
// json.Unmarshaler): encoding/json calls that method, and so does the plan.
// encoding/json takes the address of a named type alone: an unnamed struct
// embedding a uuid.UUID has the method on its pointer, which it never calls.
func decodesText(t reflect.Type) bool {
	pt := reflect.PointerTo(t)
	return t.Name() != "" && t.Kind() != reflect.Pointer && t.Kind() != reflect.Interface && pt.Implements(textUnmarshalerType) &&
		!t.Implements(textUnmarshalerType) && !t.Implements(jsonUnmarshalerType) && !pt.Implements(jsonUnmarshalerType)
}

func intBits(t reflect.Type) int {
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return max(intKindsBits[t.Kind()], uintKindsBits[t.Kind()])
}

// decode reads body into the payload v points to (a pointer to the plan's
// type, zero); false when it leaves body to encoding/json, v then partly set.
func (p *payloadPlan) decode(v any, body []byte) bool {
	// An escape, the most common body the plan leaves (json.Marshal escapes
	// <, >, &, quotes, control characters), is found before any field is set,
	// so that such a body costs what encoding/json alone costs.
	if bytes.IndexByte(body, '\\') >= 0 {
		return false
	}
	sc := flatScan{b: body, i: skipSpace(body, 0)}
	return p.object(&sc, reflect.ValueOf(v).Elem()) && skipSpace(body, sc.i) == len(body)
}

// object reads the object at sc, of the plan's members, into the struct s
// (zero); false for an empty object (encoding/json's) or any the plan leaves.
func (p *payloadPlan) object(sc *flatScan, s reflect.Value) bool {
	if sc.i >= len(sc.b) || sc.b[sc.i] != '{' {
		return false
	}
	if sc.i = skipSpace(sc.b, sc.i+1); sc.i >= len(sc.b) || sc.b[sc.i] == '}' {
		return false
	}
	var seen uint64
	for more := true; more; {
		name, ok := sc.memberName()
		if !ok {
			return false
		}
		k := p.field(name)
		if k < 0 || seen&(1<<k) != 0 || !p.fields[k].set(sc, s.Field(p.fields[k].index)) {
			return false
		}
		seen |= 1 << k
		if more, ok = sc.next('}'); !ok {
			return false
		}
	}
	return true
}

// next reads what follows a value inside an object or array: a comma up to
// the next value (more), or the closing byte (not more); false for anything
// else.
func (sc *flatScan) next(closing byte) (more, ok bool) {
	if sc.i = skipSpace(sc.b, sc.i); sc.i >= len(sc.b) {
		return false, false
	}
	switch sc.b[sc.i] {
	case ',':
		sc.i = skipSpace(sc.b, sc.i+1)
		return true, true
	case closing:
		sc.i++
		return false, true
	}
	return false, false
}

// field is the index in p.fields of the field called name exactly, or -1.
func (p *payloadPlan) field(name []byte) int {
	for k := range p.fields {
		if p.fields[k].name == string(name) {
			return k
		}
	}
	return -1
}

// set reads the member's value at sc into the field fv; false for a value
// encoding/json decides.
func (f *planField) set(sc *flatScan, fv reflect.Value) bool {
	switch f.kind {
	case planString:
		v, ok := sc.validString()
		switch {
		case ok && f.repeats:
			fv.SetString(repeated.value(v))
		case ok:
			fv.SetString(string(v))
		}
		return ok
	case planInt, planIntPtr:
		return f.setInt(sc, fv)
	case planBool:
		return sc.setBool(fv)
	case planStrMap:
		m, ok := sc.strMap()
		if ok {
			fv.Set(reflect.ValueOf(m))
		}
		return ok
	case planUint:
		return f.setUint(sc, fv)
	case planText:
		v, ok := sc.validString()
		return ok && fv.Addr().Interface().(encoding.TextUnmarshaler).UnmarshalText(v) == nil
	case planStructs:
		return f.setStructs(sc, fv)
	case planTimePtr:
		start := sc.i
		if _, ok := sc.plainString(); !ok {
			return false
		}
		t := new(time.Time)
		if t.UnmarshalJSON(sc.b[start:sc.i]) != nil { // what encoding/json calls
			return false
		}
		fv.Set(reflect.ValueOf(t))
		return true
	}
	return false
}

// setInt reads an integer into an integer field or a new one its pointer
// field points to.
func (f *planField) setInt(sc *flatScan, fv reflect.Value) bool {
	text, ok := sc.jsonInteger()
	if !ok {
		return false
	}
	n, err := strconv.ParseInt(string(text), 10, f.bits)
	if err != nil {
		return false
	}
	if f.kind == planIntPtr {
		p := reflect.New(fv.Type().Elem())
		fv.Set(p)
		fv = p.Elem()
	}
	fv.SetInt(n)
	return true
}

// setUint reads a non-negative integer into an unsigned integer field.
func (f *planField) setUint(sc *flatScan, fv reflect.Value) bool {
	text, ok := sc.jsonInteger()
	if !ok || text[0] == '-' {
		return false
	}
	n, err := strconv.ParseUint(string(text), 10, f.bits)
	if err != nil {
		return false
	}
	fv.SetUint(n)
	return true
}

// setStructs reads an array of objects into the slice field fv (nil), each
// by the elements' plan, as encoding/json grows it; an empty array is an
// empty slice, not nil.
func (f *planField) setStructs(sc *flatScan, fv reflect.Value) bool {
	if sc.i >= len(sc.b) || sc.b[sc.i] != '[' {
		return false
	}
	fv.Set(reflect.MakeSlice(fv.Type(), 0, 0))
	if sc.i = skipSpace(sc.b, sc.i+1); sc.i < len(sc.b) && sc.b[sc.i] == ']' {
		sc.i++
		return true
	}
	for more := true; more; {
		n := fv.Len()
		fv.Grow(1)
		fv.SetLen(n + 1)
		var ok bool
		if !f.elem.object(sc, fv.Index(n)) {
			return false
		}
		if more, ok = sc.next(']'); !ok {
			return false
		}
	}
	return true
}

// setBool reads the literal true or false into a boolean field.
func (sc *flatScan) setBool(fv reflect.Value) bool {
	for _, lit := range [...]string{"true", "false"} {
		if j := sc.i + len(lit); j <= len(sc.b) && string(sc.b[sc.i:j]) == lit {
			fv.SetBool(lit == "true")
			sc.i = j
			return true
		}
	}
	return false
}

// validString reads a plain string (plainString) whose bytes are valid UTF-8
// (encoding/json replaces invalid ones).
func (sc *flatScan) validString() ([]byte, bool) {
	v, ok := sc.plainString()
	return v, ok && utf8.Valid(v)
}

// strMap reads a flat object of plain strings, each name once, into a new map
// (an empty object into an empty map, as encoding/json makes it).
func (sc *flatScan) strMap() (map[string]string, bool) {
	if sc.i >= len(sc.b) || sc.b[sc.i] != '{' {
		return nil, false
	}
	m := map[string]string{}
	if sc.i = skipSpace(sc.b, sc.i+1); sc.i < len(sc.b) && sc.b[sc.i] == '}' {
		sc.i++
		return m, true
	}
	for {
		name, ok := sc.memberName()
		if !ok || !utf8.Valid(name) {
			return nil, false
		}
		v, ok := sc.validString()
		if _, dup := m[string(name)]; !ok || dup {
			return nil, false
		}
		m[string(name)] = string(v)
		more, ok := sc.next('}')
		if !ok {
			return nil, false
		}
		if !more {
			return m, true
		}
	}
}
