package kurrenttest

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"

	api "github.com/EventStore/EventStore-Client-Go/v4/protos/streams"
	"github.com/google/uuid"
)

// A soft delete (Streams.Delete) is StorageWriterService's WriteDelete with
// hardDelete false: after the IndexWriter's check of the expected version, the
// stream's metadata is replaced by {"$tb": EventNumber.DeletedStream}, so reads
// answer stream_not_found while the events stay in the log and in the index.
// The IndexWriter still compares event IDs through ReadPrepare, which ignores
// metadata: a no_stream append whose first event is the stream's event 0 is
// idempotent (answered without a position: ReadEvent, which honours metadata,
// cannot show the event), and one whose first event differs is written at the
// stream's next revision N+1, after which the server un-deletes the stream by
// rewriting its metadata with $tb = N+1 (SoftUndeleteStream), hiding the
// events before. A write to the metadata stream of a soft-deleted stream
// un-deletes it the same way, at its last revision + 1 (SoftUndeleteMetastream).
// The same in 24.10.5, 25.1.0 and 26.1.0 (26.1 adds an expected version
// SoftDeleted that the v4 client cannot send).

// softDelete writes the deleted marker into the stream's metadata.
func (d *db) softDelete(stream string, exp expected) (appendOutcome, *record) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := d.checkCommitLocked(stream, exp, []proposed{{id: uuid.New()}})
	if out.decision != decisionOK {
		return out, nil
	}
	meta := "$$" + stream
	if out.current < 0 && d.streams[meta].last() < 0 {
		out.decision = decisionWrongExpectedVersion
		return out, nil
	}
	r := d.writeMetaLocked(stream, []byte(`{"$tb":`+strconv.FormatInt(deletedStream, 10)+`}`))
	return out, r
}

// writeMetaLocked appends data as the stream's new metadata. The caller holds d.mu.
func (d *db) writeMetaLocked(stream string, data []byte) *record {
	meta := "$$" + stream
	return d.writeLocked(meta, d.streams[meta].last()+1, []proposed{{
		id: uuid.New(), eventType: "$metadata", contentType: "application/json", data: data,
	}})
}

// undeleteLocked rewrites the metadata of a soft-deleted stream with $tb at
// from, keeping its other properties (StorageWriterService.SoftUndeleteRawMeta).
// The caller holds d.mu.
func (d *db) undeleteLocked(stream string, from int64) {
	raw, _ := d.metaLocked(stream)
	props := map[string]json.RawMessage{}
	if json.Unmarshal(raw, &props) != nil {
		return // unreadable metadata is left as it is, as the server leaves it
	}
	props["$tb"] = json.RawMessage(strconv.FormatInt(from, 10))
	data, _ := json.Marshal(props)
	d.writeMetaLocked(stream, data)
}

// undeleteAfterWriteLocked applies the un-deletes a write causes: to a
// soft-deleted stream (wasDeleted), at the first revision written; to the
// metadata stream of a soft-deleted stream (metaOfDeleted), at that stream's
// last revision + 1. The caller holds d.mu.
func (d *db) undeleteAfterWriteLocked(stream string, first int64, wasDeleted, metaOfDeleted bool) {
	if wasDeleted {
		d.undeleteLocked(stream, first)
	}
	if orig, ok := strings.CutPrefix(stream, "$$"); ok && metaOfDeleted {
		d.undeleteLocked(orig, d.streams[orig].last()+1)
	}
}

// metaOfSoftDeletedLocked reports a metadata stream whose stream is soft-deleted.
// The caller holds d.mu.
func (d *db) metaOfSoftDeletedLocked(stream string) bool {
	orig, ok := strings.CutPrefix(stream, "$$")
	return ok && d.softDeletedLocked(orig)
}

// Delete implements Streams.Delete, the soft delete.
func (ss *streamsServer) Delete(ctx context.Context, req *api.DeleteReq) (*api.DeleteResp, error) {
	opts := req.GetOptions()
	r, err := ss.deleteStream(ctx, string(opts.GetStreamIdentifier().GetStreamName()), opts.GetExpectedStreamRevision(), ss.s.db.softDelete)
	if err != nil {
		return nil, err
	}
	return &api.DeleteResp{PositionOption: &api.DeleteResp_Position_{Position: &api.DeleteResp_Position{
		CommitPosition: r.pos, PreparePosition: r.pos,
	}}}, nil
}
