package memory_test

import (
	"testing"

	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/eventstore/memory"
	"github.com/ledgerworks/ledger/eventstore/storetest"
)

var _ storetest.HeldAppender = (*memory.Store)(nil)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) eventstore.Store {
		s := memory.New()
		t.Cleanup(func() { s.Close() })
		return s
	})
}
