package audit

import (
	"context"
	"testing"

	"github.com/google/uuid"
)

// TestHeldRowsReachAuditRowsWhenRead: sets that hold idKeyed's rows
// (holdIDKeyed, a full audit's) copy the other tables' rows into audit_rows
// page by page and keep entries' and balance_history's out of it, across two
// pages, and a statement over commands' rows leaves them there; one over
// entries' copies them (loadHeld), and audit_rows then holds, row for row, what
// sets that hold nothing hold; a row noted after goes to audit_rows.
func TestHeldRowsReachAuditRowsWhenRead(t *testing.T) {
	ctx := context.Background()
	pool := testPool(t)
	held, plain := testPGSets(t, pool), testPGSets(t, pool)
	held.holdIDKeyed()
	f := NewFold()
	note := func(table string) {
		f.Events++
		id := uuid.New().String()
		for _, s := range []*pgSets{held, plain} {
			s.row(f, table, id, accountsTag("a"), textNote("d-"+id))
		}
	}
	for _, page := range [][]string{{"entries", "commands", "balance_history"}, {"balance_history", "transfers", "entries"}} {
		for _, table := range page {
			note(table)
		}
		for _, s := range []*pgSets{held, plain} {
			if err := s.flush(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := held.rowsOf(ctx, "commands"); err != nil { // a statement over commands' rows
		t.Fatal(err)
	}
	if got := rowsIn(t, held, "entries", "balance_history"); got != 0 || held.copied[rowsTable] != 2 || held.held.n != 4 {
		t.Fatalf("before the load: %d rows of entries and balance_history in audit_rows, %d copied, %d held; want 0, 2, 4", got, held.copied[rowsTable], held.held.n)
	}
	if err := held.rowsOf(ctx, "entries"); err != nil { // one over entries'
		t.Fatal(err)
	}
	note("entries")
	if err := plain.sync(ctx); err != nil {
		t.Fatal(err)
	}
	if err := held.sync(ctx); err != nil {
		t.Fatal(err)
	}
	if held.copied[rowsTable] != 7 || held.held.file != nil {
		t.Fatalf("after the load: %d rows copied, file %v; want 7, none", held.copied[rowsTable], held.held.file)
	}
	const all = `SELECT string_agg(format('%s %s %s %s %s', tbl, key, account, encode(digest, 'hex'), seq), E'\n' ORDER BY seq) FROM audit_rows`
	var got, want string
	if err := held.conn.QueryRow(ctx, all).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if err := plain.conn.QueryRow(ctx, all).Scan(&want); err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("audit_rows after the load:\n%s\nwithout holding:\n%s", got, want)
	}
}

// rowsIn counts audit_rows' rows of tables.
func rowsIn(t *testing.T, s *pgSets, tables ...string) int {
	t.Helper()
	var n int
	if err := s.conn.QueryRow(context.Background(), `SELECT count(*) FROM audit_rows WHERE tbl = ANY($1)`, tables).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
