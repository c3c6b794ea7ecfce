package audit

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// TestAGroupWithoutAHomeIsStoredByItsPage: a group no client's command
// began (no home), the last noted before a page ends, is a row of the page
// (flush's endGroup): without it, the group stays in memory past the page,
// out of a stop point's sets, and out of finish's when it is the history's
// last. (Review r493: with s.endGroup() deleted from flush every other test passed.)
func TestAGroupWithoutAHomeIsStoredByItsPage(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, devtest.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := newPGSets(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	f := NewFold()
	f.sets = s
	for i := range 2 { // key k begun twice in one stream, the second by no client
		f.Events++
		re := eventstore.RecordedEvent{ID: uuid.New(), Stream: "account-a", Revision: uint64(i)}
		s.group(f, re, "k")
		if i == 0 {
			s.home(f, re, "k", "h")
			s.claim(f, re, "k", claim{stream: "account-a", hash: "h"})
		}
	}
	if err := s.sync(ctx); err != nil {
		t.Fatal(err)
	}
	if s.copied[1] != 2 {
		t.Fatalf("audit_groups copied %d rows after the page, want 2", s.copied[1])
	}
	if err := s.finish(ctx, f); err != nil {
		t.Fatal(err)
	}
	if f.violations != 1 {
		t.Fatalf("violations %d %+v, want 1 (k begun twice in account-a)", f.violations, f.Violations)
	}
}
