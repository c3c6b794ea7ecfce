package domain

import (
	"errors"
	"fmt"
)

// Keys checked by the store (ARCHITECTURE: hot accounts and long histories). An
// aggregate remembers only its most recent keys (Account.KeyLimit); the store
// keeps every key's events, and each of them states the account it leaves, so
// the record of a key of any age is rebuilt from its own events: a duplicate of
// it gets its original reply, forever, without folding the history.

// ErrNoAfterState means an event does not state the account it leaves: it was
// written before events did. Its key's record is rebuilt by folding the stream
// up to it instead (the caller's slower way).
var ErrNoAfterState = errors.New("domain: the event does not state the account after it")

// Leaves is the balance and held amount an account event leaves.
type Leaves struct{ Balance, Held int64 }

// AfterOf is what an account event leaves, as the event states it
// (AccountChange).
func AfterOf(payload any) (Leaves, error) {
	e, err := asAccountEvent(payload)
	if err != nil {
		return Leaves{}, fmt.Errorf("domain: %w", err)
	}
	return afterOf(e.Change())
}

// afterOf is AfterOf of what an event changes.
func afterOf(c AccountChange) (Leaves, error) {
	if !c.Balance.Known || !c.Held.Known {
		return Leaves{}, ErrNoAfterState
	}
	return Leaves{Balance: c.Balance.Value, Held: c.Held.Value}, nil
}

// RecallKey rebuilds the record of a key the aggregate has forgotten from the
// key's events as the store holds them (evs: its first event, metadata index 0,
// and the rest of its write, in order), and remembers it. It reads nothing of
// the account but its name and currency: each event states what it leaves.
// An event that does not (ErrNoAfterState) leaves the aggregate unchanged.
func (a *Account) RecallKey(evs []StoredEvent) (*KeyRecord, error) {
	if len(evs) == 0 || evs[0].Metadata.Index != 0 || len(evs) != evs[0].Metadata.Count {
		return nil, fmt.Errorf("domain: %s: a key's record needs all of its write's events, from the first", a.ID)
	}
	m := evs[0].Metadata
	rec := &KeyRecord{Key: m.Key, Command: internCommand(m.Command), RequestHash: ParseHash(m.RequestHash), Status: StatusApplied, Code: CodeOK}
	for i, ev := range evs {
		if ev.Metadata.Key != m.Key || ev.Metadata.Index != i || (i > 0 && ev.Revision != evs[i-1].Revision+1) {
			return nil, fmt.Errorf("domain: %s@%d is not event %d of key %q", ev.Stream, ev.Revision, i, m.Key)
		}
		payload, err := DecodeEvent(ev.Type, ev.Data)
		if err != nil {
			return nil, err
		}
		e, err := asAccountEvent(payload)
		if err != nil {
			return nil, fmt.Errorf("domain: %w", err)
		}
		c := e.Change()
		left, err := afterOf(c)
		if err != nil {
			return nil, err
		}
		rec.Events = append(rec.Events, EventRef{ID: ev.ID, Stream: ev.Stream, Revision: ev.Revision, Type: internEventType(ev.Type)})
		rec.Position = ev.Position
		rec.note(c)
		rec.after = afterCounts{balance: left.Balance, held: left.Held, revision: ev.Revision}
	}
	rec.ident = a.identity()
	a.remember(rec)
	return rec, nil
}

// Remember adds a key's record rebuilt elsewhere (by folding another aggregate of
// the same account up to it) to the aggregate's recent keys.
func (a *Account) Remember(rec *KeyRecord) {
	c := *rec
	c.ident = a.identity()
	a.remember(&c)
}

// note records what an event of the key tells its record beyond its reference.
func (rec *KeyRecord) note(c AccountChange) {
	if c.Refused {
		rec.Status, rec.Code, rec.Message = StatusRejected, c.Code, c.Message
	}
	if c.Moves {
		rec.noteAmount(c.Amount)
	}
	if c.UpTo {
		rec.upTo, rec.Amount = true, c.Amount
	}
}

// Moved is the amount a command with up_to moved (v1.2 §2.3: a withdrawal or
// a transfer's debit), and whether the record is one; its reply's "moved".
func (rec *KeyRecord) Moved() (int64, bool) {
	return rec.Amount, rec.upTo
}
