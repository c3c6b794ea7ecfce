package kurrenttest

import (
	"math"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
)

// deletedStream is KurrentDB's EventNumber.DeletedStream: the revision of a
// tombstone and the "current version" of a tombstoned stream.
const deletedStream = math.MaxInt64

// firstLogPosition is where the first event of a fresh log sits. A real log starts
// with epoch and system records, so positions never start at zero.
const firstLogPosition = 1 << 10

// ticksPerSecond: .NET ticks are 100 ns.
const ticksPerSecond = int64(time.Second / 100)

type record struct {
	id          uuid.UUID
	stream      string
	revision    int64  // deletedStream for a tombstone
	pos         uint64 // where the record starts
	end         uint64 // where the next one starts (its post-position)
	eventType   string
	contentType string
	data        []byte
	meta        []byte
	created     int64 // 100 ns ticks since the Unix epoch
}

type streamState struct {
	events     []*record // events[i].revision == i
	tombstoned bool
}

// last returns the stream's last event number: -1 when it has no events,
// deletedStream when it is tombstoned (IndexWriter.GetStreamLastEventNumber).
func (s *streamState) last() int64 {
	if s == nil {
		return -1
	}
	if s.tombstoned {
		return deletedStream
	}
	return int64(len(s.events)) - 1
}

type expectedKind uint8

const (
	expectAny expectedKind = iota
	expectNoStream
	expectStreamExists
	expectRevision
)

type expected struct {
	kind expectedKind
	rev  uint64
}

// version is the expected version as the server's IndexWriter sees it:
// -1 for no stream, the revision for an exact one.
func (e expected) version() int64 {
	if e.kind == expectNoStream {
		return -1
	}
	return int64(e.rev)
}

type proposed struct {
	id          uuid.UUID
	eventType   string
	contentType string
	data        []byte
	meta        []byte
}

type decision uint8

const (
	decisionOK decision = iota
	decisionIdempotent
	decisionWrongExpectedVersion
	decisionCorruptedIdempotency // answered as a wrong expected version
	decisionDeleted
	// decisionNotReady is IdempotentNotReady: the batch matches a write that is
	// not yet replicated. Nothing is written and the request times out.
	decisionNotReady
)

type appendOutcome struct {
	decision decision
	current  int64 // the stream's last event number before the append (-1: none)
	first    int64 // first and last event numbers written (or originally written)
	last     int64
	pos      uint64 // the last event's log position
	hasPos   bool
	pending  bool // written but not yet replicated (see db.held)
}

type idInfo struct {
	stream   string
	revision int64
}

// idCache is the IndexWriter's committed-events cache: a bounded map of recently
// written event IDs. The real one is bounded by memory (ESConsts.CommitedEventsMemCacheLimit,
// 8 MiB); this one by a count. Only Any and StreamExists appends consult it.
type idCache struct {
	capacity int
	byID     map[uuid.UUID]idInfo
	order    []uuid.UUID // insertion order, for eviction
}

func newIDCache(capacity int) *idCache {
	return &idCache{capacity: capacity, byID: make(map[uuid.UUID]idInfo)}
}

func (c *idCache) put(id uuid.UUID, info idInfo) {
	if c.capacity <= 0 {
		return
	}
	if _, ok := c.byID[id]; !ok {
		c.order = append(c.order, id)
	}
	c.byID[id] = info // PutRecord(throwOnDuplicate: false): the latest write wins
	for len(c.order) > c.capacity {
		delete(c.byID, c.order[0])
		c.order = c.order[1:]
	}
}

func (c *idCache) get(id uuid.UUID) (idInfo, bool) {
	info, ok := c.byID[id]
	return info, ok
}

// db is the server's log: every event in commit order, indexed by stream.
type db struct {
	mu  sync.Mutex
	all []*record // in log order; all[i].pos strictly increasing
	// visible counts the records of all that are committed (replicated to a
	// quorum): readers and subscriptions see all[:visible] only. While held is
	// set, writes stay pending beyond it.
	visible int
	held    bool
	streams map[string]*streamState
	nextPos uint64
	ids     *idCache
	now     func() time.Time
	changed chan struct{} // closed and replaced on every write
}

func newDB(idCacheSize int) *db {
	return &db{
		streams: make(map[string]*streamState),
		nextPos: firstLogPosition,
		ids:     newIDCache(idCacheSize),
		now:     time.Now,
		changed: make(chan struct{}),
	}
}

// recordSize approximates a prepare record's size on disk, so that positions
// advance by uneven steps as they do in a real transaction file.
func recordSize(stream, eventType string, data, meta []byte) uint64 {
	const header = 85 // flags, positions, ids, timestamps, lengths
	return uint64(header + 2*len(stream) + 2*len(eventType) + len(data) + len(meta))
}

func ticks(t time.Time) int64 {
	return t.UnixNano() / 100
}

// writeLocked appends records to the log. The caller holds d.mu.
func (d *db) writeLocked(stream string, firstRev int64, events []proposed) (last *record) {
	s := d.streams[stream]
	if s == nil {
		s = &streamState{}
		d.streams[stream] = s
	}
	created := ticks(d.now())
	for i, e := range events {
		r := &record{
			id:          e.id,
			stream:      stream,
			revision:    firstRev + int64(i),
			pos:         d.nextPos,
			eventType:   e.eventType,
			contentType: e.contentType,
			data:        e.data,
			meta:        e.meta,
			created:     created,
		}
		d.nextPos += recordSize(stream, e.eventType, e.data, e.meta)
		r.end = d.nextPos
		s.events = append(s.events, r)
		d.all = append(d.all, r)
		d.ids.put(e.id, idInfo{stream: stream, revision: r.revision})
		last = r
	}
	d.commitLocked()
	return last
}

// commitLocked makes every written record visible unless replication is held,
// and wakes readers when that changed anything. The caller holds d.mu.
func (d *db) commitLocked() {
	if d.held || d.visible == len(d.all) {
		return
	}
	d.visible = len(d.all)
	close(d.changed)
	d.changed = make(chan struct{})
}

// hold stops (on) or resumes (off) replication. Resuming commits every
// pending write.
func (d *db) hold(on bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.held = on
	d.commitLocked()
}

// committed reports whether the record at pos is visible, and the channel
// closed on the next change.
func (d *db) committed(pos uint64) (bool, <-chan struct{}) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.visible > 0 && d.all[d.visible-1].pos >= pos, d.changed
}

// visibleLocked reports whether r is committed. The caller holds d.mu.
func (d *db) visibleLocked(r *record) bool {
	return d.visible > 0 && r.pos <= d.all[d.visible-1].pos
}

// append applies KurrentDB's IndexWriter.CheckCommit rules, then writes when the
// decision is OK.
func (d *db) append(stream string, exp expected, events []proposed) appendOutcome {
	d.mu.Lock()
	defer d.mu.Unlock()

	out := d.checkCommitLocked(stream, exp, events)
	if out.decision != decisionOK {
		return out
	}
	cur := out.current
	if len(events) == 0 {
		out.first, out.last = cur, cur
		return out
	}
	wasDeleted, metaOfDeleted := d.softDeletedLocked(stream), d.metaOfSoftDeletedLocked(stream)
	last := d.writeLocked(stream, cur+1, events)
	d.undeleteAfterWriteLocked(stream, cur+1, wasDeleted, metaOfDeleted)
	out.first, out.last = cur+1, last.revision
	out.pos, out.hasPos = last.pos, true
	out.pending = !d.visibleLocked(last)
	return out
}

// checkCommitLocked is IndexWriter.CheckCommit for a single-node, fully
// replicated log (no IdempotentNotReady). The caller holds d.mu.
func (d *db) checkCommitLocked(stream string, exp expected, events []proposed) appendOutcome {
	s := d.streams[stream]
	cur := s.last()
	wrong := func(dec decision) appendOutcome {
		return appendOutcome{decision: dec, current: cur, first: -1, last: -1}
	}
	if cur == deletedStream {
		return wrong(decisionDeleted)
	}

	if exp.kind == expectStreamExists && d.softDeletedLocked(stream) {
		return wrong(decisionDeleted)
	}
	if exp.kind == expectStreamExists && cur < 0 {
		// A stream whose metadata stream exists counts as existing.
		if d.streams["$$"+stream].last() < 0 {
			return wrong(decisionWrongExpectedVersion)
		}
	}

	if exp.kind == expectAny || exp.kind == expectStreamExists {
		// Idempotency from the bounded cache of recently written IDs only.
		first := true
		var start, end int64 = -1, -1
		for _, e := range events {
			info, ok := d.ids.get(e.id)
			if !ok || info.stream != stream {
				if first {
					return appendOutcome{decision: decisionOK, current: cur}
				}
				return wrong(decisionCorruptedIdempotency)
			}
			if first {
				start = info.revision
			}
			end = info.revision
			first = false
		}
		if first { // no data in the transaction
			return appendOutcome{decision: decisionOK, current: cur}
		}
		return d.idempotentLocked(stream, cur, start, end)
	}

	expV := exp.version()
	if expV < cur {
		n := expV
		for _, e := range events {
			n++
			if n <= cur && s.events[n].id == e.id {
				continue
			}
			if n != expV+1 {
				return wrong(decisionCorruptedIdempotency)
			}
			if exp.kind == expectNoStream && d.softDeletedLocked(stream) {
				return appendOutcome{decision: decisionOK, current: cur} // written at cur+1: see softdelete.go
			}
			return wrong(decisionWrongExpectedVersion)
		}
		if n == expV { // no data in the transaction
			return wrong(decisionWrongExpectedVersion)
		}
		return d.idempotentLocked(stream, cur, expV+1, n)
	}
	if expV > cur {
		return wrong(decisionWrongExpectedVersion)
	}
	return appendOutcome{decision: decisionOK, current: cur}
}

// idempotentLocked answers a batch that matches events already written, with
// the position of its last event: none when reads cannot show that event
// (soft-deleted or truncated by metadata), as the server's ReadEvent then
// fails and the answer carries no_position. The caller holds d.mu.
func (d *db) idempotentLocked(stream string, cur, start, end int64) appendOutcome {
	out := appendOutcome{decision: decisionIdempotent, current: cur, first: start, last: end}
	s := d.streams[stream]
	if s != nil && end >= 0 && end < int64(len(s.events)) {
		if !d.hiddenLocked(stream, end) {
			out.pos, out.hasPos = s.events[end].pos, true
		}
		if !d.visibleLocked(s.events[end]) {
			out.decision = decisionNotReady
		}
	}
	return out
}

// tombstone writes a $streamDeleted record and marks the stream deleted forever.
func (d *db) tombstone(stream string, exp expected) (appendOutcome, *record) {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.streams[stream]
	cur := s.last()
	out := appendOutcome{current: cur, first: -1, last: -1}
	switch {
	case cur == deletedStream:
		out.decision = decisionDeleted
		return out, nil
	case exp.kind == expectAny:
	case exp.kind == expectStreamExists && cur >= 0:
	case exp.kind == expectNoStream && cur == -1:
	case exp.kind == expectRevision && int64(exp.rev) == cur:
	default:
		out.decision = decisionWrongExpectedVersion
		return out, nil
	}
	if s == nil {
		s = &streamState{}
		d.streams[stream] = s
	}
	r := &record{
		id:          uuid.New(),
		stream:      stream,
		revision:    deletedStream,
		pos:         d.nextPos,
		eventType:   "$streamDeleted",
		contentType: "application/octet-stream",
		created:     ticks(d.now()),
	}
	d.nextPos += recordSize(stream, r.eventType, nil, nil)
	r.end = d.nextPos
	s.tombstoned = true
	d.all = append(d.all, r)
	d.commitLocked()
	return out, r
}

// snapshot returns the log as a reader lagging lag records behind what is
// committed sees it now (see Server.SetReadLag), and the channel closed on
// the next write.
func (d *db) snapshot(lag int) ([]*record, <-chan struct{}) {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := max(d.visible-lag, 0)
	return d.all[:n:n], d.changed
}

// streamView is a stream as a reader sees it: its events, whether it exists
// (it has events or is tombstoned), and whether it is tombstoned.
type streamView struct {
	events             []*record
	exists, tombstoned bool
}

// stream returns a stream as a reader lagging lag records behind what is
// committed sees it.
func (d *db) stream(name string, lag int) streamView {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.streams[name]
	if s == nil {
		return streamView{}
	}
	n := len(s.events)
	cut := max(d.visible-lag, 0)
	for n > 0 && (cut == 0 || s.events[n-1].pos > d.all[cut-1].pos) {
		n--
	}
	return streamView{events: s.events[:n:n], exists: n > 0 || s.tombstoned, tombstoned: s.tombstoned}
}

// validPosition reports whether a $all read may start at the commit position:
// the log's start, a record's start, or at or beyond the end of what is
// committed. Within a record the server's chunk reader fails (InvalidReadException),
// answered "Trying to read from an invalid position.".
func (d *db) validPosition(commit uint64) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	end := d.nextPos
	if d.visible < len(d.all) {
		end = d.all[d.visible].pos
	}
	all := d.all[:d.visible]
	i := firstAtOrAfter(all, commit)
	return commit == 0 || commit >= end || (i < len(all) && all[i].pos == commit)
}

// firstAtOrAfter returns the index in all of the first record whose position is >= pos.
func firstAtOrAfter(all []*record, pos uint64) int {
	lo, hi := 0, len(all)
	for lo < hi {
		m := (lo + hi) / 2
		if all[m].pos < pos {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

func isSystemStream(s string) bool { return strings.HasPrefix(s, "$") }
