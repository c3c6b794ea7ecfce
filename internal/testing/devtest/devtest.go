// Package devtest is the tests' one environment: the real servers the ledger
// runs on (an embedded nats-server with JetStream in a temp dir, a fresh
// migrated PostgreSQL database from internal/testing/pgtest and its event
// store), a controllable Clock, and a bounded Eventually.
//
// Packages whose own (in-package) tests import devtest cannot be imported by
// it: internal/app/ledger, internal/adapters/natsapi, internal/platform/config.
package devtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/eventstore/postgres"
	"github.com/ledgerworks/ledger/internal/platform/embednats"
	"github.com/ledgerworks/ledger/internal/testing/pgtest"
	"github.com/ledgerworks/ledger/migrations"
)

// NATS starts an embedded nats-server with JetStream for t on a free port.
func NATS(t testing.TB) *server.Server {
	t.Helper()
	s, err := embednats.Start(embednats.Options{Addr: "127.0.0.1:0", StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s
}

// NATSWith starts a nats-server on a free port of 127.0.0.1 with the test's own
// options (authentication, TLS, JetStream...), and stops it when t ends.
func NATSWith(t testing.TB, opts *server.Options) *server.Server {
	t.Helper()
	return natsWith(t, opts, nil)
}

// NATSLogged is NATSWith with the server's log (notice level and above, where
// it reports authorization and permissions violations) kept for the test.
func NATSLogged(t testing.TB, opts *server.Options) (*server.Server, *ServerLog) {
	t.Helper()
	log := &ServerLog{}
	return natsWith(t, opts, log), log
}

func natsWith(t testing.TB, opts *server.Options, log server.Logger) *server.Server {
	t.Helper()
	opts.Host, opts.Port, opts.NoLog, opts.NoSigs = "127.0.0.1", -1, true, true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	if log != nil {
		s.SetLogger(log, false, false)
	}
	go s.Start()
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	return s
}

// Connect connects to s; the connection is closed when t ends.
func Connect(t testing.TB, s *server.Server, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(s.ClientURL(), append([]nats.Option{nats.MaxReconnects(-1)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// DatabaseURL is a fresh database for t with the migrations applied.
func DatabaseURL(t testing.TB) string {
	t.Helper()
	url := pgtest.URL(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := migrations.Up(ctx, url); err != nil {
		t.Fatal(err)
	}
	return url
}

// Store opens the PostgreSQL event store at url; it is closed when t ends.
func Store(t testing.TB, url string) *postgres.Store {
	t.Helper()
	s, err := postgres.Open(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// Eventually polls cond every 5ms until it holds, failing t after timeout: the
// one such helper of the tests.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// ReadAll reads every event of "all" in st, page by page: the tests' one
// read-all loop.
func ReadAll(t testing.TB, st eventstore.AllReader) []eventstore.RecordedEvent {
	t.Helper()
	const page = 1000
	var out []eventstore.RecordedEvent
	after := eventstore.Start
	for {
		evs, err := st.ReadAll(context.Background(), after, page)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, evs...)
		if len(evs) < page {
			return out
		}
		after = evs[len(evs)-1].Position
	}
}

// StreamEvents reads every event of a stream in st; none when it does not exist.
func StreamEvents(t testing.TB, st eventstore.StreamReader, stream string) []eventstore.RecordedEvent {
	t.Helper()
	evs, err := st.ReadStream(context.Background(), stream, 0, eventstore.Forwards, 0)
	if err != nil && !errors.Is(err, eventstore.ErrStreamNotFound) {
		t.Fatal(err)
	}
	return evs
}
