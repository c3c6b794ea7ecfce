package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/platform/pgerr"
)

// A commit that waits for a synchronous standby and whose wait is cancelled
// (pg_cancel_backend, statement_timeout) is committed on the primary alone:
// PostgreSQL answers COMMIT as usual and says so only in a WARNING (syncrep.c,
// SyncRepWaitForLSN):
//
//	WARNING:  canceling wait for synchronous replication due to user request
//	DETAIL:  The transaction has already committed locally, but might not have been replicated to the standby.
//
// A promotion of the standby then loses the commit. So such a commit is not a
// success: the append returns ErrNotReplicated (an eventstore.ErrUnavailable,
// indefinite), and the caller decides it again by its event IDs, which finds it
// stored (idempotent) on whichever node holds it, or writes it anew.
//
// The warning arrives as a notice on the committing connection; pgx hands notices
// to the connection config's OnNotice, so a pool's connections must be made by a
// config that WatchSyncReplication prepared: each then keeps a syncWatch in its
// CustomData, which commit clears before COMMIT and reads after it. An append on a
// connection without one is refused before it writes anything.

// ErrNotReplicated is returned (wrapped, with eventstore.ErrUnavailable) by an
// append whose commit's wait for the synchronous standby was cancelled: it is
// committed on the primary and perhaps on no standby, so it may be lost in a
// failover. Its outcome is unknown; appending the same events again tells.
var ErrNotReplicated = errors.New("the wait for the synchronous standby was cancelled: committed on the primary, perhaps not replicated")

// syncWatchKey names a connection's syncWatch in its CustomData.
const syncWatchKey = "github.com/ledgerworks/ledger/eventstore/postgres.syncWatch"

// syncWatch is what one connection saw of its last commit's wait for the standby.
// It is read and written only by the goroutine using the connection (pgx calls
// OnNotice while that goroutine reads the connection's answers).
type syncWatch struct {
	english   bool           // the server's messages are untranslated (lc_messages)
	cancelled *pgconn.Notice // the warning, since the last reset
}

// WatchSyncReplication prepares cfg so that a Store on the pool made from it sees
// a commit whose wait for the synchronous standby was cancelled. It keeps the
// config's own OnNotice and AfterConnect, calling them after its own. Open uses
// it; a pool given to New must be made from a config it prepared. Each new
// connection costs one more round trip (SHOW lc_messages).
func WatchSyncReplication(cfg *pgxpool.Config) {
	cc := &cfg.ConnConfig.Config
	onNotice, afterConnect := cc.OnNotice, cc.AfterConnect
	cc.AfterConnect = func(ctx context.Context, c *pgconn.PgConn) error {
		res, err := c.Exec(ctx, "SHOW lc_messages").ReadAll()
		if err != nil {
			return fmt.Errorf("eventstore/postgres: show lc_messages: %w", err)
		}
		lc := ""
		if len(res) == 1 && len(res[0].Rows) == 1 && len(res[0].Rows[0]) == 1 {
			lc = string(res[0].Rows[0][0])
		}
		c.CustomData()[syncWatchKey] = &syncWatch{english: untranslated(lc)}
		if afterConnect != nil {
			return afterConnect(ctx, c)
		}
		return nil
	}
	cc.OnNotice = func(c *pgconn.PgConn, n *pgconn.Notice) {
		if w, ok := c.CustomData()[syncWatchKey].(*syncWatch); ok && syncWaitCancelled(n, w.english) {
			w.cancelled = n
		}
		if onNotice != nil {
			onNotice(c, n)
		}
	}
}

// untranslated tells an lc_messages under which PostgreSQL prints its messages
// in English: C, POSIX, en_*, or unset.
func untranslated(lc string) bool {
	lc = strings.ToLower(lc)
	return lc == "" || lc == "c" || lc == "posix" || strings.HasPrefix(lc, "c.") || strings.HasPrefix(lc, "en")
}

// syncWaitCancelled tells PostgreSQL's warnings of a cancelled wait for a
// synchronous standby: severity WARNING with SQLSTATE 01000 (warning) for a
// cancelled query, 57P01 (admin shutdown) for a terminated backend (which then
// closes the connection: an unknown outcome already), and the message
// "canceling [the] wait for synchronous replication ..." (PostgreSQL 10-17). The
// severity and the code are never translated, the message is: under a
// translating lc_messages every WARNING of those codes counts (COMMIT of an
// append raises no other; a false alarm costs a resend, a missed one money).
func syncWaitCancelled(n *pgconn.Notice, english bool) bool {
	if n.SeverityUnlocalized != "WARNING" || (n.Code != pgerr.Warning && n.Code != pgerr.AdminShutdown) {
		return false
	}
	return !english || strings.Contains(n.Message, "wait for synchronous replication")
}

// watchOf is the connection's syncWatch, or an error when its pool's config was
// not prepared by WatchSyncReplication.
func watchOf(c *pgconn.PgConn) (*syncWatch, error) {
	w, ok := c.CustomData()[syncWatchKey].(*syncWatch)
	if !ok {
		return nil, errors.New("eventstore/postgres: the pool's connections do not watch for a cancelled wait for the synchronous standby: make the pool from a config prepared by postgres.WatchSyncReplication")
	}
	return w, nil
}

// notReplicated is the error of a commit that saw the warning: indefinite.
func notReplicated(op string, n *pgconn.Notice) error {
	return fmt.Errorf("eventstore/postgres: %s: %w: %w: %w (%s: %s)", op, eventstore.ErrUnavailable, ErrNotReplicated, errUnknownOutcome, n.Message, n.Detail)
}

// durableSQL commits the marker when the server waits for a synchronous
// standby at all: with none, what a reader sees was flushed by its committer
// already, and the marker would cost a WAL flush per duplicate for nothing.
const durableSQL = `SELECT CASE WHEN current_setting('synchronous_standby_names') <> ''
	THEN pg_logical_emit_message(true, 'eventstore-durable', '') END`

// Durable implements eventstore.DurableReader: it commits a transactional
// logical message (pg_logical_emit_message: a WAL record and a transaction ID,
// at any wal_level, for any role; a logical decoding consumer sees it under the
// prefix eventstore-durable), whose commit waits for the synchronous standby up
// to its record, after every earlier commit. A transaction that only takes an
// ID writes no WAL and does not wait (seen: it returned at once with the standby
// frozen). One round trip; a cancelled wait is ErrNotReplicated, as an
// append's is.
func (s *Store) Durable(ctx context.Context) error {
	if s.closed() {
		return ErrClosed
	}
	c, err := s.pool.Acquire(ctx)
	if err != nil {
		return classify(ctx, "durable", err)
	}
	defer release(ctx, c)
	w, err := watchOf(c.Conn().PgConn())
	if err != nil {
		return err
	}
	w.cancelled = nil
	if _, err := c.Conn().Exec(ctx, durableSQL); err != nil {
		return classify(ctx, "durable", outcome(err))
	}
	if w.cancelled != nil {
		return notReplicated("durable", w.cancelled)
	}
	return nil
}
