package kurrentdb_test

import (
	"os"
	"testing"

	"github.com/google/uuid"

	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/eventstore/kurrentdb"
	"github.com/ledgerworks/ledger/eventstore/kurrentdb/kurrenttest"
	"github.com/ledgerworks/ledger/eventstore/storetest"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// realServerEnv names a real KurrentDB for the conformance suite, for example
// kurrentdb://127.0.0.1:2113?tls=false (see docs/kurrentdb.md).
const realServerEnv = "LEDGER_TEST_KURRENTDB_URL"

// TestConformance runs the event-store suite against the in-process test server,
// a fresh one for every subtest.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) eventstore.Store {
		return devtest.KurrentDB(t)
	})
}

// TestConformanceSharedServer runs the suite with every subtest on one server
// and its own connection, as against a real KurrentDB.
func TestConformanceSharedServer(t *testing.T) {
	_, url := kurrenttest.Start(t)
	storetest.Run(t, func(t *testing.T) eventstore.Store { return devtest.OpenKurrentDB(t, url) })
}

// TestConformanceRealServer runs the suite against the KurrentDB named by
// LEDGER_TEST_KURRENTDB_URL, so that the test server is checked against the
// real one wherever one runs.
func TestConformanceRealServer(t *testing.T) {
	url := os.Getenv(realServerEnv)
	if url == "" {
		t.Skip(realServerEnv + " is unset: no real KurrentDB to run the suite against")
	}
	storetest.Run(t, func(t *testing.T) eventstore.Store { return devtest.OpenKurrentDB(t, url) })
}

// TestSubscribeFromStartRealServer is TestSubscribeFromStartOnAlmostEmptyLog
// against the KurrentDB named by LEDGER_TEST_KURRENTDB_URL, on streams of a
// prefix of its own (the server may hold other data): on 24.2, 24.6 and
// 24.10.0-24.10.4 (KDB-710) it shows the fix, on other releases that the
// backend does what the test server's default release says.
func TestSubscribeFromStartRealServer(t *testing.T) {
	url := os.Getenv(realServerEnv)
	if url == "" {
		t.Skip(realServerEnv + " is unset: no real KurrentDB to subscribe to")
	}
	subscribeFromStartThenAppend(t, devtest.OpenKurrentDB(t, url, kurrentdb.WithCheckpointWindow(2, 1)), "acct-"+uuid.NewString()[:8]+"-")
}
