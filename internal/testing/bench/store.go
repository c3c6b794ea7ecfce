package bench

import (
	"fmt"

	"github.com/ledgerworks/ledger/eventstore/kurrentdb/kurrenttest"
	"github.com/ledgerworks/ledger/internal/platform/config"
)

// The ledger's event stores (Config.EventStore), besides a KurrentDB URL.
const (
	// EventStorePostgres is the ledger's PostgreSQL database, as ledger dev runs.
	EventStorePostgres = "postgres"
	// EventStoreKurrentTest is the in-process KurrentDB test server
	// (eventstore/kurrentdb/kurrenttest): the real client and protocol, the
	// server in memory in the bench's process. Its figures are the ledger's
	// costs on the test server, not a real KurrentDB's.
	EventStoreKurrentTest = "kurrenttest"
)

// CheckEventStore refuses what is not an event store of the bench (see
// Config.EventStore; empty is the default, PostgreSQL).
func CheckEventStore(eventStore string) error {
	if eventStore == "" || eventStore == EventStorePostgres || eventStore == EventStoreKurrentTest {
		return nil
	}
	if b, err := config.EventStoreBackend(eventStore); err != nil || b != config.BackendKurrentDB {
		return fmt.Errorf("bench: event store %q: want %s, %s or a KurrentDB URL (kurrentdb://, esdb://)", config.Redact(eventStore), EventStorePostgres, EventStoreKurrentTest)
	}
	return nil
}

// startEventStore starts what the run's event store needs in this process (the
// KurrentDB test server for EventStoreKurrentTest) and returns the URL the
// ledger opens ("" for its PostgreSQL database), what stops it, and the test
// server's call counts (nil on another store).
func startEventStore(eventStore string) (url string, stop func(), calls *storeCalls, err error) {
	switch eventStore {
	case EventStorePostgres:
		return "", func() {}, nil, nil
	case EventStoreKurrentTest:
		s, err := kurrenttest.New()
		if err != nil {
			return "", nil, nil, fmt.Errorf("bench: start the KurrentDB test server: %w", err)
		}
		return s.URL(), s.Stop, &storeCalls{s: s}, nil
	}
	return eventStore, func() {}, nil, nil
}

// storeCalls counts the calls the in-process KurrentDB test server received
// (nil: not that store): what a command costs the store, counted rather than
// timed.
type storeCalls struct{ s *kurrenttest.Server }

// count returns the appends and the reads (stream reads and subscriptions)
// received so far.
func (c *storeCalls) count() (appends, reads int) {
	if c == nil {
		return 0, 0
	}
	return c.s.Requests(kurrenttest.MethodAppend), c.s.Requests(kurrenttest.MethodRead)
}

// since records in res the calls per answered command since the counts a0, r0.
func (c *storeCalls) since(res *PhaseResult, a0, r0 int) {
	if c == nil || res.Commands == 0 {
		return
	}
	a1, r1 := c.count()
	res.StoreAppendsPerCommand = float64(a1-a0) / float64(res.Commands)
	res.StoreReadsPerCommand = float64(r1-r0) / float64(res.Commands)
}

// isKurrent reports whether a run's event store (ReportConfig.EventStore) is
// KurrentDB: the test server or a URL.
func isKurrent(eventStore string) bool {
	return eventStore != "" && eventStore != EventStorePostgres
}

// storeName names a run's event store in a few words.
func storeName(eventStore string) string {
	switch eventStore {
	case "", EventStorePostgres:
		return "PostgreSQL"
	case EventStoreKurrentTest:
		return "KurrentDB test server"
	}
	return "KurrentDB"
}

// eventStoreLine describes the ledger's event store for the report: which one,
// and what its figures are.
func eventStoreLine(eventStore string) string {
	switch eventStore {
	case "", EventStorePostgres:
		return "PostgreSQL (the ledger's database)"
	case EventStoreKurrentTest:
		return fmt.Sprintf("the KurrentDB test server (eventstore/kurrentdb/kurrenttest: the real client over gRPC to a server in memory in this process, "+
			"modelling KurrentDB %s): the figures are the ledger's costs on the test server, NOT a real KurrentDB's; the server's CPU and heap count as the bench's (the key check's heap columns too); "+
			"read models and the baseline on PostgreSQL", kurrenttest.DefaultRelease)
	}
	return "KurrentDB at " + config.Redact(eventStore) + " (its CPU counts as other's when it runs on this machine); read models and the baseline on PostgreSQL"
}

// recallPath says how a run's event store finds the record of a key its
// aggregate has forgotten.
func recallPath(eventStore string) string {
	if isKurrent(eventStore) {
		return "through the key's claim stream key-<K>, then the account stream from the claimed revision"
	}
	return "by its event's derived ID"
}

// reportedEventStore is the event store as the report names it: a URL without
// its secrets.
func reportedEventStore(eventStore string) string {
	if eventStore == EventStorePostgres || eventStore == EventStoreKurrentTest {
		return eventStore
	}
	return config.Redact(eventStore)
}
