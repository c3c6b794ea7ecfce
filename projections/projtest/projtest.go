// Package projtest sets up what the read side's tests share: a fresh PostgreSQL
// database with the migrations applied, the PostgreSQL event store on it, the
// ledger's command handler writing realistic events, and a mixed workload; and
// the checks that need internal/app/audit (which devtest cannot import): the
// audit of a store and its read models, and snapshots of the read models.
package projtest

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore/postgres"
	"github.com/ledgerworks/ledger/internal/app/ledger"
	"github.com/ledgerworks/ledger/internal/app/reply"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// Env is one test's database, store and ledger.
type Env struct {
	URL    string
	Pool   *pgxpool.Pool
	Store  *postgres.Store
	Ledger *ledger.Service
	// clock is the ledger's: it advances one millisecond per reading.
	clock *devtest.Clock
}

// New returns an Env on a fresh database; everything is closed when t ends.
func New(t testing.TB) *Env {
	t.Helper()
	url := devtest.DatabaseURL(t)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	st := devtest.Store(t, url)
	e := &Env{URL: url, Pool: pool, Store: st, clock: devtest.NewTickingClock(time.Millisecond)}
	e.Ledger = ledger.New(st, ledger.Options{Clock: e.clock.Now})
	return e
}

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
	w.defaults()
	r := &workloadRun{
		e:     e,
		w:     w,
		ctx:   context.Background(),
		rng:   rand.New(rand.NewPCG(w.Seed, 42)),
		holds: map[string][]string{}, revs: map[string]uint64{},
	}
	r.openAccounts(t)
	for range w.Commands {
		if len(r.history) > 0 && r.rng.Float64() < w.DupRate {
			h := r.history[r.rng.IntN(len(r.history))]
			e.Post(r.ctx, h.typ, h.body) // a retry: the original outcome
			continue
		}
		r.postRandom()
	}
	return r.keys
}

// defaults fills in the zero values of Workload.
func (w *Workload) defaults() {
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
}

// workloadRun is the state of one Run: what was sent, the keys decided, the
// originals one may refund and the holds one may capture or release.
type workloadRun struct {
	e          *Env
	w          Workload
	ctx        context.Context
	rng        *rand.Rand
	keys       []string
	history    []sentCommand
	refundable []string            // keys of applied deposits, transfers and transactions
	holds      map[string][]string // account -> active hold ids
	n          int                 // commands posted
	revs       map[string]uint64   // account -> its revision in the last reply that showed it
}

// sentCommand is a command as posted, to send again.
type sentCommand struct {
	typ  string
	body map[string]any
}

func (r *workloadRun) acct(i int) string { return fmt.Sprintf("%s-acct-%d", r.w.Prefix, i) }

// randomAcct picks one of the workload's accounts.
func (r *workloadRun) randomAcct() string { return r.acct(r.rng.IntN(r.w.Accounts)) }

// post sends a command under the next key, keeps the key when the command was
// decided, and remembers the command to send it again.
func (r *workloadRun) post(typ string, body map[string]any) reply.Reply {
	r.n++
	key := fmt.Sprintf("%s-k%d", r.w.Prefix, r.n)
	body["idempotency_key"] = key
	rep := r.e.Post(r.ctx, typ, body)
	if rep.Account != nil {
		r.revs[rep.Account.AccountID] = rep.Account.Revision
	}
	if rep.Status == domain.StatusApplied || rep.Status == domain.StatusRejected {
		r.keys = append(r.keys, key)
	}
	r.history = append(r.history, sentCommand{typ, body})
	return rep
}

// workloadOpened is when the workload's accounts opened in the world
// (effective_at, v1.2 §2.3): 30 days before the ledger's clock starts.
var workloadOpened = devtest.Epoch.Add(-30 * 24 * time.Hour)

// backdate books every fifth command (by its number, so that the workload's
// random draws stay as they were) late: effective a number of minutes after
// the accounts' effective opening.
func (r *workloadRun) backdate(body map[string]any) map[string]any {
	if r.n%5 == 4 {
		body["effective_at"] = workloadOpened.Add(time.Duration(r.n) * time.Minute).Format(time.RFC3339)
	}
	return body
}

// openAccounts opens the workload's accounts in EUR, effective
// workloadOpened, every third with an overdraft limit of 500.
func (r *workloadRun) openAccounts(t testing.TB) {
	t.Helper()
	for i := range r.w.Accounts {
		body := map[string]any{"account_id": r.acct(i), "currency": "EUR", "effective_at": workloadOpened.Format(time.RFC3339)}
		if i%3 == 0 {
			body["overdraft_limit"] = 500
		}
		if rep := r.post("open_account", body); rep.Status != domain.StatusApplied {
			t.Fatalf("projtest: open: %+v", rep)
		}
	}
}

// postRandom posts one command on a random account, of a kind drawn by weight.
func (r *workloadRun) postRandom() {
	a := r.randomAcct()
	amount := 1 + r.rng.IntN(1000)
	switch k := r.rng.IntN(100); {
	case k < 30:
		rep := r.post("deposit", r.backdate(r.conditions(map[string]any{"account_id": a, "amount": amount, "currency": "EUR"}, false)))
		if rep.Status == domain.StatusApplied {
			r.refundable = append(r.refundable, rep.IdempotencyKey)
		}
	case k < 45:
		rep := r.post("withdraw", r.conditions(map[string]any{"account_id": a, "amount": amount, "currency": "EUR"}, true))
		if rep.Status == domain.StatusApplied {
			r.refundable = append(r.refundable, rep.IdempotencyKey)
		}
	case k < 50:
		r.post("deposit", map[string]any{"account_id": a, "amount": amount, "currency": "USD"}) // currency_mismatch
	case k < 60:
		r.placeHold(a, amount)
	case k < 68:
		r.captureOldestHold(a)
	case k < 73:
		r.releaseNewestHold(a)
	case k < 80:
		r.refund()
	case k < 87:
		r.postTransaction()
	case k < 97:
		b := r.randomAcct()
		body := map[string]any{"transfer_id": fmt.Sprintf("%s-t%d", r.w.Prefix, r.n+1), "from": a, "to": b, "amount": amount, "currency": "EUR"}
		if (r.n+1)%3 == 0 {
			body["up_to"] = true // a sweep (v1.2 §2.3)
		}
		rep := r.post("transfer", body)
		if rep.Status == domain.StatusApplied {
			r.refundable = append(r.refundable, rep.IdempotencyKey) // refunded in one append where the store can, a saga elsewhere
		}
	default:
		r.post("close_account", map[string]any{"account_id": a})
	}
}

// conditions adds the conditions of v1.2 §2.3 to some commands, chosen by the
// command's number so that the workload's draws stay those of its seed: every
// fourth expects the revision the last reply showed of its account (stale
// when a command refused without record came between: a revision_mismatch),
// and, where sweep, every third withdraws up to its amount.
func (r *workloadRun) conditions(body map[string]any, sweep bool) map[string]any {
	next := r.n + 1
	if a, ok := body["account_id"].(string); ok && next%4 == 0 {
		body["expected_revision"] = r.revs[a]
	}
	if sweep && next%3 == 0 {
		body["up_to"] = true
	}
	return body
}

func (r *workloadRun) placeHold(a string, amount int) {
	id := fmt.Sprintf("h%d", r.n+1)
	rep := r.post("place_hold", map[string]any{"account_id": a, "hold_id": id, "amount": amount, "currency": "EUR"})
	if rep.Status == domain.StatusApplied {
		r.holds[a] = append(r.holds[a], id)
	}
}

// captureOldestHold captures a's oldest active hold, sometimes in part,
// sometimes into another account.
func (r *workloadRun) captureOldestHold(a string) {
	hs := r.holds[a]
	if len(hs) == 0 {
		return
	}
	id := hs[0]
	r.holds[a] = hs[1:]
	body := map[string]any{"account_id": a, "hold_id": id}
	if r.rng.IntN(2) == 0 {
		body["amount"] = 1
	}
	if to := r.randomAcct(); to != a && r.rng.IntN(2) == 0 {
		body["to"] = to // captured into another account (a capture saga on KurrentDB)
	}
	r.post("capture_hold", body)
}

func (r *workloadRun) releaseNewestHold(a string) {
	hs := r.holds[a]
	if len(hs) == 0 {
		return
	}
	id := hs[len(hs)-1]
	r.holds[a] = hs[:len(hs)-1]
	r.post("release_hold", map[string]any{"account_id": a, "hold_id": id})
}

// refund refunds an applied deposit, transfer or transaction, sometimes in part.
func (r *workloadRun) refund() {
	if len(r.refundable) == 0 {
		return
	}
	body := map[string]any{"original_key": r.refundable[r.rng.IntN(len(r.refundable))]}
	if r.rng.IntN(2) == 0 {
		body["amount"] = 1 + r.rng.IntN(50)
	}
	r.post("refund", body)
}

// postTransaction posts a transaction of 1-3 postings between distinct
// accounts; an applied one may be refunded too (in full).
func (r *workloadRun) postTransaction() {
	var postings []any
	for range 1 + r.rng.IntN(3) {
		from, to := r.randomAcct(), r.randomAcct()
		if from == to {
			to = r.acct((r.rng.IntN(r.w.Accounts-1) + 1 + r.rng.IntN(1)) % r.w.Accounts)
		}
		if from != to {
			postings = append(postings, map[string]any{"from": from, "to": to, "amount": 1 + r.rng.IntN(400), "currency": "EUR"})
		}
	}
	if len(postings) == 0 {
		return
	}
	rep := r.post("post_transaction", map[string]any{"transaction_id": fmt.Sprintf("%s-x%d", r.w.Prefix, r.n+1), "postings": postings})
	if rep.Status == domain.StatusApplied {
		r.refundable = append(r.refundable, rep.IdempotencyKey) // in full
	}
}

func mustJSON(v map[string]any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}
