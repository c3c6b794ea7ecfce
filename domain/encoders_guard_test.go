package domain

import (
	"reflect"
	"slices"
	"testing"
)

// The hand-written encoders (EncodeMetadata, EncodeKeyClaimed, Command.Canonical)
// are proven equal to encoding/json over random values of today's types. A field
// added to one of these types would be missed by them silently where it is
// omitempty or zero in the random values: this test fails first, naming the type
// whose encoder must learn the field (and whose equality test must generate it).
func TestHandWrittenEncodersKnowEveryField(t *testing.T) {
	for _, c := range []struct {
		typ     reflect.Type
		encoder string
		fields  []string
	}{
		{reflect.TypeFor[Metadata](), "EncodeMetadata", []string{"Key", "Command", "RequestHash", "Index", "Count", "At", "Origin", "Request", "Chain", "Schema", "Producer", "Claimed", "Subject", "EffectiveAt"}},
		{reflect.TypeFor[KeyClaimed](), "EncodeKeyClaimed", []string{"Key", "Command", "RequestHash", "Request", "Stream", "Revision"}},
		{reflect.TypeFor[Command](), "Command.Canonical", []string{"Type", "IdempotencyKey", "AccountID", "Currency", "Amount", "HasAmount", "OverdraftLimit", "Metadata", "TransferID", "From", "To", "HoldID", "ExpiresAt", "OriginalKey", "TransactionID", "Postings", "ExpectedRevision", "HasExpectedRevision", "UpTo", "EffectiveAt", "effectiveGiven", "At", "Origin", "Ref", "Reason", "Claimed", "ToRefusal"}},
	} {
		if got := fieldNames(c.typ); !slices.Equal(got, c.fields) {
			t.Errorf("%s has fields %v; %s was written for %v: teach it the change", c.typ, got, c.encoder, c.fields)
		}
	}
}

// fieldNames lists a struct type's fields in order, flattening embedded structs.
func fieldNames(t reflect.Type) []string {
	var out []string
	for f := range t.Fields() {
		if f.Anonymous && f.Type.Kind() == reflect.Struct {
			out = append(out, fieldNames(f.Type)...)
			continue
		}
		out = append(out, f.Name)
	}
	return out
}
