package natsapi

import (
	"reflect"
	"slices"
	"testing"
)

// encodeReply is proven equal to json.Marshal(wire(r)) over random replies of
// today's types. A field added to one of them would be missed silently where it
// is omitempty or zero in those replies: this test fails first (the reply's
// own types: reply.TestAppendJSONKnowsEveryField).
func TestEncodeReplyKnowsEveryField(t *testing.T) {
	for _, c := range []struct {
		typ    reflect.Type
		fields []string
	}{
		{reflect.TypeFor[WireReply](), []string{"Reply", "Stream", "Error"}},
		{reflect.TypeFor[WireError](), []string{"Code", "Description"}},
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
