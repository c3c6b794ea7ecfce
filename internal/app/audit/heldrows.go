package audit

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"

	"github.com/ledgerworks/ledger/internal/platform/pgcopy"
)

// A full audit of the whole ledger compares the tables of idKeyed by the
// sums of their rows' hashes (rowSums), which the process adds up as the fold
// notes the rows: PostgreSQL reads those rows back only when a sum differs
// from the table's (differences names them), when an event ID is stored
// twice (expectedRows then keeps the last of each key), or when a stop point
// keeps the run's sets. So the sets hold them out of PostgreSQL (heldRows):
// each page's are written, in COPY's binary form, to a file of the process's
// own (unlinked at once, so that nothing is left of it when the process
// ends), and copied into audit_rows as one COPY only when a statement is
// about to read them (rowsOf, loadHeld): at 1,000,000 events 648,442 of
// the rows noted, 0.4 s of COPY audit_rows' 1.0 s of PostgreSQL's CPU
// (BENCHMARKS.md, "auditpg3"); the file is 131 bytes a row.

// heldRows are the rows of idKeyed's tables kept out of audit_rows.
type heldRows struct {
	on   bool     // rows of idKeyed's tables go to file, not audit_rows
	file *os.File // nil until the first page written
	n    int64    // rows in file
}

// holdIDKeyed makes the sets keep the rows of idKeyed's tables out of
// PostgreSQL until read (heldRows): a full audit of the whole ledger's.
func (s *pgSets) holdIDKeyed() { s.held.on = true }

// rowBuf is the buffer a row of table is noted in: the held rows' or
// audit_rows'.
func (s *pgSets) rowBuf(table string) *pgcopy.Buf {
	if s.held.on && idKeyed[table] {
		return &s.pgRows.held
	}
	return &s.pgRows.rows
}

// writeHeld writes a page's held rows to the file (behind the fold, as
// copyPage).
func (s *pgSets) writeHeld(page *pgcopy.Buf) error {
	if page.Tuples() == 0 {
		return nil
	}
	if s.held.file == nil {
		f, err := os.CreateTemp("", "ledger-audit-rows-*")
		if err != nil {
			return fmt.Errorf("audit: sets: held rows ($TMPDIR %s): %w", os.TempDir(), err)
		}
		if err := os.Remove(f.Name()); err != nil && s.log != nil { // open, unlinked: gone with the process
			s.log.Warn("audit: the held rows' file could not be unlinked: remove it when the audit ends", "file", f.Name(), "error", err)
		}
		s.held.file = f
	}
	if err := page.WriteTuplesTo(s.held.file); err != nil {
		return fmt.Errorf("audit: sets: held rows ($TMPDIR %s): %w", os.TempDir(), err)
	}
	s.held.n += int64(page.Tuples())
	return nil
}

// rowsOf stores every row noted of table in audit_rows before a statement
// reads them there: the held rows too, when table's are held.
func (s *pgSets) rowsOf(ctx context.Context, table string) error {
	if idKeyed[table] {
		return s.loadHeld(ctx)
	}
	return s.sync(ctx)
}

// loadHeld stores every row noted (sync) and copies the held rows into
// audit_rows, once: the rows the fold notes after go to audit_rows.
func (s *pgSets) loadHeld(ctx context.Context) error {
	if err := s.sync(ctx); err != nil {
		return err
	}
	s.held.on = false
	f := s.held.file
	if f == nil {
		return nil
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("audit: sets: held rows: %w", err)
	}
	sql := "COPY audit_rows (" + rowsColumns + ") FROM STDIN (FORMAT binary)"
	if _, err := s.conn.Conn().PgConn().CopyFrom(ctx, pgcopy.Tuples(bufio.NewReaderSize(f, 1<<20)), sql); err != nil {
		return fmt.Errorf("audit: sets: held rows: %w", err)
	}
	s.copied[rowsTable] += s.held.n
	s.dropHeld()
	return s.analyzeTables(ctx, "audit_rows")
}

// dropHeld closes the held rows' file (unlinked: gone with it).
func (s *pgSets) dropHeld() {
	if s.held.file != nil {
		_ = s.held.file.Close()
	}
	s.held.file, s.held.n = nil, 0
}
