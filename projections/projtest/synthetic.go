package projtest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerworks/ledger/domain"
)

// Synthetic writes about n events straight into the events table, as the ledger
// would have written them, much faster than the ledger can (for benchmarks): per
// command a KeyClaimed in the key's stream and the decision in an account stream
// (deposits, withdrawals, recorded insufficient_funds rejections, holds placed and
// released), with consistent balances, metadata and hash chains, over one
// account per 200 events (SyntheticAccounts chooses the accounts). Each chunk
// of 10,000 events is one transaction. It returns the number of events written.
func (e *Env) Synthetic(tb testing.TB, n int, seed uint64) int {
	tb.Helper()
	return e.SyntheticAccounts(tb, n, 0, seed)
}

// SyntheticAccounts is Synthetic over the given number of accounts (0: one
// per 200 events, at least 10).
func (e *Env) SyntheticAccounts(tb testing.TB, n, accounts int, seed uint64) int {
	tb.Helper()
	if accounts <= 0 {
		accounts = max(n/200, 10)
	}
	return e.NewSynthetic(tb, accounts, seed).Write(n)
}

// SyntheticHistory is a synthetic history that Write writes on, over the
// same accounts (an incremental audit's benchmark writes more after a first
// audit).
type SyntheticHistory struct {
	sw     *synthWriter
	rng    *rand.Rand
	accs   []*synthAccount
	target int
}

// NewSynthetic starts a synthetic history of the given number of accounts:
// their openings are written by the first Write, and counted in it.
func (e *Env) NewSynthetic(tb testing.TB, accounts int, seed uint64) *SyntheticHistory {
	h := &SyntheticHistory{rng: rand.New(rand.NewPCG(seed, 7)), accs: make([]*synthAccount, accounts),
		sw: &synthWriter{e: e, tb: tb, ctx: context.Background(), at: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}}
	for i := range h.accs {
		h.accs[i] = &synthAccount{id: fmt.Sprintf("syn-%d", i), rev: -1}
		h.sw.decide(h.accs[i], string(domain.CmdOpenAccount), domain.EvAccountOpened, domain.AccountOpened{AccountID: h.accs[i].id, Currency: "EUR"})
	}
	return h
}

// Write writes about n events more, on accounts drawn at random, and returns
// the events written in all.
func (h *SyntheticHistory) Write(n int) int {
	h.target += n
	for h.sw.written < h.target {
		a := h.accs[h.rng.IntN(len(h.accs))]
		amount := int64(1 + h.rng.IntN(1000))
		h.sw.decideRandom(a, amount, h.rng.IntN(100))
	}
	h.sw.flush()
	return h.sw.written
}

// synthAccount is a synthetic account as written so far: its stream's revision
// and chain, its balance and its one active hold.
type synthAccount struct {
	id            string
	rev           int64
	balance, held int64
	chain         string
	hold          string
}

// synthWriter copies synthetic events into the events table in chunks of
// 10,000, one command a millisecond.
type synthWriter struct {
	e       *Env
	tb      testing.TB
	ctx     context.Context
	at      time.Time
	rows    [][]any
	written int
	cmd     int
}

// decideRandom decides one command on a, of a kind drawn by k (0-99): a
// deposit, a withdrawal (refused when the funds are short), a hold placed or
// released. A hold that cannot be placed or released writes nothing.
func (sw *synthWriter) decideRandom(a *synthAccount, amount int64, k int) {
	switch {
	case k < 50:
		a.balance += amount
		sw.decide(a, string(domain.CmdDeposit), domain.EvCredited, domain.Credited{Amount: amount, Currency: "EUR", Reason: domain.ReasonDeposit, BalanceAfter: a.balance})
	case k < 80:
		if a.balance-a.held < amount {
			sw.decide(a, string(domain.CmdWithdraw), domain.EvCommandRejected, domain.CommandRejected{Command: string(domain.CmdWithdraw), Code: domain.CodeInsufficientFunds, Message: "insufficient funds"})
			return
		}
		a.balance -= amount
		sw.decide(a, string(domain.CmdWithdraw), domain.EvDebited, domain.Debited{Amount: amount, Currency: "EUR", Reason: domain.ReasonWithdrawal, BalanceAfter: a.balance})
	case k < 90:
		if a.hold != "" || a.balance-a.held < amount {
			return
		}
		a.hold = fmt.Sprintf("h%d", sw.cmd)
		a.held += amount
		sw.decide(a, string(domain.CmdPlaceHold), domain.EvHoldPlaced, domain.HoldPlaced{HoldID: a.hold, Amount: amount, Currency: "EUR", HeldAfter: a.held})
	default:
		if a.hold == "" {
			return
		}
		sw.decide(a, string(domain.CmdReleaseHold), domain.EvHoldReleased, domain.HoldReleased{HoldID: a.hold, Amount: a.held, Reason: domain.ReasonHoldReleased, HeldAfter: 0})
		a.hold, a.held = "", 0
	}
}

// decide writes one command on a: its KeyClaimed in the key's stream and its
// decision in a's stream.
func (sw *synthWriter) decide(a *synthAccount, command string, typ string, data any) {
	sw.cmd++
	sw.at = sw.at.Add(time.Millisecond)
	key := fmt.Sprintf("syn-%d", sw.cmd)
	stream := domain.AccountStream(a.id)
	req, _ := json.Marshal(map[string]any{"type": command, "account_id": a.id})
	claim := domain.KeyClaimed{Key: key, Command: command, RequestHash: "", Request: req, Stream: stream}
	sum := sha256.Sum256(req)
	claim.RequestHash = hex.EncodeToString(sum[:])
	c := synthCommand{key: key, command: command, request: req}
	sw.add(c, synthEvent{stream: domain.KeyStream(key), typ: domain.EvKeyClaimed, data: claim})
	a.rev++
	a.chain = sw.add(c, synthEvent{stream: stream, rev: a.rev, prev: a.chain, typ: typ, data: data})
}

// synthCommand is the command a synthetic event records in its metadata.
type synthCommand struct {
	key, command string
	request      []byte
}

// synthEvent is a synthetic event: its stream and revision, the chain hash
// of the event before it in its stream (prev), its type and payload.
type synthEvent struct {
	stream    string
	rev       int64
	prev, typ string
	data      any
}

// add queues one event, its metadata and chain hash as the ledger writes them,
// and returns its chain hash.
func (sw *synthWriter) add(c synthCommand, e synthEvent) string {
	b, err := json.Marshal(e.data)
	if err != nil {
		sw.tb.Fatal(err)
	}
	hash := sha256.Sum256(c.request)
	m := domain.Metadata{Key: c.key, Command: c.command, RequestHash: hex.EncodeToString(hash[:]), Count: 1, At: sw.at, Request: c.request, Schema: 1}
	stream, rev, typ := e.stream, e.rev, e.typ
	id := domain.EventID(c.key, stream, 0)
	m.Chain = domain.ChainHash(e.prev, domain.StoredEvent{ID: id, Stream: stream, Revision: uint64(rev), Type: typ, Data: b, Metadata: m})
	mb, err := json.Marshal(m)
	if err != nil {
		sw.tb.Fatal(err)
	}
	// [16]byte: pgx writes it as a binary uuid; a uuid.UUID would go through
	// its driver.Valuer, a string parsed again.
	sw.rows = append(sw.rows, []any{stream, rev, [16]byte(id), typ, b, mb})
	sw.written++
	if len(sw.rows) == 10_000 {
		sw.flush()
	}
	return m.Chain
}

// flush copies the queued events into the events table.
func (sw *synthWriter) flush() {
	if len(sw.rows) == 0 {
		return
	}
	_, err := sw.e.Pool.CopyFrom(sw.ctx, pgx.Identifier{"events"}, []string{"stream", "revision", "event_id", "type", "data", "metadata"}, pgx.CopyFromRows(sw.rows))
	if err != nil {
		sw.tb.Fatalf("projtest: copy events: %v", err)
	}
	sw.rows = sw.rows[:0]
}
