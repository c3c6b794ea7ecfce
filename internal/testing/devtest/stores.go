package devtest

import (
	"context"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/eventstore/kurrentdb"
	"github.com/ledgerworks/ledger/eventstore/kurrentdb/kurrenttest"
	"github.com/ledgerworks/ledger/eventstore/memory"
	"github.com/ledgerworks/ledger/eventstore/postgres"
)

// The event stores of the tests: one of each backend, and Stores, which runs a
// test on a store of every backend (or of those with a capability).

// Memory is a fresh in-memory event store, closed when t ends.
func Memory(t testing.TB) *memory.Store {
	s := memory.New()
	t.Cleanup(func() { s.Close() })
	return s
}

// Postgres is the PostgreSQL event store on a fresh database with the
// migrations applied (DatabaseURL); it is closed when t ends.
func Postgres(t testing.TB) *postgres.Store {
	t.Helper()
	return Store(t, DatabaseURL(t))
}

// KurrentDB is the KurrentDB event store on a fresh in-process test server
// (eventstore/kurrentdb/kurrenttest); it is closed when t ends.
func KurrentDB(t testing.TB) *kurrentdb.Store {
	t.Helper()
	_, url := kurrenttest.Start(t)
	return OpenKurrentDB(t, url)
}

// OpenKurrentDB opens the KurrentDB event store at url (a test server's, or a
// real KurrentDB's); it is closed when t ends, and an error closing it fails t.
func OpenKurrentDB(t testing.TB, url string, opts ...kurrentdb.Option) *kurrentdb.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := kurrentdb.Open(ctx, url, opts...)
	if err != nil {
		t.Fatalf("open %s: %v", url, err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return s
}

// Capability selects the backends Stores runs a test on.
type Capability uint8

const (
	// AnyStore admits every backend.
	AnyStore Capability = iota
	// MultiAppend admits the stores that append to several streams in one
	// transaction (eventstore.MultiAppender), on which the ledger decides a
	// transfer or a transaction in one append: memory and PostgreSQL.
	MultiAppend
	// SingleAppend admits the stores without, on which the ledger runs
	// transfers and transactions as sagas: KurrentDB, and the memory and
	// PostgreSQL stores with their multi-stream append hidden
	// (WithoutMultiAppend).
	SingleAppend
)

// backend is one store of Stores.
type backend struct {
	name  string
	multi bool // its store is an eventstore.MultiAppender
	open  func(t testing.TB) eventstore.Store
}

var backends = []backend{
	{"memory", true, func(t testing.TB) eventstore.Store { return Memory(t) }},
	{"postgres", true, func(t testing.TB) eventstore.Store { return Postgres(t) }},
	{"memory-saga", false, func(t testing.TB) eventstore.Store { return WithoutMultiAppend(Memory(t)) }},
	{"postgres-saga", false, func(t testing.TB) eventstore.Store { return WithoutMultiAppend(Postgres(t)) }},
	{"kurrentdb", false, func(t testing.TB) eventstore.Store { return KurrentDB(t) }},
}

// Stores runs run on a fresh store of every backend that c admits, each in a
// subtest of t named after its backend: memory, postgres, memory-saga,
// postgres-saga, kurrentdb.
func Stores(t *testing.T, c Capability, run func(t *testing.T, st eventstore.Store)) {
	t.Helper()
	for _, b := range backends {
		if (c == MultiAppend && !b.multi) || (c == SingleAppend && b.multi) {
			continue
		}
		t.Run(b.name, func(t *testing.T) {
			st := b.open(t)
			if MultiAppends(st) != b.multi {
				t.Fatalf("the %s store's multi-stream append: %v, want %v", b.name, MultiAppends(st), b.multi)
			}
			run(t, st)
		})
	}
}

// MultiAppends reports whether st appends to several streams in one
// transaction (eventstore.MultiAppender): the ledger then decides a transfer or
// a transaction in one append, and runs it as a saga otherwise.
func MultiAppends(st any) bool {
	_, ok := st.(eventstore.MultiAppender)
	return ok
}

// ReportsIdempotent reports whether st tells an append of events it already
// holds from a fresh one (eventstore.AppendResult.Idempotent): the KurrentDB
// server answers both alike, so a ledger that lost a race to append the same
// decision cannot tell it lost.
func ReportsIdempotent(st eventstore.Store) bool {
	_, kurrent := st.(*kurrentdb.Store)
	return !kurrent
}

// WithoutMultiAppend is st with every capability beyond eventstore.Store's
// hidden, its multi-stream append among them (and its snapshots and event
// lookups): the ledger then runs transfers and transactions on it as sagas, as
// it does on KurrentDB.
func WithoutMultiAppend(st eventstore.Store) eventstore.Store { return storeOnly{st} }

type storeOnly struct{ eventstore.Store }
