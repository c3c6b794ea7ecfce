package domain

import (
	"time"
)

// Effective time (PROTOCOL.md §2.3, ARCHITECTURE decision 15): a command may
// say when its money moved in the world (effective_at), for a settlement booked
// late or a history migrated in. Decisions keep the record order; the rule here
// only bounds what a command may claim.

// MaxEffectiveSkew is how far after the record time an effective_at may lie:
// the client's clock may run ahead of the ledger's by this much (the time is
// stored as given).
const MaxEffectiveSkew = 5 * time.Second

// CheckEffective is the refusal (invalid_request, naming effective_at) of
// cmd's effective_at on account a, nil when it has none or it is allowed:
// never more than MaxEffectiveSkew after the record time cmd.At, and never
// before the account's own effective opening (a.EffectiveFrom; an account not
// opened has none). A transaction checks it on each of its accounts.
func (a *Account) CheckEffective(cmd Command) *InvalidError {
	return CheckEffectiveOn(cmd, a.ID, a.Opened, a.EffectiveFrom)
}

// CheckEffectiveOn is Account.CheckEffective on the account accountID, known
// only by whether it is opened and its effective opening (where a saga reads
// its accounts' facts before its first step).
func CheckEffectiveOn(cmd Command, accountID string, opened bool, effectiveFrom time.Time) *InvalidError {
	if cmd.EffectiveAt.IsZero() {
		return nil
	}
	if cmd.EffectiveAt.After(cmd.At.Add(MaxEffectiveSkew)) {
		return invalid("effective_at", "%s is later than the ledger's time %s (at most %s of clock skew)",
			cmd.EffectiveAt.Format(time.RFC3339Nano), cmd.At.UTC().Format(time.RFC3339Nano), MaxEffectiveSkew)
	}
	if opened && cmd.Type != CmdOpenAccount && BeforeOpening(cmd.EffectiveAt, effectiveFrom) {
		return invalid("effective_at", "%s is earlier than account %s's opening, effective %s",
			cmd.EffectiveAt.Format(time.RFC3339Nano), accountID, effectiveFrom.UTC().Format(time.RFC3339Nano))
	}
	return nil
}

// BeforeOpening reports whether the effective instant effective lies before
// an account's effective opening, both to the microsecond, as the read models
// keep them and queries answer by them: an opening is effective from its
// record time when it gave no effective_at, which the ledger's clock gives
// finer (and accounts recorded before effective_at was truncated at intake
// may carry a finer one).
func BeforeOpening(effective, opening time.Time) bool {
	return Instant(effective).Before(Instant(opening))
}

// Instant is t in UTC to the microsecond, as PostgreSQL's timestamptz keeps
// it (a finer fraction truncated): the instant the ledger decides, records and
// answers by for an effective_at given finer (Command.setTime), and that a
// query's time asks and echoes (as_of_effective; PROTOCOL.md §2.3).
func Instant(t time.Time) time.Time { return t.UTC().Truncate(time.Microsecond) }

// EffectivePtr is the command's effective_at as metadata carries it: nil when none given.
func (c Command) EffectivePtr() *time.Time {
	if c.EffectiveAt.IsZero() {
		return nil
	}
	t := c.EffectiveAt.UTC()
	return &t
}

// effectiveOf is the effective_at an event's metadata carries, zero when none.
func effectiveOf(m Metadata) time.Time {
	if m.EffectiveAt == nil {
		return time.Time{}
	}
	return *m.EffectiveAt
}
