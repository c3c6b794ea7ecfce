package audit

import (
	"encoding/json"
	"strings"
	"testing"
)

// The base64 search for expected_revision finds it at every alignment in the
// metadata's canonical request, and reads it back; a request without it is not
// found.
func TestNamesExpectedRevisionAtEveryAlignment(t *testing.T) {
	for pad := range 6 {
		req := `{"account_id":"` + strings.Repeat("a", 1+pad) + `","expected_revision":42,"type":"deposit"}`
		md, _ := json.Marshal(map[string]any{"key": "k", "request": []byte(req)})
		if !namesExpectedRevision(md) {
			t.Fatalf("not found in %s", md)
		}
		if v, err := expectedRevision(md); err != nil || v != 42 {
			t.Fatalf("read %d %v from %s", v, err, md)
		}
		plain, _ := json.Marshal(map[string]any{"key": "k", "request": []byte(strings.Replace(req, `"expected_revision":42,`, "", 1))})
		if namesExpectedRevision(plain) {
			t.Fatalf("found in %s", plain)
		}
	}
}
