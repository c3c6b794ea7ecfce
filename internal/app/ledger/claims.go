package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/app/reply"
)

// A client key is bound to one request forever by the single KeyClaimed event of
// its key stream (domain.KeyStream). The claim is written with the command's first
// write to its home stream; its event ID is derived from the key and the request
// hash, so the same request re-claims idempotently and a different request with the
// same key is refused by the store itself (wrong expected revision on the key
// stream), whichever account or transfer it names. This catches key reuse across
// streams, which a per-stream aggregate cannot see.

// claimConflict is an append refused because the key is claimed by another request.
type claimConflict struct {
	fields []string
}

func (c *claimConflict) Error() string {
	return "ledger: idempotency key claimed by a different request: " + strings.Join(c.fields, ", ")
}

// claimEventKey is the "key" from which the claim's event ID is derived.
func claimEventKey(key, hash string) string { return key + "#" + hash }

// claimPart is the claim of cmd's key for its decision in home, whose first event
// is to be written at revision first.
func (s *Service) claimPart(cmd domain.Command, req domain.Canonical, home string, first uint64) (eventstore.StreamAppend, error) {
	data := domain.EncodeKeyClaimed(cmd.IdempotencyKey, string(cmd.Type), req, home, first)
	m := domain.Metadata{Key: cmd.IdempotencyKey, Command: string(cmd.Type), RequestHash: req.Hash, At: cmd.At}
	return s.keyStreamPart(m, domain.EvKeyClaimed, data)
}

// keyPartWritten is a key stream's part (keyStreamPart: one event) as the
// append whose result is res left it: what repeats.foundAt is asked of.
func keyPartWritten(part eventstore.StreamAppend, res eventstore.AppendResult) (written, error) {
	if len(part.Events) != 1 {
		return written{}, fmt.Errorf("ledger: %s: a key's part of %d events", part.Stream, len(part.Events))
	}
	ev := part.Events[0]
	m, err := domain.DecodeMetadata(ev.Metadata)
	if err != nil {
		return written{}, err
	}
	stored := domain.StoredEvent{ID: ev.ID, Stream: part.Stream, Revision: res.FirstRevision, Type: ev.Type, Data: ev.Data, Metadata: m}
	return written{events: []domain.StoredEvent{stored}, idempotent: res.Idempotent}, nil
}

// mustBeNew makes part, the key's part of an atomic command (its claim, or
// an atomic batch's decision) written in one append with the command's other
// parts, refuse a repeat (eventstore.StreamAppend.MustBeNew): every path reads
// the key before deciding, so a stored claim means another decision of the key
// was written meanwhile, perhaps another one (one instance refusing what
// another applies on a fresher state), whose event IDs, named by the key's
// intent, its other parts share. The refusal (a wrong expected revision on the
// key stream, claimError) is decided again and answered from the stored
// decision, as an idempotent part was (anyIdempotent). The claim written
// alone before its home write (a store that appends one stream a write) is
// claimed again idempotently by a later attempt, as is an atomic batch's
// element decided alone before.
func mustBeNew(part eventstore.StreamAppend, err error) (eventstore.StreamAppend, error) {
	part.MustBeNew = true
	return part, err
}

// keyStreamPart is the single event of a key's stream (m.Key's), of type typ
// (a claim, or an atomic batch's decision) with data: written expecting no
// stream, its ID derived from the key and the request's hash (m.RequestHash),
// so that the same request writes it again idempotently and another one is
// refused by the store. m carries the key, the command, the hash and the time.
func (s *Service) keyStreamPart(m domain.Metadata, typ string, data []byte) (eventstore.StreamAppend, error) {
	ks := domain.KeyStream(m.Key)
	id := domain.EventID(claimEventKey(m.Key, m.RequestHash), ks, 0)
	m.Count, m.Producer, m.Schema = 1, s.opts.Producer, 1
	m.Chain = domain.ChainHash("", domain.StoredEvent{ID: id, Stream: ks, Type: typ, Data: data, Metadata: m})
	meta, err := domain.EncodeMetadata(m)
	if err != nil {
		return eventstore.StreamAppend{}, err
	}
	return eventstore.StreamAppend{Stream: ks, Expected: eventstore.NoStream, Events: []eventstore.EventData{{
		ID: id, Type: typ, Data: data, Metadata: meta,
	}}}, nil
}

// appendWithClaim writes the claim and the home stream's events (the
// appender's withClaim) and turns a refusal of the claim into a claimConflict.
func (s *Service) appendWithClaim(ctx context.Context, claim, home eventstore.StreamAppend, req domain.Canonical) (eventstore.AppendResult, error) {
	res, err := s.appends.withClaim(ctx, claim, home)
	if err != nil {
		return eventstore.AppendResult{}, s.claimError(ctx, claim.Stream, req, err)
	}
	return res, nil
}

// refusedAppend classifies the error of a command's append: a key claimed by
// another request is answered with the conflict; a concurrent write (a wrong
// expected revision, or event IDs the store already holds) is retried, decided
// again on the store's head; any other error is returned. A nil error is
// neither answered nor retried.
func refusedAppend(key string, err error) (outcome, error) {
	var conflict *claimConflict
	switch {
	case err == nil:
		return outcome{}, nil
	case errors.As(err, &conflict):
		return answer(reply.Conflict(key, conflict.fields)), nil
	case errors.Is(err, eventstore.ErrWrongExpectedRevision), errors.Is(err, eventstore.ErrDuplicateEventID):
		return outcome{retry: true}, nil
	}
	return outcome{}, err
}

// claimError turns a refusal on the key stream into a claimConflict.
func (s *Service) claimError(ctx context.Context, keyStream string, req domain.Canonical, err error) error {
	var wrong *eventstore.WrongExpectedRevisionError
	if !errors.As(err, &wrong) || wrong.Stream != keyStream {
		return err
	}
	key := strings.TrimPrefix(keyStream, domain.KeyStreamPrefix)
	c, rerr := s.readClaim(ctx, key)
	if rerr != nil {
		return rerr
	}
	if c == nil {
		// The store holds a claim its reads cannot show (a KurrentDB key stream
		// soft-deleted or truncated by its metadata): deciding again could
		// move money a second time. Not a wrong expected revision: no retry.
		return fmt.Errorf("ledger: key %q: the store refused its claim as taken (%v), but reads of %s cannot show the claim (deleted or truncated?): the command is stopped", key, err, keyStream)
	}
	j, jerr := domain.Judge(c.DecidedFor(), req)
	switch {
	case jerr != nil:
		return jerr
	case j.Verdict == domain.KeyDuplicate:
		return err // same request claimed by a racer: the retry finds its decision
	}
	return &claimConflict{fields: j.Fields}
}

// claimVerdict is a client key's claim as read (c; nil: never claimed), the
// verdict on a request under it (domain.Judge), and, when the key is bound
// to another request, the conflict's answer.
type claimVerdict struct {
	c *domain.KeyClaimed
	domain.Judgement
	conflict outcome
}

// judgeClaim reads key's claim and judges req under it: the one way a client
// key's claim is judged.
func (s *Service) judgeClaim(ctx context.Context, key string, req domain.Canonical) (claimVerdict, error) {
	c, err := s.readClaim(ctx, key)
	if err != nil {
		return claimVerdict{}, err
	}
	j, err := domain.Judge(c.DecidedFor(), req)
	if err != nil {
		return claimVerdict{}, err
	}
	v := claimVerdict{c: c, Judgement: j}
	if j.Verdict == domain.KeyConflict {
		v.conflict = answer(reply.Conflict(key, j.Fields))
	}
	return v, nil
}

// readClaim returns the claim of a client key, or nil when the key was never claimed.
func (s *Service) readClaim(ctx context.Context, key string) (*domain.KeyClaimed, error) {
	if c, ok := s.claims.Get(key); ok {
		return c, nil
	}
	evs, err := s.store.ReadStream(ctx, domain.KeyStream(key), 0, eventstore.Forwards, 1)
	if errors.Is(err, eventstore.ErrStreamNotFound) || (err == nil && len(evs) == 0) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var c domain.KeyClaimed
	// An atomic batch's decision is its key's claim too (domain.BatchDecided).
	if t := evs[0].Type; (t != domain.EvKeyClaimed && t != domain.EvBatchDecided) || json.Unmarshal(evs[0].Data, &c) != nil {
		return nil, fmt.Errorf("ledger: key stream of %q holds %s, not a claim", key, evs[0].Type)
	}
	s.claims.Add(key, &c)
	return &c, nil
}
