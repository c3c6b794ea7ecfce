package domain

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Capture sagas: capture_hold with `to` (v1.1) on a store that cannot append to
// several streams at once (KurrentDB through its v4 client), with the outcome
// of DecideCaptureTo: the captured amount credited to `to`, the rest of the
// hold released, or the capture refused and nothing moved. The client's key K
// is claimed first (its request is what a recovery reads back, CaptureToCommand);
// then, each step a command under its own key, so that running it again (a
// retry, the transfer process after a crash) answers the first outcome:
//
//	StepKey(K, "capture_guard")  on `to`: HoldPlaced of CaptureGuardHoldID(K) for 0,
//	                             or a recorded refusal (closed, another currency)
//	K                            on the held account: HoldCaptured with To, or a
//	                             recorded refusal (the held account's own, or the
//	                             guard's, "capture to <to>: ..."), exactly as one
//	                             decision writes it: the client's record, which
//	                             answers every duplicate
//	StepKey(K, StepCaptureTo)    on `to`: Credited, reason capture_in, the event
//	                             one append writes under the same key
//	StepKey(K, "capture_release") on `to`: HoldReleased of the guard, once the
//	                             credit is written or the capture was refused
//
// The guard reserves nothing, but an account with an active hold cannot be
// closed (it is not empty), and its currency never changes: once the guard is
// placed, the credit cannot be refused for what `to` is (only a balance leaving
// the int64 range could refuse it; that refusal is never recorded, and the saga
// then stays pending, its guard in place, for an operator). The capture is
// decided only after the guard is placed or refused, so no money leaves the
// held account unless its credit is sure.

// Steps of a capture saga (StepKey); StepCaptureTo is the credit.
const (
	StepCaptureGuard   = "capture_guard"
	StepCaptureRelease = "capture_release"
)

// CmdCaptureGuard is a capture saga's guard on its `to` account: a hold of
// nothing (decidePlaceHold), refused as the credit would be refused (closed,
// another currency), never for funds (available never falls below the
// overdraft floor, and the guard takes none of it).
const CmdCaptureGuard CommandType = "capture_guard"

// captureGuardPrefix starts the name of a capture saga's guard hold. "~" is not
// a character of client IDs, so no client hold takes the name.
const captureGuardPrefix = "capture~"

// CaptureGuardHoldID is the hold a capture saga of key places on its `to` account.
func CaptureGuardHoldID(key string) string { return captureGuardPrefix + key }

// CaptureGuardKey is the client key of the capture saga whose guard hold is
// holdID; false for any other hold.
func CaptureGuardKey(holdID string) (string, bool) {
	key, ok := strings.CutPrefix(holdID, captureGuardPrefix)
	return key, ok && key != ""
}

// CaptureGuardCommand is the guard step of capture on its `to` account, for
// money of currency (the held account's).
func CaptureGuardCommand(capture Command, currency string) Command {
	return Command{
		Type: CmdCaptureGuard, IdempotencyKey: StepKey(capture.IdempotencyKey, StepCaptureGuard), AccountID: capture.To,
		HoldID: CaptureGuardHoldID(capture.IdempotencyKey), Currency: currency, At: capture.At, EffectiveAt: capture.EffectiveAt, Origin: capture.IdempotencyKey, Ref: capture.HoldID,
	}
}

// CaptureSagaCredit is the credit step of capture: CaptureCreditCommand (the
// key and event one append writes) with the amount the capture took, in the
// held account's currency, and the capture's metadata.
func CaptureSagaCredit(capture Command, amount int64, currency string) Command {
	c := CaptureCreditCommand(capture)
	c.Amount, c.HasAmount, c.Currency, c.Metadata = amount, true, currency, capture.Metadata
	return c
}

// CaptureReleaseCommand is the step that releases capture's guard on `to`.
func CaptureReleaseCommand(capture Command) Command {
	return Command{
		Type: CmdReleaseHold, IdempotencyKey: StepKey(capture.IdempotencyKey, StepCaptureRelease), AccountID: capture.To,
		HoldID: CaptureGuardHoldID(capture.IdempotencyKey), At: capture.At, EffectiveAt: capture.EffectiveAt, Origin: capture.IdempotencyKey, Ref: capture.HoldID,
	}
}

// decideCaptureCredit credits a capture saga's amount to `to`, under its guard.
// A refusal (only a balance leaving the int64 range can refuse it) is never
// recorded: the saga stays pending rather than leave the money half-moved.
func (a *Account) decideCaptureCredit(cmd Command) Decision {
	d := a.decideCredit(cmd, movement{cmd.Amount, cmd.Currency, ReasonCaptureIn, cmd.HoldID}, false)
	if r := d.Rejection; r != nil {
		return reject(cmd, r.Code, false, "credit of capture %s: %s", cmd.Origin, r.Message)
	}
	return d
}

// refuseCaptureTo is a capture refused for its `to` account's refusal r: not
// recorded when r is not (the account does not exist), else recorded on the
// held account, naming `to`.
func refuseCaptureTo(cmd Command, r *Rejection) Decision {
	if !r.Recorded {
		return reject(cmd, r.Code, false, "%s", r.Message)
	}
	return reject(cmd, r.Code, true, "capture to %s: %s", cmd.To, r.Message)
}

// CaptureToCommand is the capture_hold with `to` that key was claimed for
// (c: its claim), read back from the claimed request: what a recovery drives.
// The request is decoded as the command was (DecodeCommand), so that every
// field of the request comes back, those added later too (effective_at,
// expected_revision: v1.2 §2.3).
func CaptureToCommand(key string, c *KeyClaimed) (Command, error) {
	req, err := ParseRequest(c.Request)
	if err != nil {
		return Command{}, fmt.Errorf("domain: claim of %q: %w", key, err)
	}
	typ, _ := req["type"].(string)
	body := map[string]any{"idempotency_key": key}
	for k, v := range req {
		if k != "type" {
			body[k] = v
		}
	}
	b, err := json.Marshal(body)
	if err != nil {
		return Command{}, fmt.Errorf("domain: claim of %q: %w", key, err)
	}
	cmd, ierr := DecodeCommand(CommandType(typ), b)
	if ierr != nil {
		return Command{}, fmt.Errorf("domain: claim of %q: %w", key, ierr)
	}
	if j, _ := Judge(c.DecidedFor(), cmd.Canonical()); cmd.Type != CmdCaptureHold || cmd.To == "" || j.Verdict != KeyDuplicate {
		return Command{}, fmt.Errorf("domain: key %q is not claimed by a capture into an account", key)
	}
	return cmd, nil
}
