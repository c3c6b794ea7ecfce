package config

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/urfave/cli/v3"

	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/migrations"
	"github.com/ledgerworks/ledger/projections"
)

// StoreURLs resolves the event store and read-model database URLs from
// --eventstore-url and --database-url (their environment variables), or the
// dev.json of the running `ledger dev` that --data-dir names. The event store
// defaults to the read-model database. Without an event store, or without a
// read-model database when readModels, it is a usage error (exit 2).
func StoreURLs(cmd *cli.Command, readModels bool) (es, db string, err error) {
	db, err = FromDataDir(cmd, FlagDatabaseURL, func(i DevInfo) string { return i.DatabaseURL })
	if err != nil {
		return "", "", err
	}
	es, err = FromDataDir(cmd, FlagEventStoreURL, func(i DevInfo) string { return i.EventStoreURL })
	if err != nil {
		return "", "", err
	}
	if readModels && db == "" {
		return "", "", Exit(2, errors.New("no read-model database: set --database-url (LEDGER_DATABASE_URL) or --data-dir of a running `ledger dev`"))
	}
	if es == "" {
		es = db
	}
	if es == "" {
		return "", "", Exit(2, errors.New("no event store: set --eventstore-url (LEDGER_EVENTSTORE_URL), --database-url, or --data-dir of a running `ledger dev`"))
	}
	return es, db, nil
}

// Stores are what a command opens: the event store and, when asked for, the
// read-model database.
type Stores struct {
	EventStoreURL, DatabaseURL string
	Store                      eventstore.Store
	Pool                       *pgxpool.Pool // nil unless asked for and named
}

// Opening says what OpenStores opens.
type Opening struct {
	// ReadModels opens the read-model pool, and requires its URL; IfNamed opens
	// it only when a URL is given.
	ReadModels, IfNamed bool
	// Migrate applies the migrations first: to the read-model database, and to
	// the event store when it is another PostgreSQL database. Without it,
	// OpenStores refuses databases missing some (CheckStores).
	Migrate bool
	// ReadOnly: the process never appends to the event store (ledger
	// replay); on PostgreSQL its store refuses appends and opens each
	// connection with a round trip less.
	ReadOnly bool
	// Audit opens the read-model pool for an audit (projections.NewAuditPool).
	Audit bool
}

// OpenStores resolves the URLs (StoreURLs) and opens what o asks for. The
// caller closes what it returns.
func OpenStores(ctx context.Context, cmd *cli.Command, log *slog.Logger, o Opening) (*Stores, error) {
	es, db, err := StoreURLs(cmd, o.ReadModels && !o.IfNamed)
	if err != nil {
		return nil, err
	}
	s := &Stores{EventStoreURL: es, DatabaseURL: db}
	openPool := o.ReadModels && db != ""
	if o.Migrate {
		err = MigrateStores(ctx, es, db, log)
	} else {
		err = CheckStores(ctx, es, db)
	}
	if err != nil {
		return nil, err
	}
	if openPool {
		newPool := projections.NewPool
		if o.Audit {
			newPool = projections.NewAuditPool
		}
		if s.Pool, err = newPool(ctx, db); err == nil {
			err = s.Pool.Ping(ctx)
		}
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("read-model database %s: %w", Redact(db), err)
		}
	}
	if s.Store, err = openEventStore(ctx, es, log, o.ReadOnly); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// MigrateStores applies the migrations to the read-model database db (when
// named) and to the event store es when it is another PostgreSQL database.
func MigrateStores(ctx context.Context, es, db string, log *slog.Logger) error {
	for _, u := range postgresURLs(es, db) {
		if err := migrations.Up(ctx, u); err != nil {
			return err
		}
		log.Info("migrations applied", "database", Redact(u))
	}
	return nil
}

// CheckStores returns an error (exit 2) unless the databases MigrateStores
// migrates have every migration of this build applied (migrations.Check).
func CheckStores(ctx context.Context, es, db string) error {
	for _, u := range postgresURLs(es, db) {
		if err := migrations.Check(ctx, u); err != nil {
			return Exit(2, fmt.Errorf("%s: %w", Redact(u), err))
		}
	}
	return nil
}

// postgresURLs are the databases a build migrates: db when named, and es when
// it is another PostgreSQL database.
func postgresURLs(es, db string) []string {
	var urls []string
	if db != "" {
		urls = append(urls, db)
	}
	if es != db && IsPostgresURL(es) {
		urls = append(urls, es)
	}
	return urls
}

// Close closes what OpenStores opened.
func (s *Stores) Close() {
	if s.Store != nil {
		s.Store.Close()
	}
	if s.Pool != nil {
		s.Pool.Close()
	}
}
