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
// released), with consistent balances, metadata and hash chains. Each chunk of
// 10,000 events is one transaction. It returns the number of events written.
func (e *Env) Synthetic(tb testing.TB, n int, seed uint64) int {
	tb.Helper()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 7))
	accounts := max(n/200, 10)
	type acct struct {
		id            string
		rev           int64
		balance, held int64
		chain         string
		hold          string
	}
	accs := make([]*acct, accounts)
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var rows [][]any
	written, cmd := 0, 0
	flush := func() {
		if len(rows) == 0 {
			return
		}
		_, err := e.Pool.CopyFrom(ctx, pgx.Identifier{"events"}, []string{"stream", "revision", "event_id", "type", "data", "metadata"}, pgx.CopyFromRows(rows))
		if err != nil {
			tb.Fatalf("projtest: copy events: %v", err)
		}
		rows = rows[:0]
	}
	add := func(stream string, rev int64, prev string, key, command, typ string, data any, request []byte) string {
		b, err := json.Marshal(data)
		if err != nil {
			tb.Fatal(err)
		}
		hash := sha256.Sum256(request)
		m := domain.Metadata{Key: key, Command: command, RequestHash: hex.EncodeToString(hash[:]), Count: 1, At: at, Request: request, Schema: 1}
		id := domain.EventID(key, stream, 0)
		m.Chain = domain.ChainHash(prev, domain.StoredEvent{ID: id, Stream: stream, Revision: uint64(rev), Type: typ, Data: b, Metadata: m})
		mb, err := json.Marshal(m)
		if err != nil {
			tb.Fatal(err)
		}
		rows = append(rows, []any{stream, rev, id, typ, b, mb})
		written++
		if len(rows) == 10_000 {
			flush()
		}
		return m.Chain
	}
	decide := func(a *acct, command string, typ string, data any) {
		cmd++
		at = at.Add(time.Millisecond)
		key := fmt.Sprintf("syn-%d", cmd)
		stream := domain.AccountStream(a.id)
		req, _ := json.Marshal(map[string]any{"type": command, "account_id": a.id})
		claim := domain.KeyClaimed{Key: key, Command: command, RequestHash: "", Request: req, Stream: stream}
		sum := sha256.Sum256(req)
		claim.RequestHash = hex.EncodeToString(sum[:])
		add(domain.KeyStream(key), 0, "", key, command, domain.EvKeyClaimed, claim, req)
		a.rev++
		a.chain = add(stream, a.rev, a.chain, key, command, typ, data, req)
	}
	for i := range accs {
		accs[i] = &acct{id: fmt.Sprintf("syn-%d", i), rev: -1}
		decide(accs[i], string(domain.CmdOpenAccount), domain.EvAccountOpened, domain.AccountOpened{AccountID: accs[i].id, Currency: "EUR"})
	}
	for written < n {
		a := accs[rng.IntN(len(accs))]
		amount := int64(1 + rng.IntN(1000))
		switch k := rng.IntN(100); {
		case k < 50:
			a.balance += amount
			decide(a, string(domain.CmdDeposit), domain.EvCredited, domain.Credited{Amount: amount, Currency: "EUR", Reason: domain.ReasonDeposit, BalanceAfter: a.balance})
		case k < 80:
			if a.balance-a.held < amount {
				decide(a, string(domain.CmdWithdraw), domain.EvCommandRejected, domain.CommandRejected{Command: string(domain.CmdWithdraw), Code: domain.CodeInsufficientFunds, Message: "insufficient funds"})
				continue
			}
			a.balance -= amount
			decide(a, string(domain.CmdWithdraw), domain.EvDebited, domain.Debited{Amount: amount, Currency: "EUR", Reason: domain.ReasonWithdrawal, BalanceAfter: a.balance})
		case k < 90:
			if a.hold != "" || a.balance-a.held < amount {
				continue
			}
			a.hold = fmt.Sprintf("h%d", cmd)
			a.held += amount
			decide(a, string(domain.CmdPlaceHold), domain.EvHoldPlaced, domain.HoldPlaced{HoldID: a.hold, Amount: amount, Currency: "EUR", HeldAfter: a.held})
		default:
			if a.hold == "" {
				continue
			}
			decide(a, string(domain.CmdReleaseHold), domain.EvHoldReleased, domain.HoldReleased{HoldID: a.hold, Amount: a.held, Reason: domain.ReasonHoldReleased, HeldAfter: 0})
			a.hold, a.held = "", 0
		}
	}
	flush()
	return written
}
