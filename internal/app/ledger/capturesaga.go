package ledger

import (
	"context"
	"fmt"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/app/reply"
)

// Capture sagas (domain/capturesaga.go): capture_hold with `to` on a store
// that cannot append to several streams at once. The client's key is claimed
// for the held account; then a guard (a hold of nothing) is placed on `to`,
// the capture decided on the held account under the client's key (with the
// guard's refusal, if it was refused), and, behind the guard, `to` credited
// and the guard released, each step under a derived key. The handler runs it
// inline under the key stream's lock (nothing else locks key streams; each
// step takes its account's), and the transfer process finishes one left
// half-way by a crash (ResumeCapture), which it finds by its guard.

// captureTo decides a capture_hold with `to` on a store without
// multi-stream appends. Its reply is the held account's record of the key, as
// for one decision, once `to` is credited (or the guard released after a
// refusal); every later send of the key answers that record.
func (m sagaMover) captureTo(ctx context.Context, cmd domain.Command) (Reply, error) {
	s, req := m.s, cmd.Canonical()
	unlock, err := s.locks.lock(ctx, domain.KeyStream(cmd.IdempotencyKey))
	if err != nil {
		return Reply{}, err
	}
	defer unlock()
	v, err := s.judgeClaim(ctx, cmd.IdempotencyKey, req)
	wrote := false
	switch {
	case err != nil || v.conflict.answered:
		return v.conflict.r, err
	case v.Verdict == domain.KeyNew:
		var o outcome
		if o, wrote, err = s.startCaptureTo(ctx, cmd, req); err != nil || o.answered {
			return o.r, err
		}
	}
	// Claimed before this call (v.c): a saga that started, which may be
	// decided already. The reply is a duplicate unless this call wrote the
	// claim (its request), as a transfer's (finishSaga) or a transaction's
	// is: whoever decides the capture, and a retry after a crash.
	ans, err := s.driveCaptureTo(ctx, cmd, req, v.c != nil)
	switch {
	case err != nil:
		return Reply{}, err
	case ans.r != nil:
		return *ans.r, nil
	}
	return ownedRecordReply(ans.rec, !wrote), nil
}

// startCaptureTo begins the saga of a key never claimed: an account that does
// not exist refuses the capture without a record, as one decision does (the
// held account's own refusals first: into a missing `to`, the capture is
// decided on the held account alone and can only be refused, so it needs no
// guard); otherwise the key is claimed for the held account, where its
// decision is to be written; an answer when the command is answered, and
// whether this call wrote the claim (not a repeat of another call's, repeats.go).
func (s *Service) startCaptureTo(ctx context.Context, cmd domain.Command, req domain.Canonical) (outcome, bool, error) {
	held, err := s.accountFacts(ctx, cmd.AccountID)
	if err != nil || !held.opened {
		return answer(reply.NotRecorded(cmd.IdempotencyKey, domain.MissingAccount(cmd.AccountID))), false, err
	}
	if ierr, err := s.effectiveRefused(ctx, cmd, cmd.AccountID, cmd.To); ierr != nil || err != nil {
		return answer(reply.Invalid(cmd.IdempotencyKey, ierr)), false, err
	}
	heldStream := domain.AccountStream(cmd.AccountID)
	switch open, err := s.accountOpened(ctx, cmd.To); {
	case err != nil:
		return answer(Reply{}), false, err
	case !open:
		c := cmd
		c.ToRefusal = domain.MissingAccount(cmd.To)
		ans, err := s.decideOnAccount(ctx, c, heldStream, cmd.AccountID, true)
		if err != nil {
			return answer(Reply{}), false, err
		}
		return answer(ans.reply()), false, nil
	}
	claim, err := s.claimPart(cmd, req, heldStream, held.next)
	if err != nil {
		return answer(Reply{}), false, err
	}
	res, err := s.appends.one(ctx, claim)
	if err != nil {
		// Claimed meanwhile by the same request (another instance): go on.
		o, err := refusedAppend(cmd.IdempotencyKey, s.claimError(ctx, claim.Stream, req, err))
		return outcome{r: o.r, answered: o.answered || err != nil}, false, err
	}
	w, err := keyPartWritten(claim, res)
	if err != nil {
		return answer(Reply{}), false, err
	}
	repeat, err := s.repeats.foundAt(ctx, claim.Stream, w)
	return outcome{}, err == nil && !repeat, err
}

// driveCaptureTo runs the saga of a claimed capture cmd from wherever it
// stands (known: the capture may have been decided already) to its end, and
// answers the capture's record, or the reply of a key found bound to another
// request.
func (s *Service) driveCaptureTo(ctx context.Context, cmd domain.Command, req domain.Canonical, known bool) (accountAnswer, error) {
	held := domain.AccountStream(cmd.AccountID)
	if known {
		if ans, err := s.capturedKey(ctx, held, cmd, req); err != nil || ans.r != nil {
			return ans, err
		} else if ans.rec != nil { // decided: behind a guard still standing, finish
			guarded, err := s.captureGuarded(ctx, cmd)
			if err == nil && guarded {
				err = s.finishCaptureTo(ctx, cmd, ans.rec)
			}
			return accountAnswer{rec: ans.rec}, err
		}
	}
	facts, err := s.accountFacts(ctx, cmd.AccountID)
	if err != nil {
		return accountAnswer{}, err
	}
	guard, err := s.stepWithFailpoint(ctx, domain.CaptureGuardCommand(cmd, facts.currency), "capture/guard")
	if err != nil {
		return accountAnswer{}, err
	}
	capture := cmd
	guarded := guard.Status == domain.StatusApplied
	if !guarded {
		capture.ToRefusal = &domain.Rejection{Code: guard.Code, Message: guard.Message, Recorded: true}
	}
	ans, err := s.decideOnAccount(ctx, capture, held, cmd.AccountID, true)
	if err != nil {
		return accountAnswer{}, err
	}
	if r := ans.r; r != nil { // a capture of an account that exists is recorded, and its key is claimed for it
		return accountAnswer{}, fmt.Errorf("%w: capture %q on %s: %s: %s", errStepNotRecorded, cmd.IdempotencyKey, cmd.AccountID, r.Code, r.Message)
	}
	if err := s.fail("capture/captured"); err != nil {
		return accountAnswer{}, err
	}
	if guarded {
		err = s.finishCaptureTo(ctx, cmd, ans.rec)
	}
	return accountAnswer{rec: ans.rec}, err
}

// finishCaptureTo credits `to` with what the capture (rec) took, when it
// applied, then releases the guard: in that order, so that `to` cannot close
// before it is credited.
func (s *Service) finishCaptureTo(ctx context.Context, cmd domain.Command, rec *ownedRecord) error {
	if rec.Status == domain.StatusApplied {
		captured, err := s.readCaptured(ctx, rec)
		if err != nil {
			return err
		}
		if _, err := s.stepWithFailpoint(ctx, domain.CaptureSagaCredit(cmd, captured.Amount, captured.Currency), "capture/credit"); err != nil {
			return err
		}
	}
	_, err := s.stepWithFailpoint(ctx, domain.CaptureReleaseCommand(cmd), "capture/release")
	return err
}

// readCaptured reads the HoldCaptured event of a capture's record: what it took.
func (s *Service) readCaptured(ctx context.Context, rec *ownedRecord) (*domain.HoldCaptured, error) {
	if len(rec.Events) != 1 {
		return nil, fmt.Errorf("ledger: capture %q wrote %d events", rec.Key, len(rec.Events))
	}
	ref := rec.Events[0]
	evs, err := s.store.ReadStream(ctx, ref.Stream, ref.Revision, eventstore.Forwards, 1)
	if err != nil {
		return nil, err
	}
	if len(evs) != 1 || evs[0].ID != ref.ID {
		return nil, fmt.Errorf("ledger: %s: the capture of %q is not at revision %d", ref.Stream, rec.Key, ref.Revision)
	}
	payload, err := domain.DecodeEvent(evs[0].Type, evs[0].Data)
	if err != nil {
		return nil, err
	}
	captured, ok := payload.(*domain.HoldCaptured)
	if !ok {
		return nil, fmt.Errorf("ledger: %s@%d: the capture of %q is %s", ref.Stream, ref.Revision, rec.Key, evs[0].Type)
	}
	return captured, nil
}

// capturedKey looks the capture's key up on the held account (on the store's
// head) without deciding it: its record, a conflict's reply, or neither.
func (s *Service) capturedKey(ctx context.Context, held string, cmd domain.Command, req domain.Canonical) (ans accountAnswer, err error) {
	err = s.whenSettled(ctx, held, func() error {
		acc, err := s.loadAccount(ctx, held, cmd.AccountID, true)
		if err != nil {
			return err
		}
		ans, err = s.answerKnownKey(ctx, &accountWrite{cmd: cmd, req: req, stream: held, acc: acc}, true)
		return err
	})
	return ans, err
}

// captureInFlight: a capture saga is in flight until its guard is released
// (its credit written), as a transfer's or a transaction's saga is.
func (m sagaMover) captureInFlight(ctx context.Context, key string, c *domain.KeyClaimed) (bool, error) {
	cmd, err := domain.CaptureToCommand(key, c)
	if err != nil {
		return false, nil // not a capture into an account
	}
	return m.s.captureGuarded(ctx, cmd)
}

// captureGuarded reports whether the capture's guard stands on `to`. A hold
// is never placed again once released, so a guard found released is done.
func (s *Service) captureGuarded(ctx context.Context, cmd domain.Command) (guarded bool, err error) {
	stream, hold := domain.AccountStream(cmd.To), domain.CaptureGuardHoldID(cmd.IdempotencyKey)
	err = s.whenSettled(ctx, stream, func() error {
		acc, err := s.loadAccount(ctx, stream, cmd.To, true)
		if err == nil {
			h := acc.Holds[hold]
			guarded = h != nil && h.Status == domain.HoldStatusActive
		}
		return err
	})
	return guarded, err
}

// ResumeCapture drives the capture saga of key to its end from whatever state
// it is in (the transfer process, which found its guard, after a crash): the
// capture decided if it was not, `to` credited and the guard released.
// pending is false once nothing is left to do.
func (s *Service) ResumeCapture(ctx context.Context, key string) (pending bool, err error) {
	unlock, err := s.locks.lock(ctx, domain.KeyStream(key))
	if err != nil {
		return true, err
	}
	defer unlock()
	c, err := s.readClaim(ctx, key)
	if err != nil {
		return true, err
	}
	if c == nil {
		return true, fmt.Errorf("ledger: the capture saga of %q has no claim", key)
	}
	cmd, err := domain.CaptureToCommand(key, c)
	if err != nil {
		return true, err
	}
	cmd.At = s.opts.Clock().UTC()
	ans, err := s.driveCaptureTo(ctx, cmd, cmd.Canonical(), true)
	if r := ans.r; err == nil && r != nil {
		err = fmt.Errorf("ledger: resuming the capture of %q: %s: %s", key, r.Code, r.Message)
	}
	return err != nil, err
}
