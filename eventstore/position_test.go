package eventstore

import (
	"fmt"
	"math"
	"testing"
)

func TestPositionStringRoundTrip(t *testing.T) {
	for _, p := range []Position{{}, {Commit: 1, Prepare: 2}, {Commit: 740123, Prepare: 98}, {Commit: math.MaxUint64, Prepare: math.MaxUint64}} {
		s := p.String()
		if want := fmt.Sprintf("%d/%d", p.Commit, p.Prepare); s != want {
			t.Errorf("%#v.String() = %q, want %q", p, s, want)
		}
		back, err := ParsePosition(s)
		if err != nil || back != p {
			t.Errorf("ParsePosition(%q) = %#v, %v; want %#v", s, back, err, p)
		}
	}
}
