package audit

import (
	"testing"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
)

// TestSnapshotReadAgain: a snapshot the fold reads again when it reaches its
// revision (readSnapshot) is checked as it is then: the same one passes, one
// changed since at that revision or moved back is named, one deleted since
// is not checked, and one replaced by a later one is not named when the
// fold does not reach that (it may be past the audit's head), as one listed
// beyond its stream is.
func TestSnapshotReadAgain(t *testing.T) {
	evs, stored := closedHoldHistory(t)
	stream, last := evs[0].Stream, evs[len(evs)-1].Revision
	encode := func(a *domain.Account) []byte {
		b, err := domain.EncodeSnapshot(stream, a)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	same := encode(stored)
	rich := *stored
	rich.Balance += 1000
	for name, c := range map[string]struct {
		listed, again eventstore.Snapshot
		err           error
		kind          string // the violation named, "" for none
	}{
		"the same":                      {listed: eventstore.Snapshot{Revision: last}, again: eventstore.Snapshot{Revision: last, Data: same}},
		"changed since at its revision": {listed: eventstore.Snapshot{Revision: last}, again: eventstore.Snapshot{Revision: last, Data: encode(&rich)}, kind: "snapshot_mismatch"},
		"moved back":                    {listed: eventstore.Snapshot{Revision: last}, again: eventstore.Snapshot{Revision: last - 1, Data: same}, kind: "snapshot_mismatch"},
		"deleted since":                 {listed: eventstore.Snapshot{Revision: last}, err: eventstore.ErrSnapshotNotFound},
		"replaced by a later one":       {listed: eventstore.Snapshot{Revision: last}, again: eventstore.Snapshot{Revision: last + 5, Data: same}},
		"listed beyond its stream":      {listed: eventstore.Snapshot{Revision: last + 5}, kind: "snapshot_beyond_stream"},
	} {
		listed := c.listed
		listed.Stream = stream
		if listed.Data = same; listed.Revision != last {
			beyond := *stored
			beyond.Revision = int64(listed.Revision)
			listed.Data = encode(&beyond)
		}
		f := NewFold()
		f.sets = noSets{}
		f.readSnapshot = func(string) (eventstore.Snapshot, error) {
			again := c.again
			again.Stream = stream
			return again, c.err
		}
		f.CheckSnapshots([]eventstore.Snapshot{listed})
		for _, re := range evs {
			f.Apply(re)
		}
		f.Finish()
		var kinds []string
		for _, v := range f.Violations {
			if v.Invariant == InvSnapshot {
				kinds = append(kinds, v.Kind)
			}
		}
		if (c.kind == "" && len(kinds) != 0) || (c.kind != "" && (len(kinds) != 1 || kinds[0] != c.kind)) {
			t.Errorf("a snapshot %s: %v, want %q named (%v)", name, kinds, c.kind, f.Violations)
		}
	}
}
