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
// as not found.
func (d *db) readableFrom(stream string, events []*record) (first int64, softDeleted bool) {
	d.mu.Lock()
	meta := d.streams["$$"+stream]
	var m streamMeta
	if meta != nil && len(meta.events) > 0 {
		_ = json.Unmarshal(meta.events[len(meta.events)-1].data, &m) // unreadable metadata is ignored
	}
	now := d.now()
	d.mu.Unlock()
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
		oldest := ticks(now.Add(-time.Duration(*m.MaxAge) * time.Second))
		for first < int64(len(events)) && events[first].created < oldest {
			first++
		}
	}
	return first, false
}
