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
// each account's state and its stream's revision, chain head and open command
// group, one row per account (projections.AuditAccount, read only for the
// accounts the new events touch, a page at a time: accounts.go); and, in its
// state, the money flows per currency with the open accounts' balances
// summed, the saga steps and transaction legs still in flight and the step
// records their replies need (named by their events, read again), and the
// transfer and transaction streams not yet settled (read again from the
// store, as a settled one is). So a check that spans the checkpoint (a saga
// debited before it and credited after, a revision, a chain, a balance) is
// made as the full audit makes it. What grows with history is not carried:
// a key decided after the checkpoint whose claim came before it is looked up
// in the store (claimBefore), and so is the decision its claim names: a key
// decided before the checkpoint and again after it is named key_decided_twice
// when its claim gives the revision of that decision (claims older than
// Revision, or written before a decision that landed later, do not); an event
// ID stored twice across the checkpoint is refused by the PostgreSQL store's
// unique index (events_event_id_key), and where that index does not stand
// whole the store counts every ID from the start of "all" (storeids.go). The read models' rows the new events touch are
// compared (the accounts' rows of the accounts they touch), not the rows
// before the checkpoint.

// carried is the fold's state as a checkpoint stores it, beside its accounts.
type carried struct {
	Last    eventstore.Position `json:"last"`
	Events  int64               `json:"events"`
	Settled int                 `json:"settled_transfers"`
	// SettledTx: the transaction streams settled (absent from a checkpoint
	// stored before it was carried: its audits' stream count misses those).
	SettledTx int      `json:"settled_transactions,omitempty"`
	Claimed   int      `json:"claimed"`
	Flows     []Totals `json:"flows"`
	// Balances sums the open accounts' balances per currency (Totals'
	// Balances and Accounts), AccountRows counts the checkpoint's account
	// rows: both the whole ledger's, so that accounts not touched are not read.
	Balances    []Totals        `json:"balances"`
	AccountRows int64           `json:"account_rows"`
	Streams     []carriedStream `json:"streams"` // not the accounts': theirs are in their rows
	Steps       []carriedSteps  `json:"steps,omitempty"`
	Legs        []carriedLegs   `json:"legs,omitempty"`
	Posted      []carriedLegs   `json:"posted,omitempty"`
	Records     []carriedRecord `json:"step_records,omitempty"`
	// RefundsChecked: the snapshots the checkpoint records were checked with
	// every refunded sum they carry and, when they say they forgot no
	// refunded original, every one refunded (snapshotrefunds.go), and each
	// at its revision before the forgets of its event (foldAccountEvent:
	// the closed hold before the last one compared by its digest,
	// findability included); those a checkpoint without it records are
	// checked again, not trusted, and not carried. The builds that checked
	// only the sums wrote it as snapshot_refunds_checked, and those that
	// compared some snapshots after those forgets (the side fold of
	// e446ad9, the check at the checkpoint's revision against its row) as
	// snapshot_refunds_listed: both are read as its absence.
	RefundsChecked bool `json:"snapshot_holds_compared,omitempty"`
	// Stop is a stop point's, what a full audit's resume needs beside (stop.go).
	Stop *carriedStop `json:"stop,omitempty"`
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
// need: the key being read (its command's reply, expectAccountRows; forgotten
// once its command's last event is folded, domain.Account.ForgetKeys), the
// active holds and the one just closed (its read-model row is noted as it
// changes), no refunded original (the ledger's refund limit is its
// decisions' concern, not the fold's). So an account costs the same at any
// length of history.
func boundAccount(a *domain.Account) {
	a.KeyLimit, a.HoldLimit, a.RefundLimit = 1, 1, 1
	a.ForgetUnfindableHolds = true // the fold never recalls a hold
}

// carry encodes what the fold carries forward (before Finish, which adds the
// balances and what is in flight to the totals): gzip'd JSON of a carried.
// The accounts' rows go apart, one at a time (accountRowsOut).
func (f *Fold) carry() ([]byte, error) {
	return encodeCarried(f.carriedState())
}

// carriedState is what carry encodes.
func (f *Fold) carriedState() carried {
	c := carried{Last: f.Last, Events: f.Events, Settled: f.settledTransfers, SettledTx: f.settledTx, Claimed: f.claimed,
		Balances: f.carriedBalances(), AccountRows: f.accountRows(), RefundsChecked: true}
	for _, cur := range slices.Sorted(maps.Keys(f.flows)) {
		c.Flows = append(c.Flows, *f.flows[cur])
	}
	for _, st := range slices.Sorted(maps.Keys(f.streams)) {
		if ss := f.streams[st]; !strings.HasPrefix(st, domain.AccountStreamPrefix) {
			c.Streams = append(c.Streams, carriedStream{Stream: st, Next: ss.next, Chain: ss.chain, GroupKey: ss.groupKey, GroupNext: ss.groupNext, GroupCount: ss.groupCount})
		}
	}
	for _, k := range slices.Sorted(maps.Keys(f.steps)) {
		s := f.steps[k]
		c.Steps = append(c.Steps, carriedSteps{Saga: k, Debit: s.debit, Credit: s.credit, Compensate: s.compensate, Debits: s.debits, Credits: s.credits, Comps: s.comps, Currency: s.currency})
	}
	for _, k := range slices.Sorted(maps.Keys(f.stepRecords)) {
		if rec := f.stepRecords[k]; len(rec.Events) > 0 {
			c.Records = append(c.Records, carriedRecord{Key: k, Stream: rec.Events[0].Stream, From: rec.Events[0].Revision, Count: len(rec.Events)})
		}
	}
	c.Legs, c.Posted = carryLegs(f.legs), carryLegs(f.posted)
	return c
}

// encodeCarried is a carried as a checkpoint or a stop point stores it:
// gzip'd JSON.
func encodeCarried(c carried) ([]byte, error) {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	if err := cmp.Or(json.NewEncoder(zw).Encode(c), zw.Close()); err != nil {
		return nil, fmt.Errorf("audit: checkpoint: %w", err)
	}
	return b.Bytes(), nil
}

func carryLegs(m map[[2]string]*legSums) []carriedLegs {
	out := make([]carriedLegs, 0, len(m))
	for _, k := range slices.SortedFunc(maps.Keys(m), func(a, b [2]string) int { return strings.Compare(a[0]+"\x00"+a[1], b[0]+"\x00"+b[1]) }) {
		out = append(out, carriedLegs{Key: k[0], Currency: k[1], Debits: m[k].debits, Credits: m[k].credits})
	}
	return out
}

// resume restores the fold from a checkpoint's state, reading from store the
// unsettled streams and the step records it names, and from q the rows of
// the accounts they and the captures in flight need (the others as the
// events touch them). chain checks the checkpoint's rows beside it, and is
// told how many its state counts.
func (f *Fold) resume(ctx context.Context, store Store, q projections.Querier, cp projections.AuditCheckpoint, chain *chainCheck) error {
	c, err := decodeState(cp)
	if err == nil {
		err = checkCarriedAt(cp, &c)
	}
	if err != nil {
		return err
	}
	chain.rows = &c.AccountRows
	f.restoreCounts(c)
	f.from, f.trustRecorded = &cp, c.RefundsChecked
	for i := range c.Flows {
		t := c.Flows[i]
		f.flows[t.Currency] = &t
	}
	f.resumed = newResumedAccounts(q, cp.ID, c)
	if err := f.resumeStreams(c.Streams); err != nil {
		return fmt.Errorf("audit: checkpoint %d: %w", cp.ID, err)
	}
	f.resumeSagas(c)
	var ids []string
	for _, r := range c.Records {
		if id, ok := strings.CutPrefix(r.Stream, domain.AccountStreamPrefix); ok {
			ids = append(ids, id)
		}
	}
	if err := f.loadAccounts(ctx, ids, true); err != nil {
		return err
	}
	return f.resumeRecords(ctx, store, c.Records)
}

// restoreCounts restores the fold's position and counts from a checkpoint's
// (or a stop point's) state.
func (f *Fold) restoreCounts(c carried) {
	f.Last, f.Events, f.claimed = c.Last, c.Events, c.Claimed
	f.settledTransfers, f.settledTx = c.Settled, c.SettledTx
}

// decodeCarried decodes a checkpoint's (or a stop point's) state and checks
// it against its row (checkCarried).
func decodeCarried(cp projections.AuditCheckpoint) (carried, error) {
	c, err := decodeState(cp)
	if err != nil {
		return c, err
	}
	return c, checkCarried(cp, &c)
}

// decodeState decodes a checkpoint's (or a stop point's) state.
func decodeState(cp projections.AuditCheckpoint) (carried, error) {
	var c carried
	zr, err := gzip.NewReader(bytes.NewReader(cp.State))
	if err == nil {
		err = json.NewDecoder(io.LimitReader(zr, maxCheckpointBytes)).Decode(&c)
	}
	if err != nil {
		return c, fmt.Errorf("audit: checkpoint %d: %w", cp.ID, err)
	}
	return c, nil
}

// resumeSagas restores the saga steps and the transactions' legs in flight.
func (f *Fold) resumeSagas(c carried) {
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
}

// checkCarried refuses a checkpoint whose state does not match its row: its
// position and events (checkCarriedAt), its account rows' count (their
// digest is checked by LoadAudit).
func checkCarried(cp projections.AuditCheckpoint, c *carried) error {
	if err := checkCarriedAt(cp, c); err != nil {
		return err
	}
	return checkCarriedRows(cp, c.AccountRows)
}

// checkCarriedAt refuses a checkpoint whose state is not at its row's
// position and events.
func checkCarriedAt(cp projections.AuditCheckpoint, c *carried) error {
	if c.Last != cp.Position || c.Events != cp.Events {
		return fmt.Errorf("audit: checkpoint %d: its state is at %s (%d events), the row at %s (%d)", cp.ID, c.Last, c.Events, cp.Position, cp.Events)
	}
	return nil
}

// checkCarriedRows refuses a checkpoint whose state counts rows accounts
// when it holds another number of account rows.
func checkCarriedRows(cp projections.AuditCheckpoint, rows int64) error {
	if rows != cp.Accounts {
		return fmt.Errorf("audit: checkpoint %d: its state counts %d accounts, it holds %d account rows: it was edited since; run a full audit", cp.ID, rows, cp.Accounts)
	}
	return nil
}

// chainCheck is the check of the account rows of an incremental audit's
// checkpoint's chain against their digests (projections.CheckAuditChain)
// and of their count against the checkpoint's state (checkCarriedRows).
// It reads every row of the chain, none of which the fold needs checked
// before the end: so it runs beside the fold, on a connection of the pool
// of its own, and the audit waits for it once the fold is done, before
// anything read of the rows is reported or saved; an audit that fails
// before then fails with the checkpoint refused, when it is, as when the
// check came first.
type chainCheck struct {
	done chan struct{}
	cp   projections.AuditCheckpoint
	err  error
	rows *int64 // how many accounts the checkpoint's state counts (resume; nil: not decoded)
}

// checkChainBeside starts checking checkpoint cp's chain in q.
func checkChainBeside(ctx context.Context, q projections.RowsQuerier, cp projections.AuditCheckpoint) *chainCheck {
	c := &chainCheck{done: make(chan struct{}), cp: cp}
	go func() {
		defer close(c.done)
		if err := projections.Checkpoints.CheckAuditChain(ctx, q, &c.cp); err != nil {
			c.err = fmt.Errorf("audit: --from: %w", err)
		}
	}()
	return c
}

// wait waits for the check: nil when the chain's rows match their digests
// and their count the state's (nil c: no check), the checkpoint refused
// otherwise.
func (c *chainCheck) wait() error {
	if c == nil {
		return nil
	}
	<-c.done
	if c.err != nil || c.rows == nil {
		return c.err
	}
	return checkCarriedRows(c.cp, *c.rows)
}

// maxCheckpointBytes bounds a checkpoint's decoded state: what is global or
// in flight (the accounts are in rows of their own).
const maxCheckpointBytes = 1 << 30

// resumeStreams restores each stream's revision, chain head and open command
// group; a transfer or transaction stream not yet settled is read again from
// the store, as a settled one is when a refund comes (reload); one whose fold
// failed (a stop point's badStream) is checked no further, not read again.
func (f *Fold) resumeStreams(streams []carriedStream) error {
	for _, cs := range streams {
		if settles(cs.Stream) && cs.Next > 0 && !f.badStream[cs.Stream] {
			if f.Reload == nil {
				return fmt.Errorf("%s is in flight and the store reads no streams", cs.Stream)
			}
			if f.reload(cs.Stream, cs.Next) == nil {
				return cmp.Or(f.reloadErr, fmt.Errorf("%s no longer holds its %d events", cs.Stream, cs.Next))
			}
			if strings.HasPrefix(cs.Stream, domain.TransferStreamPrefix) { // reload counts it as settled before
				f.settledTransfers++
			} else {
				f.settledTx++
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
			evs = append(evs, storedEvent(re, m))
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

// claimBefore looks up, in the store, the claim of a key decided after the
// checkpoint that has none after it: its claim came before (revision 0 of
// its key stream, at or before the checkpoint); nil when it finds none. It
// also reads the claim's decision (decidedBefore): one point read per key.
func (f *Fold) claimBefore(ctx context.Context, store Store, key string) (*claim, error) {
	sr, ok := store.(eventstore.StreamReader)
	if !ok || f.from == nil {
		return nil, nil
	}
	recs, err := sr.ReadStream(ctx, domain.KeyStream(key), 0, eventstore.Forwards, 1)
	if err != nil || len(recs) == 0 || recs[0].Position.Compare(f.from.Position) > 0 {
		return nil, ignoreNotFound(err)
	}
	c, err := decodeClaim(recs[0].Type, recs[0].Data)
	if err != nil {
		return nil, nil
	}
	found := &claim{stream: c.Stream, hash: c.RequestHash}
	if c.Revision != nil {
		found.decidedBefore, err = f.decidedBefore(ctx, sr, key, c.Stream, *c.Revision)
	}
	return found, err
}

// decidedBefore reads the command group a claim names (its stream, from its
// revision): "stream@revision" when it carries the key and ends at or before
// the checkpoint, the key's decision there, so that one after the checkpoint
// decides it a second time; "" when it does not (the claim's revision is a
// lower bound where the claim is written before its decision).
func (f *Fold) decidedBefore(ctx context.Context, sr eventstore.StreamReader, key, stream string, rev uint64) (string, error) {
	first, m, err := f.readDecision(ctx, sr, stream, rev)
	if err != nil || first == nil || m.Key != key || m.Index != 0 {
		return "", err
	}
	if m.Count > 1 {
		last, lm, err := f.readDecision(ctx, sr, stream, rev+uint64(m.Count-1))
		if err != nil || last == nil || lm.Key != key {
			return "", err
		}
	}
	return fmt.Sprintf("%s@%d", stream, rev), nil
}

// readDecision is the event at a stream's revision with its metadata when it
// is at or before the checkpoint; nil otherwise.
func (f *Fold) readDecision(ctx context.Context, sr eventstore.StreamReader, stream string, rev uint64) (*eventstore.RecordedEvent, domain.Metadata, error) {
	recs, err := sr.ReadStream(ctx, stream, rev, eventstore.Forwards, 1)
	if err != nil || len(recs) == 0 || recs[0].Revision != rev || recs[0].Position.Compare(f.from.Position) > 0 {
		return nil, domain.Metadata{}, ignoreNotFound(err)
	}
	m, err := domain.DecodeMetadataNoRequest(recs[0].Metadata)
	if err != nil {
		return nil, domain.Metadata{}, nil
	}
	return &recs[0], m, nil
}

func ignoreNotFound(err error) error {
	if err != nil && !errors.Is(err, eventstore.ErrStreamNotFound) {
		return err
	}
	return nil
}
