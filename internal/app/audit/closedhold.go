package audit

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/ledgerworks/ledger/domain"
)

// What the fold keeps of an account's last closed hold, which the account
// forgets (forgetClosedHold): its ID and status in the stream's state, and a
// digest of all a snapshot carries of it, so that a snapshot's copy of the
// hold is still compared (sameSnapshot) and a checkpoint row can carry it
// (accountSnapshot, restoreClosedHold).

// holdDigest is a SHA-256, truncated to 16 bytes, of what a snapshot carries
// of a hold: the audit is a tamper check, so no cheaper sum.
type holdDigest [16]byte

func digestHold(h *domain.Hold) holdDigest {
	exp := ""
	if !h.ExpiresAt.IsZero() {
		exp = h.ExpiresAt.UTC().Format(time.RFC3339Nano)
	}
	sum := sha256.New()
	fmt.Fprintf(sum, "%d:%s|%d|%d:%s|%d:%s|%d:%s|%t", len(h.ID), h.ID, h.Amount, len(exp), exp, len(h.Status), h.Status, len(h.Key), h.Key, h.Findable)
	var d holdDigest
	copy(d[:], sum.Sum(nil))
	return d
}

// stubKeyPrefix marks the key of the hold a checkpoint row carries in place
// of a closed hold the fold forgot: its ID and status, amount 0 and this
// prefix before the hex of its digest, findable as the hold was. No hold
// placed has amount 0.
const stubKeyPrefix = "audit-closed-hold-digest:"

func holdStub(ss *streamState) *domain.Hold {
	return &domain.Hold{ID: ss.closedHold, Status: ss.closedStatus, Findable: ss.closedFindable, Key: stubKeyPrefix + hex.EncodeToString(ss.closedDigest[:])}
}

// stubDigest is the digest a stub carries; ok is false for a hold that is
// not a stub of this form (a stub of c4c1c2f carried no digest).
func stubDigest(h *domain.Hold) (d holdDigest, ok bool) {
	if h.Amount != 0 || !strings.HasPrefix(h.Key, stubKeyPrefix) {
		return d, false
	}
	b, err := hex.DecodeString(strings.TrimPrefix(h.Key, stubKeyPrefix))
	if err != nil || len(b) != len(d) {
		return d, false
	}
	copy(d[:], b)
	return d, true
}

// isStub reports whether a closed hold read from a checkpoint row stands in
// for one the fold forgot (amount 0: no hold placed has it).
func isStub(h *domain.Hold) bool { return h.Amount == 0 }

// sameSnapshot is domain.SameState of a snapshot and the fold's account a,
// with the last closed hold a forgot, kept in its stream's state ss: the
// snapshot's copy of it must match its digest (then it is compared as a's
// own) or, missing, the snapshot must say it forgot holds and the hold be one
// a ledger forgets (findable, as domain.SameState has it); and with the not
// findable refunded originals a forgot that the snapshot lists
// (lendRefunded).
func sameSnapshot(ss *streamState, snap, a *domain.Account) (bool, string) {
	defer lendRefunded(snap, a)()
	if ss == nil || ss.closedHold == "" || a.Holds[ss.closedHold] != nil {
		return domain.SameState(snap, a)
	}
	h := snap.Holds[ss.closedHold]
	switch {
	case h == nil && !snap.ForgotHolds():
		return false, fmt.Sprintf("hold %s (%s) missing from a snapshot that says it forgot none", ss.closedHold, ss.closedStatus)
	case h == nil && !ss.closedFindable && !snap.ForgetUnfindableHolds:
		return false, fmt.Sprintf("hold %s (%s), not findable, missing from the snapshot", ss.closedHold, ss.closedStatus)
	case h != nil && digestHold(h) != ss.closedDigest:
		return false, fmt.Sprintf("hold %s %s amount %d key %q findable %t, not the stream's (%s)", h.ID, h.Status, h.Amount, h.Key, h.Findable, ss.closedStatus)
	case h != nil:
		defer lendHold(a, h)() // the stream's hold: compare the rest with it in place
	}
	return domain.SameState(snap, a)
}

// lendHold puts h among a's holds until the function it returns is called,
// which leaves them as they were (emptied, nil, as ForgetClosedHold leaves
// them: not a group allocated for every account that lent one).
func lendHold(a *domain.Account, h *domain.Hold) func() {
	a.SetHold(h)
	return func() {
		delete(a.Holds, h.ID)
		if len(a.Holds) == 0 {
			a.Holds = nil
		}
	}
}
