package postgres

import "testing"

// oldTransientCode is transientCode as it was before its SQLSTATEs moved to
// pgerr (its literals), the classification a move must keep.
func oldTransientCode(code string) bool {
	switch {
	case len(code) == 5 && code[:2] == "08":
		return true
	case len(code) == 5 && code[:2] == "53":
		return true
	}
	switch code {
	case "57P01", "57P02", "57P03", "57014", "40001", "40P01", "55P03":
		return true
	}
	return false
}

// TestTransientCodeUnchanged: every SQLSTATE (all two-character classes
// over [0-9A-Z], a set of subclasses, and short/long codes) is classified
// as before the move to pgerr: a swapped or dropped mapping fails it.
func TestTransientCodeUnchanged(t *testing.T) {
	const alpha = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
	subs := []string{"000", "001", "003", "004", "006", "007", "P01", "P02", "P03", "P04", "P05", "014", "505", "501", "100", "200", "300", "400"}
	n := 0
	for _, a := range alpha {
		for _, b := range alpha {
			for _, s := range subs {
				code := string(a) + string(b) + s
				n++
				if got, want := transientCode(code), oldTransientCode(code); got != want {
					t.Errorf("transientCode(%q) = %v, was %v", code, got, want)
				}
			}
			for _, code := range []string{string(a) + string(b), string(a) + string(b) + "0000", ""} {
				if got, want := transientCode(code), oldTransientCode(code); got != want {
					t.Errorf("transientCode(%q) = %v, was %v", code, got, want)
				}
			}
		}
	}
	// the named ones, each transient
	for _, c := range []string{"08000", "08006", "08001", "08P01", "53000", "53100", "53200", "53300", "53400", "57P01", "57P02", "57P03", "57014", "40001", "40P01", "55P03"} {
		if !transientCode(c) {
			t.Errorf("%s not transient", c)
		}
	}
	for _, c := range []string{"23505", "42501", "01000", "42P01", "40002", "40003", "57P04", "57P05", "55000", "0800", "530000"} {
		if transientCode(c) {
			t.Errorf("%s transient", c)
		}
	}
	t.Logf("%d codes compared", n)
}
