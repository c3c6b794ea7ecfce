package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

//go:embed *.sql
var files embed.FS

// FS is the embedded migration files.
func FS() fs.FS { return files }

// lockID is the session advisory lock serialising concurrent Up calls. It is
// goose's own default lock ID, so that goose's CLI run with its session locker
// excludes Up as well.
const lockID = lock.DefaultLockID

// Up applies every migration not yet applied to the database at databaseURL. Two
// processes may call it at once: the second waits on a PostgreSQL advisory lock
// (as long as ctx allows) and then finds nothing left to do.
func Up(ctx context.Context, databaseURL string) error {
	return locked(ctx, databaseURL, func(p *goose.Provider) error {
		if _, err := p.Up(ctx); err != nil {
			return fmt.Errorf("migrations: up: %w", err)
		}
		return nil
	})
}

// DownTo runs the down of every applied migration above version, newest
// first, under Up's lock, and returns the versions it took down. Go
// migrations (00027) are this build's: goose's CLI over the SQL files alone
// stops at them, this does not.
func DownTo(ctx context.Context, databaseURL string, version int64) (down []int64, err error) {
	err = locked(ctx, databaseURL, func(p *goose.Provider) error {
		res, err := p.DownTo(ctx, version)
		for _, r := range res {
			down = append(down, r.Source.Version)
		}
		if err != nil {
			return fmt.Errorf("migrations: down to %d: %w", version, err)
		}
		return nil
	})
	return down, err
}

// Status lists this build's migrations on the database, applied or pending.
func Status(ctx context.Context, databaseURL string) ([]*goose.MigrationStatus, error) {
	var st []*goose.MigrationStatus
	err := withProvider(databaseURL, func(_ *sql.DB, p *goose.Provider) (err error) {
		if st, err = p.Status(ctx); err != nil {
			return fmt.Errorf("migrations: status: %w", err)
		}
		return nil
	})
	return st, err
}

// locked runs f with this build's provider under the advisory lock that
// serialises migrations (lockID), held by a session of its own.
func locked(ctx context.Context, databaseURL string, f func(*goose.Provider) error) error {
	return withProvider(databaseURL, func(db *sql.DB, p *goose.Provider) (err error) {
		conn, err := db.Conn(ctx)
		if err != nil {
			return fmt.Errorf("migrations: connect: %w", err)
		}
		defer conn.Close() // also ends the session holding the lock, should unlocking fail
		// A blocking lock, not goose's polling session locker (which retries every few
		// seconds): a waiting process goes on the moment the first one is done.
		if _, err := conn.ExecContext(ctx, "SELECT pg_advisory_lock($1)", lockID); err != nil {
			return fmt.Errorf("migrations: lock: %w", err)
		}
		defer func() {
			uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			if _, uerr := conn.ExecContext(uctx, "SELECT pg_advisory_unlock($1)", lockID); uerr != nil {
				err = errors.Join(err, fmt.Errorf("migrations: unlock: %w", uerr))
			}
		}()
		return f(p)
	})
}

// withProvider runs f with this build's provider on the database at databaseURL.
func withProvider(databaseURL string, f func(*sql.DB, *goose.Provider) error) error {
	db, err := sql.Open("pgx", databaseURL)
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	defer db.Close()
	p, err := NewProvider(db)
	if err != nil {
		return err
	}
	return f(db, p)
}

// NewProvider is goose's provider of this build's migrations (the SQL files
// and the Go ones) on db.
func NewProvider(db *sql.DB) (*goose.Provider, error) {
	p, err := goose.NewProvider(goose.DialectPostgres, db, files, goose.WithDisableGlobalRegistry(true), goose.WithGoMigrations(subjectsMigration()))
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	return p, nil
}

// Check returns an error unless the database at databaseURL has every
// migration of this build applied: a build decides on what they write (00027
// gives old events the subjects the ledger's recall reads), so it must not
// serve a database below them (`ledger serve --migrate=false` on one the
// operator did not migrate). The error names the versions missing and the
// command that applies them. An older build writing after they ran is not
// seen here (docs/operations.md, "Upgrading").
func Check(ctx context.Context, databaseURL string) error {
	db, err := sql.Open("pgx", databaseURL)
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	defer db.Close()
	p, err := NewProvider(db)
	if err != nil {
		return err
	}
	// One query for the usual answer (every version recorded); goose's Status,
	// a query per migration (27 round trips before `ledger replay`'s first
	// line), only to name what is missing. Both count a version as applied
	// when goose_db_version has a row for it.
	if pending, err := p.HasPending(ctx); err == nil && !pending {
		return nil
	}
	st, err := p.Status(ctx)
	if err != nil {
		return fmt.Errorf("migrations: status: %w", err)
	}
	var missing []string
	for _, m := range st {
		if m.State != goose.StatePending {
			continue
		}
		missing = append(missing, fmt.Sprintf("%05d", m.Source.Version))
	}
	if len(missing) > 0 {
		return fmt.Errorf("migrations: the database lacks this build's migrations %s: apply them with `ledger serve --migrate` (LEDGER_MIGRATE=true, the default), then start again", strings.Join(missing, ", "))
	}
	return nil
}
