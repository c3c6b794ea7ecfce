package audit

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/app/reply"
)

// Step is one event of a replayed stream and the stream's state right after it.
type Step struct {
	Event    eventstore.RecordedEvent `json:"-"`
	Metadata domain.Metadata          `json:"-"`
	// State is the state after the event: *AccountState, *TransferState,
	// *reply.TransactionDetail or *ClaimState.
	State any `json:"state"`
	// Err is set when the event does not fold (a broken stream): the replay stops.
	Err error `json:"-"`
}

// AccountState is an account as replay shows it.
type AccountState struct {
	AccountID      string            `json:"account_id"`
	Status         string            `json:"status"` // none, open or closed
	Currency       string            `json:"currency,omitempty"`
	OverdraftLimit int64             `json:"overdraft_limit"`
	Balance        int64             `json:"balance"`
	Held           int64             `json:"held"`
	Available      int64             `json:"available"`
	Revision       int64             `json:"revision"`
	Holds          []HoldState       `json:"holds,omitempty"`
	Metadata       map[string]string `json:"metadata,omitempty"`
	Keys           int               `json:"keys"` // commands decided
}

// HoldState is a hold as replay shows it.
type HoldState struct {
	HoldID    string     `json:"hold_id"`
	Amount    int64      `json:"amount"`
	Status    string     `json:"status"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
}

// TransferState is a transfer as replay shows it.
type TransferState struct {
	TransferID string      `json:"transfer_id"`
	From       string      `json:"from"`
	To         string      `json:"to"`
	Amount     int64       `json:"amount"`
	Currency   string      `json:"currency"`
	Status     string      `json:"status"`
	Stage      string      `json:"stage"`
	Code       string      `json:"code,omitempty"`
	Reserved   int64       `json:"refunds_reserved"`
	Refunds    []SagaState `json:"refunds,omitempty"`
	Revision   int64       `json:"revision"`
}

// SagaState is a refund saga of a transfer.
type SagaState struct {
	Key    string `json:"key"`
	Amount int64  `json:"amount"`
	Stage  string `json:"stage"`
	Code   string `json:"code,omitempty"`
}

// ClaimState is a key stream's claim.
type ClaimState struct {
	Key         string          `json:"key"`
	Command     string          `json:"command"`
	Stream      string          `json:"stream"`
	RequestHash string          `json:"request_hash"`
	Request     json.RawMessage `json:"request"`
}

// replayRecent bounds the keys, closed holds and refunded originals a
// replayed account keeps, as the ledger's aggregates do by default.
const replayRecent = 1024

// ErrUnknownStream is returned by Replay for a stream of no known kind.
var ErrUnknownStream = errors.New("audit: not an account-, transfer- or key- stream")

// Replay reads a stream from its first event up to and including toRevision
// (negative: to the end), folds each event with the domain's Evolve and hands the
// event and the state after it to fn. A stream that does not exist is
// eventstore.ErrStreamNotFound.
func Replay(ctx context.Context, r eventstore.StreamReader, stream string, toRevision int64, fn func(Step) error) error {
	fold, err := streamFold(stream)
	if err != nil {
		return err
	}
	errStop := errors.New("stop")
	err = readStreamTo(ctx, r, stream, toRevision, func(re eventstore.RecordedEvent) error {
		m, err := domain.DecodeMetadata(re.Metadata)
		step := Step{Event: re, Metadata: m}
		if err != nil {
			step.Err = err
			return cmp.Or(fn(step), errStop)
		}
		step.State, step.Err = fold(storedEvent(re, m))
		if err := fn(step); err != nil || step.Err != nil {
			return cmp.Or(err, errStop)
		}
		return nil
	})
	if errors.Is(err, errStop) {
		return nil
	}
	return err
}

// readStreamTo hands fn the events of a stream from its first up to and
// including toRevision (negative: to the end), read a page at a time; it
// stops at fn's first error and returns it.
func readStreamTo(ctx context.Context, r eventstore.StreamReader, stream string, toRevision int64, fn func(eventstore.RecordedEvent) error) error {
	return readStreamRange(ctx, r, stream, 0, toRevision, fn)
}

// readStreamRange is readStreamTo from revision next on, asking for no event
// after toRevision.
func readStreamRange(ctx context.Context, r eventstore.StreamReader, stream string, next uint64, toRevision int64, fn func(eventstore.RecordedEvent) error) error {
	const page = 1000
	for {
		n := page
		if toRevision >= 0 {
			n = int(min(int64(page), toRevision-int64(next)+1))
		}
		if n <= 0 {
			return nil
		}
		evs, err := r.ReadStream(ctx, stream, next, eventstore.Forwards, n)
		if err != nil {
			return err
		}
		for _, re := range evs {
			if toRevision >= 0 && int64(re.Revision) > toRevision {
				return nil
			}
			if err := fn(re); err != nil {
				return err
			}
		}
		if len(evs) < n {
			return nil
		}
		next = evs[len(evs)-1].Revision + 1
	}
}

// storedEvent is a recorded event as the domain folds it, with its metadata
// decoded (m).
func storedEvent(re eventstore.RecordedEvent, m domain.Metadata) domain.StoredEvent {
	return domain.StoredEvent{ID: re.ID, Stream: re.Stream, Revision: re.Revision, Position: re.Position.String(), Type: re.Type, Data: re.Data, Metadata: m}
}

// newReplayAccount is the account aggregate a replay folds: it keeps what
// the ledger's own keeps (the recent keys, closed holds and refunded
// originals), so that its memory does not grow with the stream.
func newReplayAccount(stream string) *domain.Account {
	a := domain.NewAccount(strings.TrimPrefix(stream, domain.AccountStreamPrefix))
	a.KeyLimit, a.HoldLimit, a.RefundLimit = replayRecent, replayRecent, replayRecent
	return a
}

// streamFold returns the fold of a stream's kind: an event and the state
// after it. ErrUnknownStream means the stream is of no known kind.
func streamFold(stream string) (func(domain.StoredEvent) (any, error), error) {
	switch {
	case strings.HasPrefix(stream, domain.AccountStreamPrefix):
		// The replay shows the state, not every key (newReplayAccount).
		a := newReplayAccount(stream)
		decided := 0
		return func(ev domain.StoredEvent) (any, error) {
			if err := domain.EvolveAccount(a, ev); err != nil {
				return nil, err
			}
			if ev.Metadata.Index == 0 {
				decided++
			}
			s := accountState(a)
			s.Keys = decided
			return s, nil
		}, nil
	case strings.HasPrefix(stream, domain.TransferStreamPrefix):
		t := domain.NewTransfer(strings.TrimPrefix(stream, domain.TransferStreamPrefix))
		return func(ev domain.StoredEvent) (any, error) {
			if err := domain.EvolveTransfer(t, ev); err != nil {
				return nil, err
			}
			return transferState(t), nil
		}, nil
	case domain.IsTransactionStream(stream):
		ts := domain.NewTransactionSaga(strings.TrimPrefix(stream, domain.TransactionStreamPrefix))
		return func(ev domain.StoredEvent) (any, error) { return foldTransaction(ts, ev) }, nil
	case strings.HasPrefix(stream, domain.KeyStreamPrefix):
		return foldClaim, nil
	default:
		return nil, fmt.Errorf("%w: %q", ErrUnknownStream, stream)
	}
}

// foldTransaction folds a transaction stream: one event (the outcome), or a
// reservation saga's request, markers and outcome. The state is the
// transaction as ledger.v1.query.transaction shows it once it has its outcome,
// and the saga's progress before.
func foldTransaction(ts *domain.TransactionSaga, ev domain.StoredEvent) (any, error) {
	if err := domain.EvolveTransactionSaga(ts, ev); err != nil {
		return nil, err
	}
	if !ts.Decided() {
		return &TransactionSagaState{TransactionID: ts.ID, IdempotencyKey: ts.Key, Status: "pending", Reserved: ts.Reserved, Refused: ts.Refused}, nil
	}
	payload, err := domain.DecodeEvent(ev.Type, ev.Data)
	if err != nil {
		return nil, err
	}
	d, err := reply.TransactionDetailOf(domain.ClientKey(ev.Metadata), payload, ev.Position)
	return &d, err
}

// TransactionSagaState is a reservation saga's state before its outcome, as
// `ledger replay` shows it.
type TransactionSagaState struct {
	TransactionID  string                                `json:"transaction_id"`
	IdempotencyKey string                                `json:"idempotency_key"`
	Status         string                                `json:"status"`
	Reserved       bool                                  `json:"reserved,omitempty"`
	Refused        *domain.TransactionReservationRefused `json:"refused,omitempty"`
}

// foldClaim folds a key stream, which holds only its claim.
func foldClaim(ev domain.StoredEvent) (any, error) {
	c, err := decodeClaim(ev.Type, ev.Data)
	if err != nil || ev.Revision != 0 {
		return nil, fmt.Errorf("audit: %s@%d: a key stream holds only its claim, not %s", ev.Stream, ev.Revision, ev.Type)
	}
	return &ClaimState{Key: c.Key, Command: c.Command, Stream: c.Stream, RequestHash: c.RequestHash, Request: c.Request}, nil
}

func accountState(a *domain.Account) *AccountState {
	s := &AccountState{AccountID: a.ID, Status: "none", Currency: a.Currency, OverdraftLimit: a.OverdraftLimit,
		Balance: a.Balance, Held: a.Held, Available: a.Available(), Revision: a.Revision, Metadata: a.Metadata, Keys: len(a.Keys)}
	if st := a.Status(); st != "" {
		s.Status = string(st)
	}
	for _, h := range a.Holds {
		hs := HoldState{HoldID: h.ID, Amount: h.Amount, Status: string(h.Status)}
		if !h.ExpiresAt.IsZero() {
			t := h.ExpiresAt
			hs.ExpiresAt = &t
		}
		s.Holds = append(s.Holds, hs)
	}
	sort.Slice(s.Holds, func(i, j int) bool { return s.Holds[i].HoldID < s.Holds[j].HoldID })
	return s
}

func transferState(t *domain.Transfer) *TransferState {
	s := &TransferState{TransferID: t.ID, From: t.From, To: t.To, Amount: t.Amount, Currency: t.Currency, Reserved: t.Reserved, Revision: t.Revision}
	if t.Saga != nil {
		s.Status, s.Stage = t.Saga.Stage.Status(), t.Saga.Stage.String()
		if t.Saga.Code != domain.CodeOK {
			s.Code = string(t.Saga.Code)
		}
	}
	for _, k := range t.RefundOrder {
		r := t.Refunds[k]
		ss := SagaState{Key: k, Amount: r.Amount, Stage: r.Stage.String()}
		if r.Code != domain.CodeOK {
			ss.Code = string(r.Code)
		}
		s.Refunds = append(s.Refunds, ss)
	}
	return s
}
