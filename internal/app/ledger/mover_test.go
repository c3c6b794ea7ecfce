package ledger

import (
	"fmt"
	"testing"

	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// multiOnly is a store that appends to several streams at once and locates
// no events.
type multiOnly struct {
	eventstore.Store
	eventstore.MultiAppender
}

// TestStrategiesFollowTheStore: how money moves over several accounts and how
// a forgotten key is found are chosen once, from the store's capabilities: one
// append where the store writes several streams at once, sagas elsewhere; a
// key by its event's ID where the store locates events, by its claim where it
// does neither, and never forgotten otherwise.
func TestStrategiesFollowTheStore(t *testing.T) {
	mem := devtest.Memory(t)
	for _, c := range []struct {
		name       string
		store      Store
		atomic     bool
		keys       keyFinder
		forgetKeys bool
	}{
		{"multi, locator", mem, true, &byEventID{}, true},
		{"multi only", multiOnly{mem, mem}, true, keepingAll{}, false},
		{"neither", devtest.WithoutMultiAppend(mem), false, byClaim{}, true},
	} {
		s := New(c.store, Options{})
		_, atomic := s.mover.(atomicMover)
		if atomic != c.atomic {
			t.Errorf("%s: mover %T, atomic %v", c.name, s.mover, c.atomic)
		}
		if gotT, wantT := typeName(s.keys), typeName(c.keys); gotT != wantT || s.keys.forgets() != c.forgetKeys || (s.keyLimit > 0) != c.forgetKeys {
			t.Errorf("%s: key finder %s (forgets %v, limit %d), want %s", c.name, gotT, s.keys.forgets(), s.keyLimit, wantT)
		}
		s.Close()
	}
}

func typeName(v any) string { return fmt.Sprintf("%T", v) }
