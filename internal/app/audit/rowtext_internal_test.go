package audit

import (
	"fmt"
	"strconv"
	"testing"
)

// rowText.str renders every string as strconv.Quote does, through its
// printable-ASCII path or through Quote: the edges of that path (a quote, a
// backslash, the first and last printable bytes and their neighbours, other
// scripts, bytes that are not UTF-8) included.
func TestRowTextStrQuotesAsStrconv(t *testing.T) {
	for _, s := range []string{"", "acc-1", "0193a1f2-7c4e-7d2a-9b1e-3f5a6c7d8e9f", " ~", `a"b`, `a\b`, "a\x1fb", "a\x7fb",
		"tab\there", "line\n", "café", "ключ", "\xff\xfe", "emoji \U0001F600", "\u00a0nbsp", "\u2028"} {
		var buf [rowTextBytes]byte
		if got, want := string(newRowText(&buf).str(s).b), strconv.Quote(s); got != want {
			t.Errorf("str(%q) = %s, want %s", s, got, want)
		}
	}
}

// TestInternedScansAsAString: interned reads a column's bytes as a string
// does, one string per value up to internedMax, and refuses NULL.
func TestInternedScansAsAString(t *testing.T) {
	s := interned{names: map[string]string{}}
	if err := s.ScanBytes(nil); err == nil {
		t.Fatal("NULL scanned into a string")
	}
	for i := range 2 * internedMax {
		want := fmt.Sprintf("v%d", i%(internedMax+10))
		b := []byte(want)
		if err := s.ScanBytes(b); err != nil || s.v != want {
			t.Fatalf("%q scanned as %q, %v", want, s.v, err)
		}
		b[0] = 'x' // the driver reuses its buffer
		if s.v != want {
			t.Fatalf("%q changed with the driver's buffer: %q", want, s.v)
		}
	}
	if len(s.names) != internedMax {
		t.Fatalf("%d values kept, want the bound %d", len(s.names), internedMax)
	}
}
