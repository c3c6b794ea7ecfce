package audit

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/google/uuid"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
)

// historySets keeps what the fold must remember of every event and every key:
// the sets that grow with history (every event ID, every command group, every
// client key's home and claim, the rows the read models' large tables should
// hold). memSets keeps them in Go maps (tests, the chaos checker, a store with
// no PostgreSQL at hand); pgSets in temporary tables of a PostgreSQL session,
// where set queries answer invariants 1 and 5 and a join compares the read
// models, so that the audit's memory does not grow with history.
type historySets interface {
	// eventID notes an event's ID (invariant 5: each stored once).
	eventID(f *Fold, re eventstore.RecordedEvent)
	// group notes the first event of a command group (invariant 1: a key's
	// events in a stream are one group).
	group(f *Fold, re eventstore.RecordedEvent, key string)
	// home notes an event of a client's own command: its key's home stream.
	home(f *Fold, re eventstore.RecordedEvent, key, hash string)
	// claim notes a key's claim.
	claim(f *Fold, re eventstore.RecordedEvent, key string, c claim)
	// row notes a row a read-model table of notedTables should hold (the last
	// noted for a key wins): its digest or its text (rowNote); accounts tags
	// the accounts it concerns (accountsTag; "" for none).
	row(f *Fold, table, key, account string, n rowNote)
	// flush stores what was noted (after each page of events).
	flush(ctx context.Context) error
	// finish runs the checks over the whole history (claims, duplicates).
	finish(ctx context.Context, f *Fold) error
	// keys is the number of client keys decided.
	keys(ctx context.Context) (int, error)
	// close drops what the sets keep outside the process.
	close()
}

type expRow struct {
	account, digest string
}

// memSets are historySets in Go maps: the checks run as events arrive.
type memSets struct {
	ids      map[uuid.UUID]struct{}
	groups   map[[16]byte]struct{} // (stream, key) pairs whose command started
	homes    map[string]string     // client key -> the stream that decided it
	homeHash map[string]string     // client key -> request hash
	claims   map[string]claim      // client key -> its claim
	rows     map[string]map[string]expRow
}

// accountsTag tags a row with the accounts it concerns: "|a|b|" (an account
// ID holds no "|"), so that a row of one account matches "|a|".
func accountsTag(ids ...string) string {
	return "|" + strings.Join(ids, "|") + "|"
}

func newMemSets() *memSets {
	return &memSets{ids: map[uuid.UUID]struct{}{}, groups: map[[16]byte]struct{}{}, homes: map[string]string{}, homeHash: map[string]string{},
		claims: map[string]claim{}, rows: map[string]map[string]expRow{}}
}

func (s *memSets) close() {}

func (s *memSets) eventID(f *Fold, re eventstore.RecordedEvent) {
	if _, dup := s.ids[re.ID]; dup {
		f.eventViolation(InvStreams, "duplicate_event_id", re, "event ID %s is stored twice", re.ID)
	}
	s.ids[re.ID] = struct{}{}
}

func (s *memSets) group(f *Fold, re eventstore.RecordedEvent, key string) {
	g := groupHash(re.Stream, key)
	if _, again := s.groups[g]; again {
		f.eventViolation(InvKeyOnce, "key_decided_twice", re, "key %q decided a second time in %s", key, re.Stream)
	}
	s.groups[g] = struct{}{}
}

func (s *memSets) home(f *Fold, re eventstore.RecordedEvent, key, hash string) {
	if home, ok := s.homes[key]; ok && home != re.Stream {
		f.eventViolation(InvKeyOnce, "key_decided_twice", re, "key %q decided in %s and again in %s", key, home, re.Stream)
		return
	}
	s.homes[key] = re.Stream
	s.homeHash[key] = hash
}

func (s *memSets) claim(f *Fold, re eventstore.RecordedEvent, key string, c claim) {
	if _, again := s.claims[key]; again {
		f.eventViolation(InvKeyOnce, "key_claimed_twice", re, "key %q is claimed a second time", key)
	}
	s.claims[key] = c
}

func (s *memSets) row(_ *Fold, table, key, account string, n rowNote) {
	if s.rows[table] == nil {
		s.rows[table] = map[string]expRow{}
	}
	s.rows[table][key] = expRow{account: account, digest: n.String()}
}

func (s *memSets) flush(context.Context) error { return nil }

func (s *memSets) keys(context.Context) (int, error) { return len(s.homes), nil }

// finish checks invariant 1: every decided client key is claimed by its
// request, for its stream.
func (s *memSets) finish(_ context.Context, f *Fold) error {
	keys := make([]string, 0, len(s.homes))
	for k := range s.homes {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		c, ok := s.claims[k]
		if err := f.checkClaim(k, s.homes[k], s.homeHash[k], c, ok); err != nil {
			return err
		}
	}
	return nil
}

// expected renders a hashed table's rows (only the account's, when set).
func (s *memSets) expected(table, account string) map[string]string {
	out := map[string]string{}
	for k, r := range s.rows[table] {
		if account == "" || strings.Contains(r.account, accountsTag(account)) {
			out[k] = r.digest
		}
	}
	return out
}

// checkClaim checks one decided key against its claim (invariant 1); an
// incremental audit looks up a claim missing after its checkpoint in the
// store (lookupClaim).
func (f *Fold) checkClaim(key, home, hash string, c claim, claimed bool) error {
	if !claimed && f.lookupClaim != nil {
		found, err := f.lookupClaim(key)
		if err != nil {
			return fmt.Errorf("audit: claim of %q: %w", key, err)
		}
		if claimed = found != nil; claimed {
			c = *found
		}
	}
	if c.decidedBefore != "" {
		f.violate(Violation{Invariant: InvKeyOnce, Kind: "key_decided_twice", Stream: home,
			Message: fmt.Sprintf("key %q decided before the checkpoint (%s) and again after it in %s", key, c.decidedBefore, home)})
	}
	if !claimed {
		f.violate(Violation{Invariant: InvKeyOnce, Kind: "unclaimed_key", Stream: home, Message: fmt.Sprintf("key %q was decided without a claim", key)})
		return nil
	}
	claimedHome := c.stream == home
	if !claimedHome {
		lost, err := f.slotsLost(key, c.stream, home)
		if err != nil {
			return fmt.Errorf("audit: claim of %q: %w", key, err)
		}
		claimedHome = lost
	}
	switch {
	case !claimedHome:
		f.violate(Violation{Invariant: InvKeyOnce, Kind: "claim_mismatch", Stream: home, Message: fmt.Sprintf("key %q is claimed for %s but decided in %s", key, c.stream, home)})
	case c.hash != hash:
		f.violate(Violation{Invariant: InvKeyOnce, Kind: "claim_mismatch", Stream: home, Message: fmt.Sprintf("key %q was decided for another request than its claim", key)})
	}
	return nil
}

// slotsLost reports whether a refund of a transaction claimed (by key) for
// the refund slot of stream claimed and decided in home, a later slot of the
// same transaction, lost every slot from the claimed one up to home to
// another key (domain.NextRefundSlot: on a store that appends one stream a
// write the claim is written before its slot). Each slot in between must
// begin with the decision of another client key, written before home began:
// a slot holding nothing, one holding this key's decision, or one written
// after home, and a home before the claimed slot or of another transaction,
// are not lost. A slot that begins with this key's decision, written before
// home, is met only by an incremental audit (a full one folds that decision
// first: it is the key's home) whose checkpoint comes after it, named
// key_decided_twice there only when the claim gives its revision
// (TestIncrementalAuditNamesAKeyDecidedAgainPastItsClaimedSlot). Read from
// the store (Reload, once per slot); false without one.
func (f *Fold) slotsLost(key, claimed, home string) (bool, error) {
	first := func(stream string) (*eventstore.RecordedEvent, error) {
		recs, err := f.Reload(stream, 1)
		switch {
		case errors.Is(err, eventstore.ErrStreamNotFound):
			return nil, nil
		case err != nil || len(recs) == 0:
			return nil, err
		}
		return &recs[0], nil
	}
	if f.Reload == nil {
		return false, nil
	}
	h, err := first(home)
	if h == nil || err != nil {
		return false, err
	}
	for slot := claimed; slot != home; {
		next, ok := domain.NextRefundSlot(slot)
		if !ok {
			return false, nil
		}
		re, err := first(slot)
		if re == nil || err != nil || re.Position.Compare(h.Position) >= 0 {
			return false, err
		}
		if m, err := domain.DecodeMetadataNoRequest(re.Metadata); err != nil || m.Origin != "" || m.Key == "" || m.Key == key {
			return false, nil
		}
		slot = next
	}
	return true, nil
}
