package audit

import (
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
