// Package projtest sets up what the read side's tests share: a fresh PostgreSQL
// database with the migrations applied, the PostgreSQL event store on it, the
// ledger's command handler writing realistic events, and a mixed workload.
package projtest

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore/postgres"
	"github.com/ledgerworks/ledger/internal/ledger"
	"github.com/ledgerworks/ledger/internal/pgtest"
	"github.com/ledgerworks/ledger/internal/reply"
	"github.com/ledgerworks/ledger/migrations"
)

// Env is one test's database, store and ledger.
type Env struct {
	URL    string
	Pool   *pgxpool.Pool
	Store  *postgres.Store
	Ledger *ledger.Service
	// Now is the ledger's clock: it advances one millisecond per command.
	now atomic.Int64
}

// New returns an Env on a fresh database; everything is closed when t ends.
func New(t testing.TB) *Env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := pgtest.URL(t)
	if err := migrations.Up(ctx, url); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	st, err := postgres.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	e := &Env{URL: url, Pool: pool, Store: st}
	e.now.Store(time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC).UnixMilli())
	e.Ledger = ledger.New(st, ledger.Options{Clock: e.clock})
	return e
}

func (e *Env) clock() time.Time { return time.UnixMilli(e.now.Add(1)).UTC() }

// Post sends one command to the ledger and returns its reply.
func (e *Env) Post(ctx context.Context, typ string, body map[string]any) reply.Reply {
	cmd, ierr := domain.DecodeCommand(domain.CommandType(typ), mustJSON(body))
	if ierr != nil {
		panic(fmt.Sprintf("projtest: %s %v: %v", typ, body, ierr))
	}
	return e.Ledger.Handle(ctx, cmd)
}

// MustApply posts a command that must be applied.
func (e *Env) MustApply(t testing.TB, typ string, body map[string]any) reply.Reply {
	t.Helper()
	r := e.Post(context.Background(), typ, body)
	if r.Status != domain.StatusApplied {
		t.Fatalf("projtest: %s %v: %+v", typ, body, r)
	}
	return r
}

// Workload describes a mixed workload.
type Workload struct {
	Accounts int     // accounts opened (default 8)
	Commands int     // commands after the openings (default 200)
	DupRate  float64 // share of commands sent again with the same key (default 0.2)
	Prefix   string  // prefix of account IDs and keys (default "w")
	Seed     uint64
}

// Run posts a mixed workload: deposits, withdrawals (some refused), holds placed,
// captured in part or released, refunds, transfers, transactions of 1-3
// postings (on a store that posts them), closes, each sometimes
// repeated with the same key. It returns the keys whose commands were decided.
func (e *Env) Run(t testing.TB, w Workload) []string {
	t.Helper()
	if w.Accounts <= 0 {
		w.Accounts = 8
	}
	if w.Commands <= 0 {
		w.Commands = 200
	}
	if w.DupRate == 0 {
		w.DupRate = 0.2
	}
	if w.Prefix == "" {
		w.Prefix = "w"
	}
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(w.Seed, 42))
	acct := func(i int) string { return fmt.Sprintf("%s-acct-%d", w.Prefix, i) }
	var keys []string
	type sent struct {
		typ  string
		body map[string]any
	}
	var history []sent
	var deposits []string
	holds := map[string][]string{} // account -> active hold ids
	n := 0
	post := func(typ string, body map[string]any) reply.Reply {
		n++
		key := fmt.Sprintf("%s-k%d", w.Prefix, n)
		body["idempotency_key"] = key
		r := e.Post(ctx, typ, body)
		if r.Status == domain.StatusApplied || r.Status == domain.StatusRejected {
			keys = append(keys, key)
		}
		history = append(history, sent{typ, body})
		return r
	}
	for i := range w.Accounts {
		body := map[string]any{"account_id": acct(i), "currency": "EUR"}
		if i%3 == 0 {
			body["overdraft_limit"] = 500
		}
		if r := post("open_account", body); r.Status != domain.StatusApplied {
			t.Fatalf("projtest: open: %+v", r)
		}
	}
	for range w.Commands {
		if len(history) > 0 && rng.Float64() < w.DupRate {
			h := history[rng.IntN(len(history))]
			e.Post(ctx, h.typ, h.body) // a retry: the original outcome
			continue
		}
		a := acct(rng.IntN(w.Accounts))
		amount := 1 + rng.IntN(1000)
		switch k := rng.IntN(100); {
		case k < 30:
			r := post("deposit", map[string]any{"account_id": a, "amount": amount, "currency": "EUR"})
			if r.Status == domain.StatusApplied {
				deposits = append(deposits, r.IdempotencyKey)
			}
		case k < 45:
			post("withdraw", map[string]any{"account_id": a, "amount": amount, "currency": "EUR"})
		case k < 50:
			post("deposit", map[string]any{"account_id": a, "amount": amount, "currency": "USD"}) // currency_mismatch
		case k < 60:
			id := fmt.Sprintf("h%d", n+1)
			r := post("place_hold", map[string]any{"account_id": a, "hold_id": id, "amount": amount, "currency": "EUR"})
			if r.Status == domain.StatusApplied {
				holds[a] = append(holds[a], id)
			}
		case k < 68:
			if hs := holds[a]; len(hs) > 0 {
				id := hs[0]
				holds[a] = hs[1:]
				body := map[string]any{"account_id": a, "hold_id": id}
				if rng.IntN(2) == 0 {
					body["amount"] = 1
				}
				if to := acct(rng.IntN(w.Accounts)); to != a && rng.IntN(2) == 0 {
					body["to"] = to // captured into another account (on a store that can)
				}
				post("capture_hold", body)
			}
		case k < 73:
			if hs := holds[a]; len(hs) > 0 {
				id := hs[len(hs)-1]
				holds[a] = hs[:len(hs)-1]
				post("release_hold", map[string]any{"account_id": a, "hold_id": id})
			}
		case k < 80:
			if len(deposits) > 0 {
				body := map[string]any{"original_key": deposits[rng.IntN(len(deposits))]}
				if rng.IntN(2) == 0 {
					body["amount"] = 1 + rng.IntN(50)
				}
				post("refund", body)
			}
		case k < 87:
			var postings []any
			for range 1 + rng.IntN(3) {
				from, to := acct(rng.IntN(w.Accounts)), acct(rng.IntN(w.Accounts))
				if from == to {
					to = acct((rng.IntN(w.Accounts-1) + 1 + rng.IntN(1)) % w.Accounts)
				}
				if from != to {
					postings = append(postings, map[string]any{"from": from, "to": to, "amount": 1 + rng.IntN(400), "currency": "EUR"})
				}
			}
			if len(postings) > 0 {
				r := post("post_transaction", map[string]any{"transaction_id": fmt.Sprintf("%s-x%d", w.Prefix, n+1), "postings": postings})
				if r.Status == domain.StatusApplied {
					deposits = append(deposits, r.IdempotencyKey) // refundable too (a transaction, in full)
				}
			}
		case k < 97:
			b := acct(rng.IntN(w.Accounts))
			post("transfer", map[string]any{"transfer_id": fmt.Sprintf("%s-t%d", w.Prefix, n+1), "from": a, "to": b, "amount": amount, "currency": "EUR"})
		default:
			post("close_account", map[string]any{"account_id": a})
		}
	}
	return keys
}

func mustJSON(v map[string]any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}
