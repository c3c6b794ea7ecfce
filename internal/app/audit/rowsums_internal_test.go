package audit

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/uuid"

	"github.com/ledgerworks/ledger/eventstore"
)

// TestExpectedSumsAsTheSetsQuery: the expected digests of the tables keyed
// by event ID, added up as the rows are noted (rowSums), equal what the
// sets' query (expectedRows) answers as of each seq a read model's
// expectation marked (a row noted at that seq after the mark included), and
// a history with an event ID stored twice is answered by the query, whose
// DISTINCT ON keeps one row of the key: the sums would count both.
func TestExpectedSumsAsTheSetsQuery(t *testing.T) {
	ctx := context.Background()
	pool := testPool(t)
	for _, twice := range []bool{false, true} {
		t.Run(fmt.Sprintf("an ID stored twice %v", twice), func(t *testing.T) {
			ps := testPGSets(t, pool)
			f := NewFold()
			f.sets = ps
			ids := make([]uuid.UUID, 6)
			for i := range ids {
				ids[i] = uuid.New()
			}
			if twice {
				ids[5] = ids[1]
			}
			for i, id := range ids {
				f.Events = int64(i + 1)
				ps.eventID(f, eventstore.RecordedEvent{ID: id})
				for _, table := range []string{"entries", "balance_history", "commands"} {
					ps.row(f, table, id.String(), accountsTag("a"), textNote(fmt.Sprint(table, i)))
				}
				if f.Events == 2 || f.Events == 4 {
					ps.sums.mark(f.Events)
					ps.row(f, "entries", "after the mark "+id.String(), accountsTag("a"), textNote("x")) // as a saga's settling at that seq
				}
			}
			ps.sums.mark(f.Events)
			if err := ps.finish(ctx, f); err != nil {
				t.Fatal(err)
			}
			for _, table := range []string{"entries", "balance_history", "commands"} {
				for _, seq := range []int64{2, 4, 6} {
					var got, query TableDiff
					if err := ps.expectedDigest(ctx, &got, table, "", seq, false); err != nil {
						t.Fatal(err)
					}
					unique := ps.idsUnique
					ps.idsUnique = false
					err := ps.expectedDigest(ctx, &query, table, "", seq, false)
					ps.idsUnique = unique
					if err != nil {
						t.Fatal(err)
					}
					if got.Expected != query.Expected || got.ExpectedDigest != query.ExpectedDigest {
						t.Fatalf("%s up to %d: %d rows, digest %s; the sets' query %d, %s", table, seq, got.Expected, got.ExpectedDigest, query.Expected, query.ExpectedDigest)
					}
					if _, summed := ps.expectedSum(table, "", seq, false); summed != (idKeyed[table] && !twice) {
						t.Fatalf("%s up to %d: answered by the sums %v", table, seq, summed)
					}
				}
			}
		})
	}
}
