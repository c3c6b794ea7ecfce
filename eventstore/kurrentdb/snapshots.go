package kurrentdb

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/EventStore/EventStore-Client-Go/v4/esdb"
	"github.com/google/uuid"

	"github.com/ledgerworks/ledger/eventstore"
)

// Snapshots (eventstore.SnapshotStore). The snapshots of a stream S live in a
// stream of their own, SnapshotStreamPrefix + S: a system stream (its name
// starts with "$"), so that "all" as this store reads it, and with it the
// projectors, the events publisher and the audit's fold, never sees them. Each
// snapshot is one event (type EvSnapshot) holding the snapshot's bytes, its
// revision and time in the metadata; the stream's metadata keeps only the last
// one ($maxCount 1), and a write never replaces a later revision (the append
// expects the revision it read). A system stream is written and read by
// $admins under the default ACLs (docs/kurrentdb.md): a user without that
// right gets ErrAccessDenied from WriteSnapshot, which the ledger logs, and
// goes on without snapshots.

// SnapshotStreamPrefix starts the stream of a stream's snapshots.
const SnapshotStreamPrefix = "$ledger-snapshot-"

// EvSnapshot is the type of a snapshot event.
const EvSnapshot = "LedgerSnapshot"

var _ eventstore.SnapshotStore = (*Store)(nil)

// snapshotScanPage is the page of ReadSnapshots' read of "all".
const snapshotScanPage = 1024

// snapshotMeta is a snapshot event's metadata.
type snapshotMeta struct {
	Stream   string    `json:"stream"`
	Revision uint64    `json:"revision"`
	Taken    time.Time `json:"taken"`
}

// WriteSnapshot keeps snap unless the stream has one at a later revision.
func (s *Store) WriteSnapshot(ctx context.Context, snap eventstore.Snapshot) error {
	snap.Taken = time.Now().UTC()
	meta, err := json.Marshal(snapshotMeta{Stream: snap.Stream, Revision: snap.Revision, Taken: snap.Taken})
	if err != nil {
		return err
	}
	stream := SnapshotStreamPrefix + snap.Stream
	for range 3 { // a concurrent writer moved the stream: read it again
		last, err := s.latestSnapshot(ctx, stream)
		expected := eventstore.NoStream
		switch {
		case errors.Is(err, eventstore.ErrSnapshotNotFound):
		case err != nil:
			return err
		case last.Revision >= snap.Revision:
			return nil
		default:
			expected = eventstore.Exact(last.at)
		}
		res, err := s.Append(ctx, stream, expected, []eventstore.EventData{{ID: uuid.New(), Type: EvSnapshot, Data: snap.Data, Metadata: meta}})
		if errors.Is(err, eventstore.ErrWrongExpectedRevision) {
			continue
		}
		if err != nil {
			return err
		}
		if res.FirstRevision == 0 {
			return s.keepOneSnapshot(ctx, stream)
		}
		return nil
	}
	return fmt.Errorf("kurrentdb: snapshot of %s: %w", snap.Stream, eventstore.ErrWrongExpectedRevision)
}

// keepOneSnapshot sets $maxCount 1 on a new snapshot stream: the server keeps
// (and scavenges down to) its last snapshot.
func (s *Store) keepOneSnapshot(ctx context.Context, stream string) error {
	var md esdb.StreamMetadata
	md.SetMaxCount(1)
	err := s.do(ctx, func(ctx context.Context, c *esdb.Client) error {
		_, err := c.SetStreamMetadata(ctx, stream, esdb.AppendToStreamOptions{}, md)
		return err
	})
	if err != nil {
		return mapError(ctx, err, "set the metadata of "+stream)
	}
	return nil
}

// ReadSnapshot returns the stream's latest snapshot, or ErrSnapshotNotFound.
func (s *Store) ReadSnapshot(ctx context.Context, stream string) (eventstore.Snapshot, error) {
	last, err := s.latestSnapshot(ctx, SnapshotStreamPrefix+stream)
	return last.Snapshot, err
}

// storedSnapshot is a snapshot and the revision of its event in its
// snapshot stream.
type storedSnapshot struct {
	eventstore.Snapshot
	at uint64
}

// latestSnapshot reads the last event of a snapshot stream.
func (s *Store) latestSnapshot(ctx context.Context, stream string) (storedSnapshot, error) {
	evs, err := s.ReadStream(ctx, stream, eventstore.EndOfStream, eventstore.Backwards, 1)
	if errors.Is(err, eventstore.ErrStreamNotFound) || (err == nil && len(evs) == 0) {
		return storedSnapshot{}, eventstore.ErrSnapshotNotFound
	}
	if err != nil {
		return storedSnapshot{}, err
	}
	snap, err := snapshotOf(evs[0])
	return storedSnapshot{Snapshot: snap, at: evs[0].Revision}, err
}

func snapshotOf(re eventstore.RecordedEvent) (eventstore.Snapshot, error) {
	var m snapshotMeta
	if re.Type != EvSnapshot || json.Unmarshal(re.Metadata, &m) != nil {
		return eventstore.Snapshot{}, fmt.Errorf("kurrentdb: %s@%d is not a snapshot (%s)", re.Stream, re.Revision, re.Type)
	}
	return eventstore.Snapshot{Stream: m.Stream, Revision: m.Revision, Data: re.Data, Taken: m.Taken}, nil
}

// ReadSnapshots lists up to max snapshots (max <= 0: all) of streams after
// `after`, in stream order: the audit's walk. KurrentDB has no index of
// streams by name, so this reads "all" with its system records once and keeps
// each snapshot stream's last snapshot (memory: one per snapshot stream).
func (s *Store) ReadSnapshots(ctx context.Context, after string, max int) ([]eventstore.Snapshot, error) {
	latest := map[string]eventstore.Snapshot{}
	from := esdb.AllPosition(esdb.Start{})
	last, haveLast := eventstore.Position{}, false
	for {
		page, err := s.readAllPage(ctx, from, esdb.Forwards, snapshotScanPage)
		if err != nil {
			return nil, err
		}
		for _, re := range page {
			if haveLast && re.Position.Compare(last) <= 0 {
				continue // a read from a position includes it
			}
			last, haveLast = re.Position, true
			if !strings.HasPrefix(re.Stream, SnapshotStreamPrefix) || re.Type != EvSnapshot {
				continue
			}
			snap, err := snapshotOf(re)
			if err != nil {
				return nil, err
			}
			if snap.Stream > after {
				latest[snap.Stream] = snap // later in the log: the later snapshot
			}
		}
		if len(page) < snapshotScanPage {
			break
		}
		from = allFrom(last)
	}
	out := make([]eventstore.Snapshot, 0, len(latest))
	for _, snap := range latest {
		out = append(out, snap)
	}
	slices.SortFunc(out, func(a, b eventstore.Snapshot) int { return strings.Compare(a.Stream, b.Stream) })
	if max > 0 && len(out) > max {
		out = out[:max]
	}
	return out, nil
}
