package config

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strings"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/eventstore/kurrentdb"
	"github.com/ledgerworks/ledger/eventstore/postgres"
)

// Backend names the event store a URL selects.
type Backend string

const (
	BackendPostgres  Backend = "postgres"
	BackendKurrentDB Backend = "kurrentdb"
)

// EventStoreBackend tells which backend an event-store URL names: postgres:// and
// postgresql:// select PostgreSQL; kurrentdb://, kurrentdb+discover://, esdb:// and
// esdb+discover:// select KurrentDB.
func EventStoreBackend(rawURL string) (Backend, error) {
	scheme, _, ok := strings.Cut(rawURL, "://")
	if !ok {
		return "", fmt.Errorf("config: event store URL %q has no scheme (postgres://, kurrentdb:// or esdb://)", Redact(rawURL))
	}
	switch strings.ToLower(scheme) {
	case "postgres", "postgresql":
		return BackendPostgres, nil
	case "kurrentdb", "kurrentdb+discover", "kurrent", "kurrent+discover", "esdb", "esdb+discover":
		return BackendKurrentDB, nil
	}
	return "", fmt.Errorf("config: event store URL scheme %q: want postgres://, kurrentdb:// or esdb://", scheme)
}

// OpenEventStore opens the event store that rawURL names. The PostgreSQL store's
// schema must exist (migrations.Up).
func OpenEventStore(ctx context.Context, rawURL string, logger *slog.Logger) (eventstore.Store, error) {
	return openEventStore(ctx, rawURL, logger, false)
}

// openEventStore is OpenEventStore; readOnly opens a PostgreSQL store that
// refuses appends and costs a round trip less per connection (postgres.OpenReader).
func openEventStore(ctx context.Context, rawURL string, logger *slog.Logger, readOnly bool) (eventstore.Store, error) {
	b, err := EventStoreBackend(rawURL)
	if err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.Default()
	}
	switch b {
	case BackendPostgres:
		open := postgres.Open
		if readOnly {
			open = postgres.OpenReader
		}
		s, err := open(ctx, rawURL)
		if err != nil {
			return nil, fmt.Errorf("config: open event store %s: %w", Redact(rawURL), err)
		}
		return s, nil
	default:
		s, err := kurrentdb.Open(ctx, rawURL, KurrentDBOptions(logger)...)
		if err != nil {
			return nil, fmt.Errorf("config: open event store %s: %w", Redact(rawURL), err)
		}
		return s, nil
	}
}

// IsPostgresURL reports whether u is a postgres:// URL (not a keyword/value DSN).
func IsPostgresURL(u string) bool {
	p, err := url.Parse(u)
	return err == nil && (p.Scheme == "postgres" || p.Scheme == "postgresql")
}

// KurrentDBOptions are the ledger's options for the KurrentDB store: its
// client's log lines to logger, and its key streams append-checked (a claim is
// appended expecting no stream right after a read finds none, and the store
// refuses that append on a soft-deleted key stream), which saves a read on
// nearly every command on a busy account.
func KurrentDBOptions(logger *slog.Logger) []kurrentdb.Option {
	return []kurrentdb.Option{kurrentdb.WithLogger(logger), kurrentdb.WithAppendCheckedStreams(domain.KeyStreamPrefix)}
}
