package audit

import (
	"context"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/ledgerworks/ledger/eventstore"
)

// TestKeyChecksInPostgreSQLAsInMemory: the key checks of PostgreSQL's sets
// (pgKeyChecks, pgClaims; the groups' behind its probe) name what the Go maps'
// do of the same notes: a key begun twice in one stream, decided in a second
// stream, claimed twice, decided without a claim; and nothing of a clean set.
func TestKeyChecksInPostgreSQLAsInMemory(t *testing.T) {
	pool := testPool(t)
	for _, c := range []struct {
		name  string
		notes []keyNote
		want  int
	}{
		{"clean", []keyNote{{"s1", "k1", "h", "s1"}, {"s2", "k2", "h", "s2"}, {"s2", "k3", "h", "s2"}}, 0},
		{"begun twice in a stream", []keyNote{{"s1", "k1", "h", "s1"}, {"s2", "k2", "h", "s2"}, {"s1", "k1", "h", ""}}, 1},
		{"decided in two streams, claimed for the first", []keyNote{{"s1", "k1", "h", "s1"}, {"s2", "k1", "h", ""}}, 1},
		{"decided in two streams, claimed for the second", []keyNote{{"s1", "k1", "h", ""}, {"s2", "k1", "h", "s2"}}, 2},
		{"claimed twice, decided in two streams", []keyNote{{"s1", "k1", "h", "s1"}, {"key-k1", "k1", "h", "key-k1"}}, 3},
		{"the home's last hash claimed", []keyNote{{"s1", "k1", "a", ""}, {"s2", "k1", "c", ""}, {"s1", "k1", "b", "s1"}}, 2},
		{"the home's first hash claimed", []keyNote{{"s1", "k1", "a", ""}, {"s1", "k1", "b", ""}, {"key-k1", "k1", "x", "s1"}}, 3},
		{"decided without a claim", []keyNote{{"s1", "k1", "h", ""}}, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			mem := foldKeyNotes(t, newMemSets(), c.notes)
			ps := testPGSets(t, pool)
			pg := foldKeyNotes(t, ps, c.notes)
			if len(pg) != c.want || !reflect.DeepEqual(pg, mem) {
				t.Fatalf("PostgreSQL's sets named %d violations %+v, the Go maps' %+v; want %d, the same", len(pg), pg, mem, c.want)
			}
		})
	}
}

// keyNote is an event of a client's command: the first of its group in
// stream, noted as its key's home with the request hash hash and, when
// claim is set, claimed for that stream with the same hash.
type keyNote struct {
	stream, key, hash, claim string
}

// foldKeyNotes notes each event's group, home and claim through s, one event
// each, finishes, and returns the violations named, without event IDs (the
// sets name them alike; the events here are made up), by message (the maps
// name them as the events come, PostgreSQL's check by check).
func foldKeyNotes(t *testing.T, s historySets, notes []keyNote) []Violation {
	t.Helper()
	f := NewFold()
	f.sets = s
	for i, n := range notes {
		f.Events = int64(i + 1)
		re := eventstore.RecordedEvent{ID: uuid.New(), Stream: n.stream, Revision: uint64(i)}
		s.group(f, re, n.key)
		s.home(f, re, n.key, n.hash)
		if n.claim != "" {
			s.claim(f, re, n.key, claim{stream: n.claim, hash: n.hash})
		}
	}
	if err := s.finish(context.Background(), f); err != nil {
		t.Fatal(err)
	}
	out := f.Violations
	for i := range out {
		out[i].EventID = ""
	}
	slices.SortFunc(out, func(a, b Violation) int { return strings.Compare(a.Message, b.Message) })
	return out
}
