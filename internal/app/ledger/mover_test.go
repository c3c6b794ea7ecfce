package ledger

import (
	"testing"

	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// TestMoverFollowsTheStore: the way money moves over several accounts is
// chosen once, from the store's capability: one append where the store writes
// several streams at once, sagas elsewhere.
func TestMoverFollowsTheStore(t *testing.T) {
	multi := New(devtest.Memory(t), Options{})
	defer multi.Close()
	if _, ok := multi.mover.(atomicMover); !ok {
		t.Fatalf("a store that appends to several streams at once: %T, want atomicMover", multi.mover)
	}
	single := New(devtest.WithoutMultiAppend(devtest.Memory(t)), Options{})
	defer single.Close()
	if _, ok := single.mover.(sagaMover); !ok {
		t.Fatalf("a store that appends to one stream at a time: %T, want sagaMover", single.mover)
	}
}
