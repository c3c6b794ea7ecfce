package kurrenttest

import (
	"encoding/json"
	"time"
)

// streamMeta is what a stream's metadata (the last event of $$stream) says
// about which of its events may be read.
type streamMeta struct {
	TruncateBefore *int64 `json:"$tb"`
	MaxAge         *int64 `json:"$maxAge"` // seconds
	MaxCount       *int64 `json:"$maxCount"`
}

// readableFrom is the first revision of the stream a read may return, after
// its metadata's $tb, $maxCount and $maxAge (events older than that many
// seconds), as the server's reads apply them before any scavenge: the events
// before it are left out, the revisions of the rest unchanged. softDeleted
// reports a $tb of the deleted-stream marker (a soft delete): the stream reads
// as not found. The rules are the same in 24.10.5, 25.1.0 and 26.1.0
// (IndexReader: ReadEvent, ReadStreamEventsForward and Backward).
func (d *db) readableFrom(stream string, events []*record) (first int64, softDeleted bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.readableFromLocked(stream, events)
}

// readableFromLocked is readableFrom. The caller holds d.mu.
func (d *db) readableFromLocked(stream string, events []*record) (first int64, softDeleted bool) {
	_, m := d.metaLocked(stream)
	if m.TruncateBefore != nil {
		if *m.TruncateBefore == deletedStream {
			return 0, true
		}
		first = max(first, *m.TruncateBefore)
	}
	if m.MaxCount != nil {
		first = max(first, int64(len(events))-*m.MaxCount)
	}
	if m.MaxAge != nil {
		oldest := ticks(d.now().Add(-time.Duration(*m.MaxAge) * time.Second))
		for first < int64(len(events)) && events[first].created < oldest {
			first++
		}
	}
	return first, false
}

// metaLocked is the stream's metadata: the last event of $$stream, raw and
// decoded (unreadable metadata is ignored, as the server ignores it). The
// caller holds d.mu.
func (d *db) metaLocked(stream string) (raw []byte, m streamMeta) {
	meta := d.streams["$$"+stream]
	if meta == nil || len(meta.events) == 0 {
		return nil, m
	}
	raw = meta.events[len(meta.events)-1].data
	_ = json.Unmarshal(raw, &m)
	return raw, m
}

// softDeletedLocked reports a soft-deleted stream: its metadata's $tb is the
// deleted-stream marker (IndexWriter.IsSoftDeleted). The caller holds d.mu.
func (d *db) softDeletedLocked(stream string) bool {
	_, m := d.metaLocked(stream)
	return m.TruncateBefore != nil && *m.TruncateBefore == deletedStream
}

// hiddenLocked reports whether reads cannot show the stream's event at rev
// (IndexReader.ReadEvent): soft-deleted, or cut by $tb, $maxCount or $maxAge.
// The caller holds d.mu.
func (d *db) hiddenLocked(stream string, rev int64) bool {
	s := d.streams[stream]
	if s == nil || rev < 0 || rev >= int64(len(s.events)) {
		return true
	}
	first, softDeleted := d.readableFromLocked(stream, s.events)
	return softDeleted || rev < first
}
