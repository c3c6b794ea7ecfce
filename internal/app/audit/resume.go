package audit

import (
	"bytes"
	"cmp"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/projections"
)

// An incremental audit (Options.From) starts from a clean audit's checkpoint
// (projections.AuditCheckpoint) and folds only the events after it. The
// checkpoint carries what the fold keeps, which the earlier audit found right:
// every account's state and chain head (as the account's snapshot encoding
// has it, with its stream's revision and open command group), the money
// flows per currency, the saga steps and transaction legs still in flight and
// the step records their replies need (named by their events, read again),
// and the transfer and transaction streams not yet settled (read again from
// the store, as a settled one is). So a check that spans the checkpoint (a
// saga debited before it and credited after, a revision, a chain, a balance)
// is made as the full audit makes it. What grows with history is not carried:
// a key decided after the checkpoint whose claim came before it is looked up
// in the store (claimBefore); an event ID stored twice across the checkpoint
// is refused by the PostgreSQL store's unique index (events_event_id_key),
// and a key decided again in the same stream names the same event IDs (they
// are derived from it). The read models' rows the new events touch are
// compared (and every account), not the rows before the checkpoint.

// carried is the fold's state as a checkpoint stores it.
type carried struct {
	Last     eventstore.Position `json:"last"`
	Events   int64               `json:"events"`
	Settled  int                 `json:"settled_transfers"`
	Claimed  int                 `json:"claimed"`
	Flows    []Totals            `json:"flows"`
	Accounts []carriedAccount    `json:"accounts"`
	Streams  []carriedStream     `json:"streams"`
	Steps    []carriedSteps      `json:"steps,omitempty"`
	Legs     []carriedLegs       `json:"legs,omitempty"`
	Posted   []carriedLegs       `json:"posted,omitempty"`
	Records  []carriedRecord     `json:"step_records,omitempty"`
}

type carriedAccount struct {
	// Stream names the account's stream, so that its snapshot is decoded
	// once (DecodeSnapshot checks that the snapshot names it too); a
	// checkpoint stored before it was carried has it only in the snapshot.
	Stream   string `json:"stream,omitempty"`
	Snapshot []byte `json:"snapshot"` // domain.EncodeSnapshot
}

type carriedStream struct {
	Stream     string `json:"stream"`
	Next       uint64 `json:"next"`
	Chain      string `json:"chain"`
	GroupKey   string `json:"group_key,omitempty"`
	GroupNext  int    `json:"group_next,omitempty"`
	GroupCount int    `json:"group_count,omitempty"`
}

type carriedSteps struct {
	Saga                      string `json:"saga"`
	Debit, Credit, Compensate int64
	Debits, Credits, Comps    int
	Currency                  string `json:"currency"`
}

type carriedLegs struct {
	Key, Currency   string
	Debits, Credits int64
}

// carriedRecord names a step record by its events: count events of stream
// from revision from.
type carriedRecord struct {
	Key    string `json:"key"`
	Stream string `json:"stream"`
	From   uint64 `json:"from"`
	Count  int    `json:"count"`
}

// boundAccount gives an account of the fold the bounds of what its checks
// need: the key being read (its command's reply, expectAccountRows), the
// active holds and the one just closed (its read-model row is noted as it
// changes), no refunded original (the ledger's refund limit is its
// decisions' concern, not the fold's). So an account costs the same at any
// length of history.
func boundAccount(a *domain.Account) {
	a.KeyLimit, a.HoldLimit, a.RefundLimit = 1, 1, 1
}

// carry encodes what the fold carries forward (before Finish, which adds the
// balances and what is in flight to the totals), gzip'd JSON of a carried.
// The accounts and streams are written one at a time into the compressor,
// so that what the encoding costs is the compressed state, not the JSON of
// every account at once (40 MB at 40,000 accounts when it was).
func (f *Fold) carry() ([]byte, error) {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	w := &carryWriter{w: zw}
	w.raw(`{"last":`)
	w.value(f.Last)
	w.raw(`,"events":`)
	w.value(f.Events)
	w.raw(`,"settled_transfers":`)
	w.value(f.settledTransfers)
	w.raw(`,"claimed":`)
	w.value(f.claimed)
	flows := make([]Totals, 0, len(f.flows))
	for _, cur := range slices.Sorted(maps.Keys(f.flows)) {
		flows = append(flows, *f.flows[cur])
	}
	w.raw(`,"flows":`)
	w.value(flows)
	w.raw(`,"accounts":[`)
	for i, id := range slices.Sorted(maps.Keys(f.Accounts)) {
		stream := domain.AccountStream(id)
		snap, err := domain.EncodeSnapshot(stream, f.Accounts[id])
		if err != nil {
			return nil, fmt.Errorf("audit: checkpoint: %w", err)
		}
		w.item(i, carriedAccount{Stream: stream, Snapshot: snap})
	}
	w.raw(`],"streams":[`)
	for i, st := range slices.Sorted(maps.Keys(f.streams)) {
		ss := f.streams[st]
		w.item(i, carriedStream{Stream: st, Next: ss.next, Chain: ss.chain, GroupKey: ss.groupKey, GroupNext: ss.groupNext, GroupCount: ss.groupCount})
	}
	w.raw(`]`)
	var steps []carriedSteps // what is in flight is few: encoded whole
	for _, k := range slices.Sorted(maps.Keys(f.steps)) {
		s := f.steps[k]
		steps = append(steps, carriedSteps{Saga: k, Debit: s.debit, Credit: s.credit, Compensate: s.compensate, Debits: s.debits, Credits: s.credits, Comps: s.comps, Currency: s.currency})
	}
	var records []carriedRecord
	for _, k := range slices.Sorted(maps.Keys(f.stepRecords)) {
		if rec := f.stepRecords[k]; len(rec.Events) > 0 {
			records = append(records, carriedRecord{Key: k, Stream: rec.Events[0].Stream, From: rec.Events[0].Revision, Count: len(rec.Events)})
		}
	}
	w.raw(`,"steps":`)
	w.value(steps)
	w.raw(`,"legs":`)
	w.value(carryLegs(f.legs))
	w.raw(`,"posted":`)
	w.value(carryLegs(f.posted))
	w.raw(`,"step_records":`)
	w.value(records)
	w.raw("}\n")
	if err := cmp.Or(w.err, zw.Close()); err != nil {
		return nil, fmt.Errorf("audit: checkpoint: %w", err)
	}
	return b.Bytes(), nil
}

// carryWriter writes JSON a piece at a time, keeping the first error.
type carryWriter struct {
	w   io.Writer
	err error
}

func (c *carryWriter) raw(s string) {
	if c.err == nil {
		_, c.err = io.WriteString(c.w, s)
	}
}

func (c *carryWriter) value(v any) {
	if c.err != nil {
		return
	}
	b, err := json.Marshal(v)
	if err != nil {
		c.err = err
		return
	}
	_, c.err = c.w.Write(b)
}

// item writes the i-th element of an array.
func (c *carryWriter) item(i int, v any) {
	if i > 0 {
		c.raw(",")
	}
	c.value(v)
}

func carryLegs(m map[[2]string]*legSums) []carriedLegs {
	out := make([]carriedLegs, 0, len(m))
	for _, k := range slices.SortedFunc(maps.Keys(m), func(a, b [2]string) int { return strings.Compare(a[0]+"\x00"+a[1], b[0]+"\x00"+b[1]) }) {
		out = append(out, carriedLegs{Key: k[0], Currency: k[1], Debits: m[k].debits, Credits: m[k].credits})
	}
	return out
}

// resume restores the fold from a checkpoint's state, reading from store the
// unsettled streams and the step records it names.
func (f *Fold) resume(ctx context.Context, store Store, cp projections.AuditCheckpoint) error {
	var c carried
	zr, err := gzip.NewReader(bytes.NewReader(cp.State))
	if err == nil {
		err = json.NewDecoder(io.LimitReader(zr, maxCheckpointBytes)).Decode(&c)
	}
	if err != nil {
		return fmt.Errorf("audit: checkpoint %d: %w", cp.ID, err)
	}
	if c.Last != cp.Position || c.Events != cp.Events {
		return fmt.Errorf("audit: checkpoint %d: its state is at %s (%d events), the row at %s (%d)", cp.ID, c.Last, c.Events, cp.Position, cp.Events)
	}
	f.Last, f.Events, f.settledTransfers, f.claimed = c.Last, c.Events, c.Settled, c.Claimed
	f.from = &cp
	for i := range c.Flows {
		t := c.Flows[i]
		f.flows[t.Currency] = &t
	}
	for _, ca := range c.Accounts {
		if err := f.resumeAccount(ca); err != nil {
			return fmt.Errorf("audit: checkpoint %d: %w", cp.ID, err)
		}
	}
	if err := f.resumeStreams(c.Streams); err != nil {
		return fmt.Errorf("audit: checkpoint %d: %w", cp.ID, err)
	}
	for _, s := range c.Steps {
		f.steps[s.Saga] = &sagaSteps{debit: s.Debit, credit: s.Credit, compensate: s.Compensate, debits: s.Debits, credits: s.Credits, comps: s.Comps, currency: s.Currency}
	}
	for _, l := range c.Legs {
		f.legSums(f.legs, l.Key, l.Currency).add(l.Debits, false)
		f.legSums(f.legs, l.Key, l.Currency).add(l.Credits, true)
	}
	for _, l := range c.Posted {
		f.legSums(f.posted, l.Key, l.Currency).add(l.Debits, false)
		f.legSums(f.posted, l.Key, l.Currency).add(l.Credits, true)
	}
	return f.resumeRecords(ctx, store, c.Records)
}

// maxCheckpointBytes bounds a checkpoint's decoded state (about 300 bytes an
// account: 3 GiB is some ten million accounts).
const maxCheckpointBytes = 3 << 30

func (f *Fold) resumeAccount(ca carriedAccount) error {
	if ca.Stream == "" { // a checkpoint of an earlier build
		var head struct {
			Stream string `json:"stream"`
		}
		if err := json.Unmarshal(ca.Snapshot, &head); err != nil {
			return err
		}
		ca.Stream = head.Stream
	}
	a, err := domain.DecodeSnapshot(ca.Stream, ca.Snapshot)
	if err != nil { // e.g. a checkpoint of a build before snapshot layout 3 (effective_at)
		return fmt.Errorf("%w: the checkpoint's accounts are not this build's; run a full audit (without --from) to store a new checkpoint", err)
	}
	boundAccount(a)
	f.Accounts[a.ID] = a
	return nil
}

// resumeStreams restores each stream's revision, chain head and open command
// group; a transfer or transaction stream not yet settled is read again from
// the store, as a settled one is when a refund comes (reload).
func (f *Fold) resumeStreams(streams []carriedStream) error {
	for _, cs := range streams {
		if settles(cs.Stream) && cs.Next > 0 {
			if f.Reload == nil {
				return fmt.Errorf("%s is in flight and the store reads no streams", cs.Stream)
			}
			if f.reload(cs.Stream, cs.Next) == nil {
				return cmp.Or(f.reloadErr, fmt.Errorf("%s no longer holds its %d events", cs.Stream, cs.Next))
			}
			if strings.HasPrefix(cs.Stream, domain.TransferStreamPrefix) {
				f.settledTransfers++ // reload counts it as settled before
			}
			f.touch(cs.Stream)
		}
		f.streams[cs.Stream] = &streamState{next: cs.Next, chain: cs.Chain, groupKey: cs.GroupKey, groupNext: cs.GroupNext, groupCount: cs.GroupCount}
	}
	return nil
}

// resumeRecords rebuilds the step records that sagas in flight need, from
// their events.
func (f *Fold) resumeRecords(ctx context.Context, store Store, recs []carriedRecord) error {
	sr, ok := store.(eventstore.StreamReader)
	if !ok && len(recs) > 0 {
		return fmt.Errorf("audit: checkpoint: sagas in flight and the store reads no streams")
	}
	for _, r := range recs {
		got, err := sr.ReadStream(ctx, r.Stream, r.From, eventstore.Forwards, r.Count)
		if err != nil {
			return fmt.Errorf("audit: checkpoint: step %s: %w", r.Key, err)
		}
		evs := make([]domain.StoredEvent, 0, len(got))
		for _, re := range got {
			m, err := domain.DecodeMetadataNoRequest(re.Metadata)
			if err != nil {
				return fmt.Errorf("audit: checkpoint: step %s: %w", r.Key, err)
			}
			evs = append(evs, domain.StoredEvent{ID: re.ID, Stream: re.Stream, Revision: re.Revision, Position: re.Position.String(), Type: re.Type, Data: re.Data, Metadata: m})
		}
		tmp := domain.NewAccount(strings.TrimPrefix(r.Stream, domain.AccountStreamPrefix))
		if a := f.Accounts[tmp.ID]; a != nil {
			tmp.Currency = a.Currency
		}
		rec, err := tmp.RecallKey(evs)
		if err != nil {
			return fmt.Errorf("audit: checkpoint: step %s: %w", r.Key, err)
		}
		f.stepRecords[r.Key] = rec
	}
	return nil
}

// skipSnapshotsBefore drops the snapshots of revisions the checkpoint passed
// (the audit that made it checked those it met) and checks at once those at
// the checkpoint's own revision of their account.
func (f *Fold) skipSnapshotsBefore() {
	for stream, sn := range f.snapshots {
		a := f.Accounts[strings.TrimPrefix(stream, domain.AccountStreamPrefix)]
		if a == nil || int64(sn.revision) > a.Revision {
			continue
		}
		if int64(sn.revision) == a.Revision {
			f.checkSnapshot(stream, a)
			continue
		}
		delete(f.snapshots, stream)
	}
}

// claimBefore looks up, in the store, the claim of a key decided after the
// checkpoint that has none after it: its claim came before (revision 0 of
// its key stream, at or before the checkpoint); nil when it finds none.
func (f *Fold) claimBefore(ctx context.Context, store Store, key string) (*claim, error) {
	sr, ok := store.(eventstore.StreamReader)
	if !ok || f.from == nil {
		return nil, nil
	}
	recs, err := sr.ReadStream(ctx, domain.KeyStreamPrefix+key, 0, eventstore.Forwards, 1)
	if err != nil || len(recs) == 0 || recs[0].Position.Compare(f.from.Position) > 0 {
		return nil, ignoreNotFound(err)
	}
	var c domain.KeyClaimed
	if recs[0].Type != domain.EvKeyClaimed || json.Unmarshal(recs[0].Data, &c) != nil {
		return nil, nil
	}
	return &claim{stream: c.Stream, hash: c.RequestHash}, nil
}

func ignoreNotFound(err error) error {
	if err != nil && !errors.Is(err, eventstore.ErrStreamNotFound) {
		return err
	}
	return nil
}
