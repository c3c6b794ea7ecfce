package audit

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/google/uuid"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/app/ledger"
	"github.com/ledgerworks/ledger/internal/app/reply"
	"github.com/ledgerworks/ledger/projections"
)

// Invariants of PROTOCOL.md §6 (Violation.Invariant), 6 for the hash chain, 7
// for the snapshots of account aggregates (each is the fold of its stream at its
// revision), 8 for events out (eventsout.go) and 9 for effective times
// (effective.go).
const (
	InvKeyOnce       = 1
	InvConservation  = 2
	InvBalance       = 3
	InvReadModel     = 4
	InvStreams       = 5
	InvChain         = 6
	InvSnapshot      = 7
	InvEventsOut     = 8
	InvEffective     = 9
	maxKeptPerStream = 1 // chain faults named per stream (the first)
)

// SystemStreamPrefix starts the streams of the ledger's own bookkeeping, such as
// the transfer process's checkpoints (ledger-process-checkpoint).
const SystemStreamPrefix = "ledger-"

// Violation is one broken invariant, named.
type Violation struct {
	Invariant int    `json:"invariant"`
	Kind      string `json:"kind"` // a short stable name, e.g. "balance_mismatch"
	Stream    string `json:"stream,omitempty"`
	Revision  int64  `json:"revision,omitempty"`
	EventID   string `json:"event_id,omitempty"`
	Message   string `json:"message"`
}

func (v Violation) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "invariant %d (%s): %s", v.Invariant, v.Kind, v.Message)
	if v.Stream != "" {
		fmt.Fprintf(&b, " [%s@%d", v.Stream, v.Revision)
		if v.EventID != "" {
			fmt.Fprintf(&b, " event %s", v.EventID)
		}
		b.WriteString("]")
	}
	return b.String()
}

// saga steps seen in account streams, by saga key.
type sagaSteps struct {
	debit, credit, compensate int64 // amounts applied
	debits, credits, comps    int   // applications (each must be at most one)
	currency                  string
}

type streamState struct {
	next  uint64 // next expected revision
	chain string // stored chain of the last event
	// the command group being read: key, next index, count
	groupKey   string
	groupNext  int
	groupCount int
	chainFault bool
	// closedHold, closedStatus, closedDigest and closedFindable are what
	// the fold keeps of an account's last closed hold, which the account
	// forgets (forgetClosedHold): its ID and how it closed, which
	// checkHoldPlaced needs, a digest of all a snapshot carries of it and
	// whether a ledger may forget it, which checkSnapshot compares
	// (closedhold.go).
	closedFindable bool
	closedHold     string
	closedStatus   domain.HoldStatus
	closedDigest   holdDigest
	// refunds sums an account's refunds (snapshotrefunds.go).
	refunds refundsTotal
	// originals are an account's originals the over-refund check keeps
	// (overrefund.go).
	originals originalWindow
}

type claim struct {
	stream, hash string
	// decidedBefore, of a claim an incremental audit found before its
	// checkpoint (claimBefore): where the key was decided before it
	// ("stream@revision"), or "".
	decidedBefore string
}

// Totals are one currency's money flows as the fold sees them.
type Totals struct {
	Currency    string `json:"currency"`
	Balances    int64  `json:"balances"`    // sum of account balances
	Deposits    int64  `json:"deposits"`    // credited from outside
	Withdrawals int64  `json:"withdrawals"` // debited to outside (captures included)
	RefundsOut  int64  `json:"refunds_out"` // refunds of deposits: back to outside
	RefundsIn   int64  `json:"refunds_in"`  // refunds of withdrawals: back from outside
	InFlight    int64  `json:"in_flight"`   // debited by pending transfer sagas, not yet credited
	Accounts    int    `json:"accounts"`
	PendingSaga int    `json:"pending_sagas"`
}

// Fold is the ledger's state folded from "all" with the domain's Evolve, together
// with everything the invariants need and the rows each read model should hold.
type Fold struct {
	// VerifyChain recomputes every event's chain hash.
	VerifyChain bool
	// NoRows: the read models are not compared, so their rows are not kept.
	NoRows bool
	// Reload, when set, reads a stream's events before a revision from the
	// store: the fold then forgets what it settled (settle.go).
	Reload func(stream string, before uint64) ([]eventstore.RecordedEvent, error)
	// reloadErr is the first error of Reload or of the holds read model's
	// queries (checkSnapshotHolds): the fold stops at the end of the page.
	reloadErr error
	// touched: the settling streams and leg sums an append touched, by the
	// commit of its last event; checkedSagas: the sagas of a stream folded
	// again that were checked before it was forgotten.
	touched          map[string]uint64
	legTouched       map[[2]string]uint64
	checkedSagas     map[string]bool
	settledTransfers int
	// settledTx counts the transaction streams settled (forgotten), as
	// settledTransfers the transfers: both count in the report's streams.
	settledTx int
	// spareKeys is the storage of the keys an account forgot last, for the
	// next command's (foldAccountEvent).
	spareKeys domain.SpareKeys

	Accounts  map[string]*domain.Account  // by account ID
	Transfers map[string]*domain.Transfer // by transfer ID
	Events    int64
	Last      eventstore.Position

	// streams are the account, transfer and transaction streams folded (a key
	// stream holds one event: its claim, kept by sets).
	streams map[string]*streamState
	// sets keep what grows with every event and key (historySets).
	sets      historySets
	claimed   int                   // key streams folded
	steps     map[string]*sagaSteps // saga key -> steps applied in account streams
	flows     map[string]*Totals    // by currency
	badStream map[string]bool       // streams whose fold failed: no further checks

	// batchElements are the keys an applied atomic batch decided whose
	// claims are not folded yet: key -> the batch's key (batches.go).
	batchElements map[string]string

	// stepRecords keeps the records of saga steps until their saga is decided.
	stepRecords map[string]*domain.KeyRecord
	// legs sums each transaction's legs in the accounts (by the transaction's
	// key and currency); posted the same from its TransactionPosted (Finish
	// checks that both agree and that each currency's debits equal its credits).
	legs, posted map[[2]string]*legSums
	// txSagas are the transaction streams folded (domain.TransactionSaga): a
	// reservation saga still running has legs and no outcome yet (in flight).
	txSagas map[string]*domain.TransactionSaga
	// Snapshots are the account snapshots to check, by stream (CheckSnapshots):
	// each is compared with the fold when it reaches the snapshot's revision,
	// read again then through readSnapshot when set (snapshots.go).
	snapshots    map[string]snapshotCheck
	readSnapshot func(stream string) (eventstore.Snapshot, error)
	// readRefunds checks the refunded sums of a snapshot the comparison with
	// the fold leaves (snapshotrefunds.go); nil when the snapshots were handed
	// in (CheckSnapshots) without a store that reads them: not checked then.
	readRefunds refundsReader
	// originals reads a refund's original and what was refunded of it
	// (overrefund.go); nil: refunds are not checked against their originals.
	originals *originals
	// readStreamTo reads a stream from its first event up to a revision, in
	// pages (sameAllRefunded); nil on a store that reads no streams.
	readStreamTo func(stream string, rev int64, fn func(eventstore.RecordedEvent) error) error
	// noSubjects: the store reads no events by subject (KurrentDB), so its
	// ledger forgets no closed hold and no refunded original, and a snapshot
	// saying it forgot some is forged (decodeSnapshot).
	noSubjects bool
	// holdsRM is where the closed holds of snapshots are checked
	// (snapshotholds.go); nil without it. snapshotHoldsUnchecked counts the
	// snapshots whose closed holds it could not check.
	holdsRM                *holdsReadModel
	snapshotHoldsUnchecked int
	// snapshotsTrusted counts the snapshots an incremental audit does not
	// check again: of revisions its checkpoint passed, stored with the bytes
	// the checkpoint records (snapshots.go); snapshotsFromStart those of such
	// revisions it checked by a fold from their stream's first event;
	// snapshotsWritten those written while the audit ran, listed again
	// before it stores its checkpoint (snapshotswritten.go).
	snapshotsTrusted, snapshotsFromStart, snapshotsWritten int
	// trustRecorded: the checkpoint resumed from records snapshots checked
	// with every refunded sum (carried.RefundsChecked), so trusted.
	trustRecorded bool
	// checked is, per account stream, the snapshot found equal to the fold
	// (by this audit, or recorded by the checkpoint it resumed from, read
	// with the account's row): what the checkpoint it stores records
	// (accountRowsOut). It holds a revision and a sha256 per account
	// snapshotted, not the snapshot's bytes.
	checked map[string]projections.CheckedSnapshot

	// from is the checkpoint an incremental audit resumed from (resume.go);
	// lookupClaim then finds a key's claim made before it.
	from        *projections.AuditCheckpoint
	lookupClaim func(key string) (*claim, error)
	// resumed are the checkpoint's accounts, read as the events touch them
	// (accounts.go); nil for a fold from the start.
	resumed *resumedAccounts

	// pageEnd: every page the fold began it applied, settled and flushed
	// (foldUntil), so a stopped audit may store its state (stop.go).
	pageEnd bool
	// lastStream, lastRevision and lastID name the last event of the last
	// page folded (noteLast): the store's identity at a stop point.
	lastStream   string
	lastRevision uint64
	lastID       string

	Violations []Violation
	violations int
	// MaxViolations bounds the violations kept (all are counted).
	MaxViolations int
	// parties are the accounts of each transfer a kept violation names, taken
	// when it is found: the fold forgets a settled transfer (settleStream,
	// settleAtHead), and `--account` still keeps its violations (forAccount;
	// review r504). At most one entry a kept violation.
	parties map[string][2]string
}

// NewFold returns an empty fold.
func NewFold() *Fold {
	return &Fold{
		Accounts: map[string]*domain.Account{}, Transfers: map[string]*domain.Transfer{},
		streams: map[string]*streamState{}, sets: newMemSets(),
		steps: map[string]*sagaSteps{}, flows: map[string]*Totals{},
		legs: map[[2]string]*legSums{}, posted: map[[2]string]*legSums{}, txSagas: map[string]*domain.TransactionSaga{},
		badStream: map[string]bool{}, touched: map[string]uint64{}, legTouched: map[[2]string]uint64{}, checkedSagas: map[string]bool{}, stepRecords: map[string]*domain.KeyRecord{},
		MaxViolations: 1000,
	}
}

// ViolationCount is the number of violations found, kept or not.
func (f *Fold) ViolationCount() int { return f.violations }

func (f *Fold) violate(v Violation) {
	f.violations++
	if len(f.Violations) < f.MaxViolations {
		f.Violations = append(f.Violations, v)
		f.noteParties(v.Stream)
	}
}

// noteParties keeps the accounts of the transfer stream names while the fold
// still holds it (forAccount).
func (f *Fold) noteParties(stream string) {
	id, ok := strings.CutPrefix(stream, domain.TransferStreamPrefix)
	if t := f.Transfers[id]; ok && t != nil {
		if f.parties == nil {
			f.parties = map[string][2]string{}
		}
		f.parties[id] = [2]string{t.From, t.To}
	}
}

func (f *Fold) eventViolation(inv int, kind string, re eventstore.RecordedEvent, format string, args ...any) {
	f.violate(Violation{Invariant: inv, Kind: kind, Stream: re.Stream, Revision: int64(re.Revision), EventID: re.ID.String(), Message: fmt.Sprintf(format, args...)})
}

func (f *Fold) totals(currency string) *Totals {
	t := f.flows[currency]
	if t == nil {
		t = &Totals{Currency: currency}
		f.flows[currency] = t
	}
	return t
}

func groupHash(stream, key string) [16]byte {
	h := fnv.New128a()
	h.Write([]byte(stream))
	h.Write([]byte{0})
	h.Write([]byte(key))
	var out [16]byte
	copy(out[:], h.Sum(nil))
	return out
}

// Apply folds the next event of "all".
func (f *Fold) Apply(re eventstore.RecordedEvent) {
	f.apply(re, decodeMeta(re))
}

// meta is an event's metadata decoded, or why it could not be, and, when
// decoded is set, its payload (an account, transfer or transaction event's,
// domain.DecodeEvent; a key stream's claim, decodeClaim) or why not: decoded
// beside the fold, by the page reader, or by the rebuild that hands the check
// its batch.
type meta struct {
	m          domain.Metadata
	err        error
	payload    any
	payloadErr error
	decoded    bool
}

// decodeMeta decodes an event's metadata only: the fold decodes its payload.
func decodeMeta(re eventstore.RecordedEvent) meta {
	m, err := domain.DecodeMetadataNoRequest(re.Metadata)
	return meta{m: m, err: err}
}

// decodeAll decodes an event's metadata and the payload the fold reads of it.
func decodeAll(re eventstore.RecordedEvent) meta {
	md := decodeMeta(re)
	md.payload, md.payloadErr, md.decoded = decodePayload(re)
	return md
}

// decodePayload decodes the payload the fold reads of an event: an account,
// transfer or transaction event's (domain.DecodeEvent), a key stream's claim
// (decodeClaim); decoded false for the other streams, which the fold reads
// no payload of.
func decodePayload(re eventstore.RecordedEvent) (payload any, err error, decoded bool) {
	switch {
	case strings.HasPrefix(re.Stream, domain.AccountStreamPrefix), strings.HasPrefix(re.Stream, domain.TransferStreamPrefix), domain.IsTransactionStream(re.Stream):
		payload, err = domain.DecodeEvent(re.Type, re.Data)
	case strings.HasPrefix(re.Stream, domain.KeyStreamPrefix):
		payload, err = decodeClaim(re.Type, re.Data)
	default:
		return nil, nil, false
	}
	return payload, err, true
}

// payloadOf returns the payload the fold reads of an event (decodePayload),
// decoded beside the fold or now.
func (md meta) payloadOf(re eventstore.RecordedEvent) (any, error) {
	if md.decoded {
		return md.payload, md.payloadErr
	}
	payload, err, _ := decodePayload(re)
	return payload, err
}

// errNotClaim: a key stream holds an event that is not a claim.
var errNotClaim = errors.New("not a claim")

// decodeClaim decodes a key stream's claim (an event of type typ with data):
// the one decoder of claims of the audit, replay and the incremental audit's
// lookups; an atomic batch's decision is its key's claim too (batches.go).
func decodeClaim(typ string, data []byte) (*domain.KeyClaimed, error) {
	if typ != domain.EvKeyClaimed && typ != domain.EvBatchDecided {
		return nil, errNotClaim
	}
	return domain.DecodeKeyClaimed(data)
}

// apply folds the next event of "all", its metadata decoded (beside the fold,
// by the page reader: decoding is a pure function of the event).
func (f *Fold) apply(re eventstore.RecordedEvent, md meta) {
	f.Events++
	f.Last = re.Position
	// Invariant 5: unique IDs, gapless revisions.
	f.sets.eventID(f, re)
	if strings.HasPrefix(re.Stream, domain.KeyStreamPrefix) {
		f.applyKeyStream(re, md)
		return
	}
	ss := f.streams[re.Stream]
	if ss == nil && re.Revision > 0 && f.Reload != nil && settles(re.Stream) {
		ss = f.reload(re.Stream, re.Revision)
	}
	if ss == nil {
		ss = &streamState{}
		f.streams[re.Stream] = ss
	}
	if re.Revision != ss.next {
		f.eventViolation(InvStreams, "revision_gap", re, "revision %d follows revision %d", re.Revision, int64(ss.next)-1)
		f.badStream[re.Stream] = true
	}
	ss.next = re.Revision + 1

	m, err := md.m, md.err
	if err != nil {
		f.eventViolation(InvStreams, "undecodable_metadata", re, "%v", err)
		f.badStream[re.Stream] = true
		return
	}
	ev := storedEvent(re, m)

	// The hash chain: each event's chain links the stored chain of the one before.
	if f.VerifyChain && !ss.chainFault {
		want := domain.ChainHash(ss.chain, ev)
		if m.Chain != want {
			ss.chainFault = true
			f.eventViolation(InvChain, "chain_mismatch", re, "stored content no longer matches its chain hash (type %s, key %q): the first altered event of %s", re.Type, m.Key, re.Stream)
		}
	}
	ss.chain = m.Chain

	f.checkGroup(ss, re, m)

	switch {
	case strings.HasPrefix(re.Stream, domain.AccountStreamPrefix):
		f.applyAccount(re, ev, md, ss)
	case strings.HasPrefix(re.Stream, domain.TransferStreamPrefix):
		f.applyTransfer(re, ev, md)
	case domain.IsTransactionStream(re.Stream):
		f.applyTransaction(re, ev, md)
	case re.Type == ledger.EvProcessCheckpoint:
		// The transfer process keeps its checkpoints in the event store
		// (ledger.Process): no money and no keys, only revisions and the chain.
	case strings.HasPrefix(re.Stream, SystemStreamPrefix):
		// The ledger's own bookkeeping (the transfer process's checkpoints): no
		// money, checked for invariant 5 and the chain only.
	default:
		f.eventViolation(InvStreams, "unknown_stream", re, "stream %q is none of the ledger's", re.Stream)
	}
}

// checkGroup checks invariant 1 within a stream: a key's events form one group,
// indexes 0..n-1, written once.
func (f *Fold) checkGroup(ss *streamState, re eventstore.RecordedEvent, m domain.Metadata) {
	if m.Index == 0 {
		if ss.groupKey != "" && ss.groupNext < ss.groupCount {
			f.eventViolation(InvKeyOnce, "incomplete_command", re, "key %q wrote %d of its %d events", ss.groupKey, ss.groupNext, ss.groupCount)
		}
		f.sets.group(f, re, m.Key)
		ss.groupKey, ss.groupNext, ss.groupCount = m.Key, 1, m.Count
		return
	}
	if m.Key != ss.groupKey || m.Index != ss.groupNext {
		f.eventViolation(InvKeyOnce, "command_out_of_group", re, "event %d of key %q does not follow event %d of key %q", m.Index, m.Key, ss.groupNext-1, ss.groupKey)
	}
	ss.groupKey, ss.groupNext = m.Key, m.Index+1
}

// applyKeyStream folds a key stream's event: its claim, the stream's only
// event (revision 0, its chain linking nothing), so that no key stream is kept.
func (f *Fold) applyKeyStream(re eventstore.RecordedEvent, md meta) {
	f.claimed++
	if re.Revision != 0 {
		f.eventViolation(InvKeyOnce, "key_claimed_twice", re, "a key stream holds more than its claim")
		return
	}
	m, err := md.m, md.err
	if err != nil {
		f.eventViolation(InvStreams, "undecodable_metadata", re, "%v", err)
		return
	}
	ev := storedEvent(re, m)
	if f.VerifyChain && m.Chain != domain.ChainHash("", ev) {
		f.eventViolation(InvChain, "chain_mismatch", re, "stored content no longer matches its chain hash (type %s, key %q): the first altered event of %s", re.Type, m.Key, re.Stream)
	}
	f.applyClaim(re, md)
}

func (f *Fold) applyClaim(re eventstore.RecordedEvent, md meta) {
	p, err := md.payloadOf(re)
	c, _ := p.(*domain.KeyClaimed)
	if err != nil || c == nil {
		f.eventViolation(InvKeyOnce, "bad_claim", re, "a key stream holds %s, not a claim", re.Type)
		return
	}
	key := strings.TrimPrefix(re.Stream, domain.KeyStreamPrefix)
	if c.Key != key {
		f.eventViolation(InvKeyOnce, "bad_claim", re, "claim of %q in the stream of %q", c.Key, key)
	}
	f.sets.claim(f, re, key, claim{stream: c.Stream, hash: c.RequestHash})
	if re.Type == domain.EvBatchDecided {
		f.noteBatch(re)
	} else {
		delete(f.batchElements, key)
	}
}

// clientCommand reports whether an event was written by a client's own command.
func clientCommand(m domain.Metadata) bool {
	return m.Origin == "" && domain.CommandType(m.Command).IsClient()
}

func (f *Fold) noteHome(re eventstore.RecordedEvent, m domain.Metadata) {
	if !clientCommand(m) {
		return
	}
	f.sets.home(f, re, m.Key, m.RequestHash)
}

// applyAccount folds an account event; ss is its stream's state (apply's:
// looked up once an event).
func (f *Fold) applyAccount(re eventstore.RecordedEvent, ev domain.StoredEvent, md meta, ss *streamState) {
	if f.badStream[re.Stream] {
		return
	}
	id := strings.TrimPrefix(re.Stream, domain.AccountStreamPrefix)
	a := f.Accounts[id]
	if a == nil {
		a = domain.NewAccount(id)
		boundAccount(a)
		f.Accounts[id] = a
	}
	m := ev.Metadata
	f.noteHome(re, m)
	// Decoded once and folded as the ledger folds what it decided: what
	// EvolveAccount does, but for decoding the event a second time.
	payload, err := md.payloadOf(re)
	if err == nil {
		f.checkHoldPlaced(re, a, ss, payload)
		err = foldAccountEvent(a, ss, ev, payload, true, &f.spareKeys, func() {
			f.checkSnapshotIn(re.Stream, a, ss, re.Position)
			f.checkEffective(re, m, a, payload)
			f.checkAccountEvent(re, m, a, payload)
			f.checkRefund(re, m, a, &ss.originals, payload)
			f.checkConditions(re, m, a, payload)
			f.expectAccountRows(re, m, a, payload)
		})
	}
	if err != nil {
		f.eventViolation(InvBalance, "fold_failed", re, "%v", err)
		f.badStream[re.Stream] = true
	}
}

// foldAccountEvent folds an account event, decoded once (payload), into a
// as the ledger folds what it decided (what EvolveAccount does, but for
// decoding the event a second time), adds it to its stream's refunds' total
// (ss, nil: not kept), then calls at (the checks at a's new revision: any
// snapshot of it is compared there), then, bounded (boundAccount), forgets
// what the fold keeps no longer: the key once its command's last event is
// folded, the hold the event closed into ss (forgetClosedHold). The one
// order of the main fold (applyAccount) and the side folds that check a
// snapshot apart (checkSnapshotFolding): a snapshot at the revision that
// closes a hold is compared while the account still holds that hold whole
// and ss the one closed before it, findability included (invariant 7).
// spare (nil: none) is the storage of the keys forgotten last, which a
// command's records are remembered in (domain.SpareKeys).
func foldAccountEvent(a *domain.Account, ss *streamState, ev domain.StoredEvent, payload any, bounded bool, spare *domain.SpareKeys, at func()) error {
	if spare != nil {
		a.UseSpareKeys(spare)
	}
	if err := domain.EvolveAccountDecided(a, ev, payload); err != nil {
		return err
	}
	a.ForgetDurable(a.Revision) // a stored event is durable
	if ss != nil {
		ss.refunds.addEvent(payload)
	}
	at()
	if !bounded {
		return nil
	}
	if m := ev.Metadata; m.Index == m.Count-1 {
		// Decided: the reply is kept (expectAccountRows) and Evolve reads
		// no key record (deciding a refund does, folding one does not), so
		// the account forgets it now rather than keep one per account
		// (issue 23).
		a.ForgetKeysInto(spare)
	}
	forgetClosedHold(ss, a, payload)
	return nil
}

// forgetClosedHold keeps of a hold an account event closed only its ID,
// status and digest, in the stream's state, once its read-model row is noted
// (expectAccountRows): nothing but a snapshot's copy of it reads the rest
// again, so an account keeps its active holds and not its last closed one
// (issue 23: about 200 bytes an account that held funds). The account says
// it forgot holds once the fold drops what it kept of an earlier one. ss is
// the account's stream state (nil: the hold is dropped whole).
func forgetClosedHold(ss *streamState, a *domain.Account, payload any) {
	h := holdOf(a, payload)
	if h == nil || h.Status == domain.HoldStatusActive {
		return
	}
	if ss == nil {
		a.ForgetClosedHold(h.ID, true)
		return
	}
	dropped := ss.closedHold != "" && ss.closedHold != h.ID
	ss.closedHold, ss.closedStatus, ss.closedDigest, ss.closedFindable = h.ID, h.Status, digestHold(h), h.Findable
	a.ForgetClosedHold(h.ID, dropped)
}

// checkAccountEvent checks an account event against the fold after it:
// invariant 3, the amounts the event states equal the fold's and the balance
// and held stay within their limits; and it classifies the money the event
// moves for invariant 2.
func (f *Fold) checkAccountEvent(re eventstore.RecordedEvent, m domain.Metadata, a *domain.Account, payload any) {
	check := func(what string, stated, folded int64) {
		if stated != folded {
			f.eventViolation(InvBalance, "balance_mismatch", re, "%s %d stated by the event, %d by the fold", what, stated, folded)
		}
	}
	switch p := payload.(type) {
	case *domain.Credited:
		f.flow(re, m, a, money{p.Reason, p.Amount, p.Currency, true})
	case *domain.Debited:
		f.flow(re, m, a, money{p.Reason, p.Amount, p.Currency, false})
	case *domain.HoldPlaced:
		check("held_after", p.HeldAfter, a.Held)
	case *domain.HoldCaptured:
		check("balance_after", p.BalanceAfter, a.Balance)
		check("held_after", p.HeldAfter, a.Held)
		if p.To == "" {
			f.totals(a.Currency).Withdrawals += p.Amount
		} else { // credited to p.To in the same write: the credit must match
			f.legSums(f.legs, m.Key, p.Currency).add(p.Amount, false)
			f.legSums(f.posted, m.Key, p.Currency).debits += p.Amount
			f.legSums(f.posted, m.Key, p.Currency).credits += p.Amount
		}
	case *domain.HoldReleased:
		check("held_after", p.HeldAfter, a.Held)
	}
	if a.Balance < -a.OverdraftLimit {
		f.eventViolation(InvBalance, "below_overdraft", re, "balance %d of %s is below minus its overdraft limit %d", a.Balance, a.ID, a.OverdraftLimit)
	}
	if a.Held < 0 {
		f.eventViolation(InvBalance, "negative_held", re, "held %d of %s", a.Held, a.ID)
	}
}

// expectAccountRows records the read-model rows an account event should leave:
// its entry, its balance history, its command's reply; a saga step's record is
// kept until its saga is decided.
func (f *Fold) expectAccountRows(re eventstore.RecordedEvent, m domain.Metadata, a *domain.Account, payload any) {
	if !f.NoRows {
		id, tag := re.ID.String(), accountsTag(a.ID)
		if e, ok := entryRow(re, id, m, payload, a.ID, a.Balance); ok {
			f.sets.row(f, "entries", id, tag, digestNote(e))
		}
		f.sets.row(f, "balance_history", id, tag, digestNote(historyRow(re, id, m, a)))
		if h := holdOf(a, payload); h != nil {
			f.sets.row(f, "holds", a.ID+"/"+h.ID, tag, textNote(holdRowOf(a.ID, a.Currency, h, capturedBy(payload))))
		}
		if rec := a.Keys[m.Key]; rec != nil && clientCommand(m) {
			f.sets.row(f, "commands", m.Key, tag, digestNote(replyRow(accountReply(rec))))
		}
	}
	if m.Index == m.Count-1 {
		if rec := a.Keys[m.Key]; rec != nil && isSagaStep(m) {
			c := *rec
			c.Events = append([]domain.EventRef(nil), rec.Events...)
			f.stepRecords[m.Key] = &c
		}
	}
}

// checkHoldPlaced names a hold placed under the ID of a hold the account
// holds (before the event is folded): active, or closed and kept (the last
// closed ones, boundAccount). A hold is placed once, and once closed
// (captured, released, expired) no event touches it again: a capture or
// release of it does not fold (fold_failed), and the holds table's row of a
// closed hold is final, which an incremental audit relies on: it compares
// only the active holds through the checkpoint's digest (holdsdigest.go). A
// closed hold the account no longer keeps placed again is named through its
// key's claim instead (key_decided_twice, claimBefore). The last closed one
// is kept as its ID and status only (forgetClosedHold), in ss, the
// account stream's state.
func (f *Fold) checkHoldPlaced(re eventstore.RecordedEvent, a *domain.Account, ss *streamState, payload any) {
	p, ok := payload.(*domain.HoldPlaced)
	if !ok {
		return
	}
	if h := a.Holds[p.HoldID]; h != nil {
		f.eventViolation(InvBalance, "hold_placed_again", re, "hold %s of %s placed again, its earlier one %s", p.HoldID, a.ID, h.Status)
	} else if ss.closedHold == p.HoldID {
		f.eventViolation(InvBalance, "hold_placed_again", re, "hold %s of %s placed again, its earlier one %s", p.HoldID, a.ID, ss.closedStatus)
	}
}

// holdOf is the hold an account event changed, as the fold has it after the
// event (nil for an event that changes no hold).
func holdOf(a *domain.Account, payload any) *domain.Hold {
	e, ok := payload.(domain.AccountEvent)
	if !ok {
		return nil
	}
	if id := e.Change().Hold.ID; id != "" {
		return a.Holds[id]
	}
	return nil
}

// capturedBy is what an account event captured of its hold.
func capturedBy(payload any) int64 {
	if p, ok := payload.(*domain.HoldCaptured); ok {
		return p.Amount
	}
	return 0
}

// isSagaStep reports whether an account event was written by a transfer saga's step.
func isSagaStep(m domain.Metadata) bool {
	switch domain.CommandType(m.Command) {
	case domain.CmdTransferDebit, domain.CmdTransferCredit, domain.CmdTransferCompensate:
		return m.Origin != ""
	}
	return false
}

// accountReply is the reply the ledger gives for a key an account decided.
func accountReply(rec *domain.KeyRecord) reply.Reply {
	after := rec.After()
	return reply.Account(rec, append([]domain.EventRef{}, rec.Events...), &after, false)
}

// money is a movement of money as a Credited or Debited event states it.
type money struct {
	reason   string
	amount   int64
	currency string
	credit   bool
}

// flow classifies a money movement for invariant 2.
func (f *Fold) flow(re eventstore.RecordedEvent, m domain.Metadata, a *domain.Account, mv money) {
	reason, amount, currency, credit := mv.reason, mv.amount, mv.currency, mv.credit
	if currency != a.Currency {
		f.eventViolation(InvBalance, "currency_mismatch", re, "%s moved on an account of %s", currency, a.Currency)
	}
	t := f.totals(a.Currency)
	step := func() *sagaSteps {
		s := f.steps[m.Origin]
		if s == nil {
			s = &sagaSteps{currency: a.Currency}
			f.steps[m.Origin] = s
		}
		return s
	}
	switch reason {
	case domain.ReasonDeposit:
		t.Deposits += amount
	case domain.ReasonWithdrawal:
		t.Withdrawals += amount
	case domain.ReasonRefund:
		if credit {
			t.RefundsIn += amount
		} else {
			t.RefundsOut += amount
		}
	case domain.ReasonTransferOut, domain.ReasonRefundOut:
		s := step()
		s.debit += amount
		s.debits++
	case domain.ReasonTransferIn, domain.ReasonRefundIn:
		s := step()
		s.credit += amount
		s.credits++
	case domain.ReasonTransferCompensate, domain.ReasonRefundCompensate:
		s := step()
		s.compensate += amount
		s.comps++
	case domain.ReasonTransactionOut, domain.ReasonTransactionIn, domain.ReasonCaptureIn:
		f.legSums(f.legs, m.Origin, currency).add(amount, credit)
	default:
		f.eventViolation(InvConservation, "unknown_reason", re, "money moved for reason %q", reason)
	}
	wantCredit := true
	switch reason {
	case domain.ReasonWithdrawal, domain.ReasonTransferOut, domain.ReasonRefundOut, domain.ReasonTransactionOut:
		wantCredit = false
	case domain.ReasonRefund:
		wantCredit = credit
	}
	if credit != wantCredit {
		f.eventViolation(InvConservation, "wrong_direction", re, "a %s moved money the wrong way", reason)
	}
}

func isSagaReason(r string) bool {
	switch r {
	case domain.ReasonTransferOut, domain.ReasonTransferIn, domain.ReasonTransferCompensate,
		domain.ReasonRefundOut, domain.ReasonRefundIn, domain.ReasonRefundCompensate:
		return true
	}
	return false
}

func (f *Fold) applyTransfer(re eventstore.RecordedEvent, ev domain.StoredEvent, md meta) {
	if f.badStream[re.Stream] {
		return
	}
	id := strings.TrimPrefix(re.Stream, domain.TransferStreamPrefix)
	t := f.Transfers[id]
	if t == nil {
		t = domain.NewTransfer(id)
		f.Transfers[id] = t
	}
	f.noteHome(re, ev.Metadata)
	f.touch(re.Stream)
	decided := decidedSagas(t)
	payload, err := md.payloadOf(re)
	if err := domain.EvolveTransferDecoded(t, ev, payload, err); err != nil {
		f.eventViolation(InvConservation, "fold_failed", re, "%v", err)
		f.badStream[re.Stream] = true
		return
	}
	if !f.NoRows && t.Saga != nil {
		f.sets.row(f, "transfers", id, accountsTag(t.From, t.To), textNote(transferRowOf(t)))
	}
	if decidedSagas(t) == decided {
		return
	}
	sg := sagaOfEvent(t, re.ID) // an event moves one saga: the one just decided
	if sg == nil {
		return
	}
	sk := sg.Key
	if !f.NoRows {
		f.sets.row(f, "commands", sk, "", digestNote(replyRow(f.sagaReply(t, sg))))
	}
	for _, step := range []string{domain.StepDebit, domain.StepCredit, domain.StepCompensate} {
		delete(f.stepRecords, domain.StepKey(sk, step))
	}
}

// decidedSagas counts the transfer's decided sagas, its own and its refunds'.
func decidedSagas(t *domain.Transfer) int {
	n := 0
	if t.Saga != nil && t.Saga.Stage.Decided() {
		n++
	}
	for _, r := range t.Refunds {
		if r.Stage.Decided() {
			n++
		}
	}
	return n
}

// sagaOfEvent is the saga of t whose last event is the event id, the saga
// that event was folded into (domain.EvolveTransfer asks the registry's
// payload which one): read from the saga, not from a list of event types.
func sagaOfEvent(t *domain.Transfer, id uuid.UUID) *domain.Saga {
	last := func(s *domain.Saga) bool { return len(s.Events) > 0 && s.Events[len(s.Events)-1].ID == id }
	if t.Saga != nil && last(t.Saga) {
		return t.Saga
	}
	for _, r := range t.Refunds {
		if last(r) {
			return r
		}
	}
	return nil
}

// sagaReply is the reply the ledger gives for a decided saga (reply.FromSaga),
// its steps read from the fold's records.
func (f *Fold) sagaReply(t *domain.Transfer, sg *domain.Saga) reply.Reply {
	r, _ := reply.FromSaga(reply.SagaOf(t, sg), false, func(_, stepKey string) (*reply.Step, error) {
		return reply.StepOf(f.stepRecords[stepKey]), nil
	})
	return r
}

// Finish runs the checks that need the whole history: claims, sagas and money
// conservation (invariants 1 and 2) and the final balances (invariant 3). A
// fold whose sets are in PostgreSQL (Run) finishes with FinishContext.
func (f *Fold) Finish() []Totals {
	out, _ := f.FinishContext(context.Background()) // the memory's sets fail never
	return out
}

// FinishContext is Finish, with the set queries of sets kept in PostgreSQL.
func (f *Fold) FinishContext(ctx context.Context) ([]Totals, error) {
	if err := f.sets.finish(ctx, f); err != nil {
		return nil, err
	}
	return f.finish(), nil
}

func (f *Fold) finish() []Totals {
	f.finishSnapshots()
	f.finishTransactions()
	f.finishSagas()
	out := f.finishConservation()
	f.finishCommands()
	f.finishBatches()
	return out
}

// finishSagas checks invariant 2 for sagas: each saga's steps agree with its
// stage (adding up the money in flight), and no step belongs to a saga that no
// transfer stream records.
func (f *Fold) finishSagas() {
	sagas := map[string]bool{}
	tids := make([]string, 0, len(f.Transfers))
	for id := range f.Transfers {
		tids = append(tids, id)
	}
	sort.Strings(tids)
	for _, id := range tids {
		f.checkTransfer(id, f.Transfers[id], sagas)
	}
	orphans := make([]string, 0)
	for k := range f.steps {
		if !sagas[k] {
			orphans = append(orphans, k)
		}
	}
	sort.Strings(orphans)
	for _, k := range orphans {
		f.violate(Violation{Invariant: InvConservation, Kind: "orphan_step", Message: fmt.Sprintf("money moved by a step of saga %q, which no transfer stream records", k)})
	}
}

// checkSaga checks that the steps one saga of transfer id applied in account
// streams agree with the saga: each at most once, for its amount and currency,
// as its stage allows. A pending saga's money is in flight.
func (f *Fold) checkSaga(id string, s *domain.Saga) {
	if f.badStream[domain.AccountStream(s.Out)] || f.badStream[domain.AccountStream(s.In)] || f.badStream[domain.TransferStream(id)] {
		return // a stream it touches does not fold: that violation is named already
	}
	st := f.steps[s.Key]
	if st == nil {
		st = &sagaSteps{currency: s.Currency}
	}
	stream := domain.TransferStream(id)
	bad := func(format string, args ...any) {
		f.violate(Violation{Invariant: InvConservation, Kind: "saga_mismatch", Stream: stream, Message: fmt.Sprintf("saga %q: ", s.Key) + fmt.Sprintf(format, args...)})
	}
	if st.debits > 1 || st.credits > 1 || st.comps > 1 {
		bad("a step moved money more than once (%d debits, %d credits, %d compensations)", st.debits, st.credits, st.comps)
	}
	want := s.Amount
	if s.UpTo && s.Stage == domain.SagaPending && st.debits == 1 && st.debit <= s.Amount {
		want = st.debit // a transfer with up_to records what moved once it is decided
	}
	for _, amt := range []struct {
		n   int
		sum int64
	}{{st.debits, st.debit}, {st.credits, st.credit}, {st.comps, st.compensate}} {
		if amt.n == 1 && amt.sum != want {
			bad("a step moved %d of a saga of %d", amt.sum, want)
		}
	}
	if st.currency != s.Currency {
		bad("steps in %s for a saga in %s", st.currency, s.Currency)
	}
	f.checkSagaStage(s, st, bad)
	f.totals(s.Currency).InFlight += st.debit - st.credit - st.compensate
}

// checkSagaStage checks that the steps a saga applied are the ones its stage
// allows; a saga not yet decided counts as pending.
func (f *Fold) checkSagaStage(s *domain.Saga, st *sagaSteps, bad func(format string, args ...any)) {
	switch s.Stage {
	case domain.SagaCompleted:
		if st.debits != 1 || st.credits != 1 || st.comps != 0 {
			bad("completed with %d debits, %d credits, %d compensations", st.debits, st.credits, st.comps)
		}
	case domain.SagaRejected:
		if st.debits != 0 || st.credits != 0 || st.comps != 0 {
			bad("rejected, yet money moved (%d debits, %d credits, %d compensations)", st.debits, st.credits, st.comps)
		}
	case domain.SagaFailed:
		if st.debits != 1 || st.credits != 0 || st.comps != 1 {
			bad("failed with %d debits, %d credits, %d compensations", st.debits, st.credits, st.comps)
		}
	default:
		f.totals(s.Currency).PendingSaga++
		if st.credits+st.comps > st.debits {
			bad("credited before it was debited")
		}
	}
}

// finishConservation adds the open accounts' balances to each currency's totals
// and checks invariant 2, money conservation, per currency; it returns the
// totals sorted by currency.
func (f *Fold) finishConservation() []Totals {
	for _, a := range f.Accounts {
		if !a.Opened {
			continue
		}
		t := f.totals(a.Currency)
		t.Balances += a.Balance
		t.Accounts++
	}
	f.resumed.addUntouched(f)
	out := make([]Totals, 0, len(f.flows))
	for _, t := range f.flows {
		out = append(out, *t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Currency < out[j].Currency })
	for _, t := range out {
		want := t.Deposits - t.Withdrawals - t.RefundsOut + t.RefundsIn
		if t.Balances+t.InFlight != want {
			f.violate(Violation{Invariant: InvConservation, Kind: "money_not_conserved", Message: fmt.Sprintf(
				"%s: balances %d + in flight %d = %d, but deposits %d - withdrawals %d - refunds out %d + refunds in %d = %d",
				t.Currency, t.Balances, t.InFlight, t.Balances+t.InFlight, t.Deposits, t.Withdrawals, t.RefundsOut, t.RefundsIn, want)})
		}
	}
	return out
}

// finishCommands checks invariant 1 for a command whose events were cut short.
func (f *Fold) finishCommands() {
	for stream, ss := range f.streams {
		if ss.groupKey != "" && ss.groupNext < ss.groupCount {
			f.violate(Violation{Invariant: InvKeyOnce, Kind: "incomplete_command", Stream: stream, Revision: int64(ss.next) - 1,
				Message: fmt.Sprintf("key %q wrote %d of its %d events", ss.groupKey, ss.groupNext, ss.groupCount)})
		}
	}
}

// legSums are a transaction's debits and credits in one currency.
type legSums struct{ debits, credits int64 }

// sagaCurrencies lists the currencies of a reservation saga's postings.
func sagaCurrencies(ts *domain.TransactionSaga) []string {
	var out []string
	if ts.Requested != nil {
		for _, p := range ts.Requested.Postings {
			if !slices.Contains(out, p.Currency) {
				out = append(out, p.Currency)
			}
		}
	}
	return out
}

func (l *legSums) add(amount int64, credit bool) {
	if credit {
		l.credits += amount
	} else {
		l.debits += amount
	}
}

func (f *Fold) legSums(m map[[2]string]*legSums, key, currency string) *legSums {
	k := [2]string{key, currency}
	f.touchLegs(k)
	if m[k] == nil {
		m[k] = &legSums{}
	}
	return m[k]
}

// ownOutcome gives a decided transaction saga's outcome event data of its
// own. A store's page holds its events' bytes in shared blocks (PostgreSQL's
// of up to 64 KiB, eventstore/postgres's eventBytes), and the fold keeps a
// decided saga until it settles, some past their page: its outcome's data,
// a slice of the page's block, kept the whole block live (29 MB of the
// 119 MB the audit's fold held at the end of 1,000,000 events over 100,000
// accounts, in 1,444 sagas; issue 23). The copy has the same bytes.
func ownOutcome(ts *domain.TransactionSaga) {
	if ts.Outcome != nil {
		ts.Outcome.Data = slices.Clone(ts.Outcome.Data)
	}
}

// applyTransaction folds a transaction stream's one event: the key's home, the
// reply the commands read model must hold, and what its legs must sum to.
func (f *Fold) applyTransaction(re eventstore.RecordedEvent, ev domain.StoredEvent, md meta) {
	m := ev.Metadata
	f.noteHome(re, m)
	f.touch(re.Stream)
	ts := f.txSagas[re.Stream]
	if ts == nil {
		ts = domain.NewTransactionSaga(strings.TrimPrefix(re.Stream, domain.TransactionStreamPrefix))
		f.txSagas[re.Stream] = ts
	}
	payload, err := md.payloadOf(re)
	if err := domain.EvolveTransactionSagaDecoded(ts, ev, payload, err); err != nil {
		f.eventViolation(InvStreams, "transaction_rewritten", re, "%v", err)
		return
	}
	if !ts.Decided() || ts.Outcome.Revision != re.Revision {
		return // a reservation saga's request or marker
	}
	ownOutcome(ts)
	f.checkTransactionRefund(re, payload)
	key := domain.ClientKey(m) // a saga's outcome is written under a derived key
	if p, ok := payload.(*domain.TransactionPosted); ok {
		for _, ps := range p.Postings {
			f.legSums(f.posted, key, ps.Currency).debits += ps.Amount
			f.legSums(f.posted, key, ps.Currency).credits += ps.Amount
		}
	}
	r, err := reply.Transaction(key, domain.EventRef{ID: re.ID, Stream: re.Stream, Revision: re.Revision, Type: re.Type}, payload, re.Position.String(), false)
	if err != nil {
		f.eventViolation(InvStreams, "undecodable_event", re, "%v", err)
		return
	}
	if !f.NoRows {
		f.sets.row(f, "commands", key, "", digestNote(replyRow(r)))
	}
}

// finishTransactions checks every transaction's legs (invariant 2): in each
// currency, its debits equal its credits and the postings of its
// TransactionPosted, and no legs exist without one; the same for every capture
// into an account (its HoldCaptured is the debit, the credit to `to` the credit).
// A capture saga whose guard still stands on `to` (domain/capturesaga.go) may
// have captured without crediting yet: what it captured is in flight.
func (f *Fold) finishTransactions() {
	running := map[string]bool{} // keys of reservation and capture sagas still running
	for _, ts := range f.txSagas {
		if !ts.Decided() && ts.Key != "" {
			running[ts.Key] = true
			for _, cur := range sagaCurrencies(ts) {
				f.totals(cur).PendingSaga++
			}
		}
	}
	for _, a := range f.Accounts {
		for id, h := range a.Holds {
			if key, ok := domain.CaptureGuardKey(id); ok && h.Status == domain.HoldStatusActive {
				running[key] = true
				f.totals(a.Currency).PendingSaga++
			}
		}
	}
	keys := map[[2]string]bool{}
	for k := range f.legs {
		keys[k] = true
	}
	for k := range f.posted {
		keys[k] = true
	}
	for _, k := range slices.SortedFunc(maps.Keys(keys), func(a, b [2]string) int { return strings.Compare(a[0]+"\x00"+a[1], b[0]+"\x00"+b[1]) }) {
		legs, posted := f.legs[k], f.posted[k]
		if legs == nil {
			legs = &legSums{}
		}
		if posted == nil {
			posted = &legSums{}
		}
		if running[k[0]] { // its legs are being posted: what left an account is in flight
			f.totals(k[1]).InFlight += legs.debits - legs.credits
			continue
		}
		if legs.debits != legs.credits || *legs != *posted {
			f.violate(Violation{Invariant: InvConservation, Kind: "transaction_unbalanced", Message: fmt.Sprintf(
				"transaction or capture of key %q in %s: legs debit %d and credit %d, its postings (or capture) %d", k[0], k[1], legs.debits, legs.credits, posted.debits)})
		}
	}
}

// incrementalOfAll reports whether f folds an incremental audit of the whole
// ledger (from a checkpoint, not of one account): the one that checks the
// accounts its events did not touch against their checkpoint rows, and
// reads only the touched accounts' rows by effective time.
func (f *Fold) incrementalOfAll(account string) bool { return f.resumed != nil && account == "" }
