package audit

import (
	"context"
	"reflect"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// TestKeyChecksInPostgreSQLAsInMemory: the key checks of PostgreSQL's sets
// (pgKeyChecks, pgClaims; the groups' behind its probe) name what the Go maps'
// do of the same notes: a key begun twice in one stream, decided in a second
// stream, claimed twice, decided without a claim; and nothing of a clean set.
func TestKeyChecksInPostgreSQLAsInMemory(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, devtest.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	for _, c := range []struct {
		name  string
		notes []keyNote
		want  int
	}{
		{"clean", []keyNote{{"s1", "k1", true}, {"s2", "k2", true}, {"s2", "k3", true}}, 0},
		{"begun twice in a stream", []keyNote{{"s1", "k1", true}, {"s2", "k2", true}, {"s1", "k1", false}}, 1},
		{"decided in two streams", []keyNote{{"s1", "k1", true}, {"s2", "k1", false}}, 1},
		{"claimed twice, decided in two streams", []keyNote{{"s1", "k1", true}, {"key-k1", "k1", true}}, 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			mem := foldKeyNotes(t, newMemSets(), c.notes)
			ps, err := newPGSets(ctx, pool)
			if err != nil {
				t.Fatal(err)
			}
			defer ps.close()
			pg := foldKeyNotes(t, ps, c.notes)
			if len(pg) != c.want || !reflect.DeepEqual(pg, mem) {
				t.Fatalf("PostgreSQL's sets named %d violations %+v, the Go maps' %+v; want %d, the same", len(pg), pg, mem, c.want)
			}
		})
	}
}

// keyNote is an event of a client's command: the first of its group in
// stream, noted as its key's home and, with claimed, claimed for stream.
type keyNote struct {
	stream, key string
	claimed     bool
}

// foldKeyNotes notes each event's group, home and claim through s, one event
// each, finishes, and returns the violations named, without event IDs (the
// sets name them alike; the events here are made up).
func foldKeyNotes(t *testing.T, s historySets, notes []keyNote) []Violation {
	t.Helper()
	f := NewFold()
	f.sets = s
	for i, n := range notes {
		f.Events = int64(i + 1)
		re := eventstore.RecordedEvent{ID: uuid.New(), Stream: n.stream, Revision: uint64(i)}
		s.group(f, re, n.key)
		s.home(f, re, n.key, "h-"+n.key)
		if n.claimed {
			s.claim(f, re, n.key, claim{stream: n.stream, hash: "h-" + n.key})
		}
	}
	if err := s.finish(context.Background(), f); err != nil {
		t.Fatal(err)
	}
	out := f.Violations
	for i := range out {
		out[i].EventID = ""
	}
	return out
}
