package ledger

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ledgerworks/ledger/internal/testing/devtest"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/eventstore/memory"
)

// propertySeed is the seed of a property test: def, or LEDGER_PROPERTY_SEED
// to replay another.
func propertySeed(t *testing.T, def int64) int64 {
	v := os.Getenv("LEDGER_PROPERTY_SEED")
	if v == "" {
		return def
	}
	seed, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return seed
}

// faultyStore fails some multi-stream appends: before anything is written, or
// after the transaction committed (the caller learns an error, the events stand).
type faultyStore struct {
	ProcessStore
	multi         eventstore.MultiAppender
	mu            sync.Mutex
	rng           *rand.Rand
	before, after atomic.Int64
}

var errInjected = errors.New("test: injected append failure")

// ReadStreamSubject passes the store's reads by subject through (the stores
// with multi-stream appends here, memory and PostgreSQL, have them).
func (f *faultyStore) ReadStreamSubject(ctx context.Context, stream, subject string, max int) ([]eventstore.RecordedEvent, error) {
	return f.ProcessStore.(eventstore.SubjectReader).ReadStreamSubject(ctx, stream, subject, max)
}

func (f *faultyStore) AppendMulti(ctx context.Context, parts []eventstore.StreamAppend) ([]eventstore.AppendResult, error) {
	f.mu.Lock()
	roll := f.rng.Intn(100)
	f.mu.Unlock()
	if roll < 3 {
		f.before.Add(1)
		return nil, errInjected
	}
	res, err := f.multi.AppendMulti(ctx, parts)
	if err == nil && roll < 5 {
		f.after.Add(1)
		return nil, fmt.Errorf("%w after commit", errInjected)
	}
	return res, err
}

// TestPropertyPipelinedHotAccounts sends random commands, most of them to three
// hot accounts, 20% of them resends of an earlier request, from workers spread
// over two instances (whose pipelines race each other's writes: wrong expected
// revisions in the middle of pipelined batches), over a store that fails some
// appends before or after they commit. The mix holds the pipelined
// single-account commands (deposits, withdrawals, holds, refunds of deposits
// and withdrawals) and, interleaved with them, the commands decided atomically
// over several accounts, pipelined on one of them and the others drained:
// transfers between hot
// and cold accounts, post_transaction with 1-3 postings (a quarter of them
// overdrawn by their last posting, some in the wrong currency for an account),
// capture_hold with `to`, and refunds of transfers and transactions.
//
// It checks that every key is decided once and answers its first definite reply
// forever (during the run, and resent to a fresh instance after it); PROTOCOL.md
// §6 invariants 1, 2, 3 and 5 (money conserved per currency), and that every
// transaction and capture into an account moved exactly what it posted or
// nothing (audit); and that a fresh ledger deciding the same keys one at a
// time, in the store's order of the decisions (decisionOrder), gives the same
// replies: the same events at the same revisions, the same balances, the same
// refusals with the same posting index. LEDGER_PROPERTY_SEED replays another seed.
func TestPropertyPipelinedHotAccounts(t *testing.T) {
	seed := propertySeed(t, 20261124)
	// Pipelining rides on group commit, which needs multi-stream appends.
	devtest.Stores(t, devtest.MultiAppend, func(t *testing.T, st eventstore.Store) {
		multi := st.(eventstore.MultiAppender)
		const workers = 8
		ops := 150
		if testing.Short() {
			ops = 50
		}
		t.Logf("seed %d, %d workers, %d commands each", seed, workers, ops)
		runPipelinedProperty(t, st, multi, seed, workers, ops)
	})
}

// pipeProp is the state of one run of the pipelined property test.
type pipeProp struct {
	t        *testing.T
	mu       sync.Mutex
	requests map[string]propSent // by key: what was sent under it
	definite map[string]Reply    // by key: its first definite reply
	history  []string            // keys, in the order they were first sent
	holds    [][2]string         // account, hold id of every place_hold sent
	refunded []string            // the deposits and withdrawals a refund was sent of
}

var (
	hotAccounts  = []string{"h0", "h1", "h2"}
	coldAccounts = []string{"c0", "c1", "c2", "c3", "u0"} // u0 holds USD
)

func currencyOf(acct string) string {
	if acct[0] == 'u' {
		return "USD"
	}
	return "EUR"
}

// record keeps a key's first definite reply and compares every later one with
// it. A reply is definite when it reports a decision: applied, or a refusal
// recorded (it names its events); an error, a refusal not recorded and a
// pending transfer are not: a resend decides.
func (p *pipeProp) record(key string, r Reply) {
	p.mu.Lock()
	defer p.mu.Unlock()
	typ := p.requests[key].typ
	switch {
	case r.Status == domain.StatusError:
		return
	case r.Status == domain.StatusInvalid:
		p.t.Errorf("%s %s: %+v", typ, body(p.requests[key].kv...), r)
		return
	case r.Status == domain.StatusRejected && len(r.Events) == 0:
		return
	case r.Transfer != nil && r.Transfer.Status == "pending":
		return
	}
	if first, ok := p.definite[key]; ok {
		if !sameReply(first, r) {
			p.t.Errorf("%s %s answered differently:\n got %+v %+v\nwant %+v %+v", typ, key, r, r.Account, first, first.Account)
		}
		return
	}
	p.definite[key] = r
}

// next makes up a new command under key.
func (p *pipeProp) next(rng *rand.Rand, key string) (typ string, kv []any) {
	pick := func() string {
		if rng.Intn(5) > 0 {
			return hotAccounts[rng.Intn(len(hotAccounts))]
		}
		return coldAccounts[rng.Intn(len(coldAccounts))]
	}
	other := func(a string) string {
		for {
			if b := pick(); b != a {
				return b
			}
		}
	}
	amount := func(n int) int { return rng.Intn(n) + 1 }
	acct := pick()
	switch x := rng.Intn(100); {
	case x < 30:
		return "deposit", []any{"idempotency_key", key, "account_id", acct, "amount", amount(100), "currency", currencyOf(acct)}
	case x < 42:
		return "withdraw", []any{"idempotency_key", key, "account_id", acct, "amount", amount(100), "currency", currencyOf(acct)}
	case x < 56:
		return "transfer", []any{"idempotency_key", key, "transfer_id", "t-" + key, "from", acct, "to", other(acct), "amount", amount(100), "currency", currencyOf(acct)}
	case x < 70:
		n := 1 + rng.Intn(3)
		var ps []map[string]any
		for i := range n {
			from := pick()
			if i == 0 {
				from = acct
			}
			a := amount(60)
			if i == n-1 && rng.Intn(4) == 0 {
				a = 1_000_000 // overdraws: the whole transaction is refused
			}
			ps = append(ps, map[string]any{"from": from, "to": other(from), "amount": a, "currency": currencyOf(from)})
		}
		return "post_transaction", []any{"idempotency_key", key, "transaction_id", "x-" + key, "postings", ps}
	case x < 80:
		hold := "hd-" + key
		p.mu.Lock()
		p.holds = append(p.holds, [2]string{acct, hold})
		p.mu.Unlock()
		return "place_hold", []any{"idempotency_key", key, "account_id", acct, "hold_id", hold, "amount", amount(80), "currency", currencyOf(acct)}
	case x < 88:
		p.mu.Lock()
		defer p.mu.Unlock()
		if len(p.holds) == 0 {
			return "", nil
		}
		h := p.holds[rng.Intn(len(p.holds))]
		kv = []any{"idempotency_key", key, "account_id", h[0], "hold_id", h[1], "to", other(h[0])}
		if rng.Intn(2) == 0 {
			kv = append(kv, "amount", amount(80))
		}
		return "capture_hold", kv
	default:
		p.mu.Lock()
		defer p.mu.Unlock()
		moving := rng.Intn(2) == 0 // half of the refunds are of transfers and transactions
		for range 10 {
			if len(p.history) == 0 {
				break
			}
			orig := p.history[rng.Intn(len(p.history))]
			if !moving && len(p.refunded) > 0 && rng.Intn(2) == 0 {
				// Again: an original whose refunded sum the second
				// instance may have forgotten (it keeps one).
				orig = p.refunded[rng.Intn(len(p.refunded))]
			}
			o := p.requests[orig]
			switch o.typ {
			case "transfer", "post_transaction":
			case "deposit", "withdraw":
				if moving {
					continue
				}
				p.refunded = append(p.refunded, orig)
			default:
				continue
			}
			kv = []any{"idempotency_key", key, "original_key", orig}
			single := o.typ != "post_transaction" || len(o.kv[5].([]map[string]any)) == 1
			if (single && rng.Intn(2) == 0) || rng.Intn(10) == 0 {
				kv = append(kv, "amount", amount(60))
			}
			return "refund", kv
		}
		return "", nil
	}
}

func runPipelinedProperty(t *testing.T, st ProcessStore, multi eventstore.MultiAppender, seed int64, workers, ops int) {
	fs := &faultyStore{ProcessStore: st, multi: multi, rng: rand.New(rand.NewSource(seed))}
	clk := devtest.NewClock()
	// The second instance keeps one closed hold and one refunded original per
	// account: those it forgot are found by their subject, some while appends
	// are in flight.
	svcs := []*Service{newSagaService(fs, clk), New(fs, Options{Clock: clk.Now, Logger: quietLog, RecentHolds: 1, RecentRefunds: 1})}
	defer func() {
		for _, s := range svcs {
			s.Close()
		}
	}()
	p := &pipeProp{t: t, requests: map[string]propSent{}, definite: map[string]Reply{}}
	for i, a := range append(append([]string{}, hotAccounts...), coldAccounts...) {
		for _, c := range []propSent{
			{"open_account", []any{"idempotency_key", "open-" + a, "account_id", a, "currency", currencyOf(a)}},
			{"deposit", []any{"idempotency_key", "fund-" + a, "account_id", a, "amount", 200, "currency", currencyOf(a)}},
		} {
			key := c.kv[1].(string)
			p.requests[key] = c
			r := send(svcs[i%2], c.typ, c.kv...)
			for try := 0; r.Status == domain.StatusError && try < 10; try++ { // the store fails some appends
				r = send(svcs[i%2], c.typ, c.kv...)
			}
			if r.Status != domain.StatusApplied {
				t.Fatalf("%s %s: %+v", c.typ, key, r)
			}
			p.record(key, r)
		}
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewSource(seed + int64(w)))
			for i := 0; i < ops && !t.Failed(); i++ {
				s := svcs[rng.Intn(2)]
				p.mu.Lock()
				if len(p.history) > 0 && rng.Intn(5) == 0 {
					key := p.history[rng.Intn(len(p.history))]
					c := p.requests[key]
					p.mu.Unlock()
					p.record(key, send(s, c.typ, c.kv...))
					continue
				}
				p.mu.Unlock()
				key := fmt.Sprintf("w%d-%d", w, i)
				typ, kv := p.next(rng, key)
				if typ == "" {
					continue
				}
				p.mu.Lock()
				p.requests[key] = propSent{typ, kv}
				p.history = append(p.history, key)
				p.mu.Unlock()
				p.record(key, send(s, typ, kv...))
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	// Every key that got no definite reply is decided by a resend now (or is
	// refused without a record for good: a refund beyond its original, a
	// capture of a hold never placed). The store fails some appends: up to 10
	// tries.
	for _, key := range p.history {
		if _, ok := p.definite[key]; !ok {
			c := p.requests[key]
			for range 10 {
				r := send(svcs[0], c.typ, c.kv...)
				if r.Status != domain.StatusError {
					p.record(key, r)
					break
				}
			}
		}
	}
	if t.Failed() {
		return
	}
	p.logOutcomes(fs)

	audit(t, st, true)

	// Forever: every decided key resent to a fresh instance (its caches cold)
	// answers its first reply, and writes nothing.
	before := len(devtest.SettledAll(t, st))
	fresh := newSagaService(st, clk)
	defer fresh.Close()
	for _, key := range slices.Sorted(maps.Keys(p.definite)) {
		c := p.requests[key]
		if r := send(fresh, c.typ, c.kv...); !r.Duplicate || !sameReply(r, p.definite[key]) {
			t.Fatalf("%s %s resent after the run:\n got %+v\nwant %+v", c.typ, key, r, p.definite[key])
		}
	}
	if after := len(devtest.SettledAll(t, st)); after != before {
		t.Fatalf("resends after the run wrote %d events", after-before)
	}

	// The same keys one at a time, in the store's order of the decisions,
	// through a fresh ledger.
	order := decisionOrder(t, st, p.requests)
	one := New(memory.New(), Options{Clock: clk.Now, Logger: quietLog, DisableGroupCommit: true})
	defer one.Close()
	for _, key := range order {
		c := p.requests[key]
		r := send(one, c.typ, c.kv...)
		want, ok := p.definite[key]
		if !ok {
			t.Fatalf("key %q is in the store but never answered definitely", key)
		}
		r.Position, want.Position = "", ""
		if !sameReply(r, want) {
			t.Fatalf("%s %s one at a time:\n got %+v %+v %+v\nwant %+v %+v %+v", c.typ, key, r, r.Account, r.Accounts, want, want.Account, want.Accounts)
		}
	}
	if len(order) != len(p.definite) {
		t.Fatalf("%d keys decided in the store, %d answered definitely", len(order), len(p.definite))
	}
	t.Logf("replayed %d keys one at a time in the store's order", len(order))
}

// logOutcomes logs what the run decided, by command and outcome, and fails a
// run that did not reach the paths it is about.
func (p *pipeProp) logOutcomes(fs *faultyStore) {
	t := p.t
	count := map[string]int{}
	for key, r := range p.definite {
		typ := p.requests[key].typ
		if typ == "refund" {
			typ += "-of-" + p.requests[p.requests[key].kv[3].(string)].typ
		}
		if typ == "capture_hold" {
			typ += "-to"
		}
		count[typ+" "+string(r.Status)]++
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(count)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, count[k]))
	}
	t.Logf("%d keys decided: %s; %d appends failed before and %d after commit", len(p.definite), strings.Join(parts, ", "), fs.before.Load(), fs.after.Load())
	for _, k := range []string{"post_transaction applied", "post_transaction rejected", "transfer applied", "capture_hold-to applied",
		"refund-of-post_transaction applied", "refund-of-transfer applied", "refund-of-deposit applied"} {
		if count[k] == 0 && !testing.Short() {
			t.Errorf("no %s: the run did not reach it", k)
		}
	}
	if fs.before.Load() == 0 || fs.after.Load() == 0 {
		t.Error("no injected failure: the run did not reach the recovery paths")
	}
}

// decisionOrder lists the decisions in the store (the client keys) in an order
// that a ledger deciding one command at a time can follow.
//
// Each client key owns the events written under it and under the keys derived
// from it (a transaction's legs, a transfer's or a refund's steps and marker, a
// capture's credit: their origin is the client key), all written by one append
// on these stores. Within one stream the decisions follow each other as the
// stream's revisions do, and the refunds of a transaction (each a transaction
// stream of its own) follow their slots. A transaction refused with a record
// writes no account: it read each account at the revision its
// TransactionRejected names, so it follows the decision of that revision and
// precedes the decision of the next. The order is these constraints, ties
// broken by the position of each decision's first event in "all".
//
// What replaying in that order proves: every decision is the one a ledger
// deciding alone, one command at a time, takes on the same history of every
// stream it reads and writes: pipelining, group commit, the drains before an
// atomic decision, the recovery from failed appends and the races of two
// instances changed no decision, no event, no revision, no balance, no
// posting index; and a recorded refusal of a transaction was taken on states
// of its accounts that existed together (one taken on a stale or torn view of
// its accounts makes a cycle, or a reply with other accounts).
//
// What it cannot prove: that the ledger is linearizable (a refusal that writes
// no account is ordered by what it read, and may come before commands that
// ended before it was sent; the replay cannot tell, nor can the store);
// anything about a read that writes nothing and is not recorded: the account
// a transfer, a refund of one or a capture credits (its currency, whether it
// is closed) is read and not written when the command is refused, and is not
// ordered against it (this test closes no account and changes no currency, so
// such a read depends on nothing that changes).
func decisionOrder(t *testing.T, st eventstore.AllReader, client map[string]propSent) []string {
	t.Helper()
	nodes := map[string]*orderNode{}
	owners := map[string][]string{} // stream -> the decision of each revision
	slots := map[string]map[int]string{}
	type refusal struct {
		key   string
		views []domain.AccountView
	}
	var refusals []refusal
	for i, e := range devtest.ReadAll(t, st) {
		if strings.HasPrefix(e.Stream, domain.KeyStreamPrefix) {
			continue
		}
		ev, err := toStored(e)
		if err != nil {
			t.Fatal(err)
		}
		owner := ev.Metadata.Key
		if _, ok := client[owner]; !ok {
			owner = ev.Metadata.Origin
		}
		if _, ok := client[owner]; !ok {
			t.Fatalf("%s@%d: key %q (origin %q) was never sent", e.Stream, e.Revision, ev.Metadata.Key, ev.Metadata.Origin)
		}
		if nodes[owner] == nil {
			nodes[owner] = &orderNode{home: i, succ: map[string]bool{}}
		}
		owners[e.Stream] = append(owners[e.Stream], owner)
		if !domain.IsTransactionStream(e.Stream) {
			continue
		}
		id, n := strings.TrimPrefix(e.Stream, domain.TransactionStreamPrefix), -1
		if j := strings.LastIndex(id, "~refund~"); j >= 0 {
			if n, err = strconv.Atoi(id[j+len("~refund~"):]); err != nil {
				t.Fatal(err)
			}
			id = id[:j]
		}
		if slots[id] == nil {
			slots[id] = map[int]string{}
		}
		slots[id][n] = owner
		if payload, err := domain.DecodeEvent(ev.Type, ev.Data); err != nil {
			t.Fatal(err)
		} else if r, ok := payload.(*domain.TransactionRejected); ok {
			refusals = append(refusals, refusal{owner, r.Accounts})
		}
	}
	why := map[[2]string]string{}
	edge := func(a, b, reason string) {
		if a != b && !nodes[a].succ[b] {
			nodes[a].succ[b] = true
			nodes[b].preds++
			why[[2]string{a, b}] = reason
		}
	}
	for stream, seq := range owners {
		for i := 1; i < len(seq); i++ {
			edge(seq[i-1], seq[i], fmt.Sprintf("%s@%d", stream, i))
		}
	}
	for id, s := range slots {
		ns := slices.Sorted(maps.Keys(s))
		for i := 1; i < len(ns); i++ {
			edge(s[ns[i-1]], s[ns[i]], "refund slots of "+id)
		}
	}
	for _, r := range refusals {
		for _, v := range r.views {
			seq := owners[domain.AccountStream(v.AccountID)]
			if v.Revision >= uint64(len(seq)) {
				t.Fatalf("%s refused on %s at revision %d, beyond its stream", r.key, v.AccountID, v.Revision)
			}
			edge(seq[v.Revision], r.key, fmt.Sprintf("refusal saw %s@%d", v.AccountID, v.Revision))
			if v.Revision+1 < uint64(len(seq)) {
				edge(r.key, seq[v.Revision+1], fmt.Sprintf("refusal before %s@%d", v.AccountID, v.Revision+1))
			}
		}
	}
	var ready, order []string
	for k, n := range nodes {
		if n.preds == 0 {
			ready = append(ready, k)
		}
	}
	for len(ready) > 0 {
		i := 0
		for j := range ready {
			if nodes[ready[j]].home < nodes[ready[i]].home {
				i = j
			}
		}
		k := ready[i]
		ready = slices.Delete(ready, i, i+1)
		order = append(order, k)
		for s := range nodes[k].succ {
			if nodes[s].preds--; nodes[s].preds == 0 {
				ready = append(ready, s)
			}
		}
	}
	if len(order) != len(nodes) {
		left := map[string]bool{}
		preds := map[string]string{}
		for a, n := range nodes {
			for b := range n.succ {
				if nodes[a].preds > 0 && nodes[b].preds > 0 {
					preds[b] = a
				}
			}
			if n.preds > 0 {
				left[a] = true
			}
		}
		// Walk back along predecessors not placed: every decision not placed has one.
		var k string
		for k = range left {
			break
		}
		seen := map[string]bool{}
		for !seen[k] {
			seen[k] = true
			k = preds[k]
		}
		var cycle []string
		for start := k; ; {
			p := preds[k]
			cycle = append(cycle, fmt.Sprintf("%s %s -[%s]->", client[p].typ, p, why[[2]string{p, k}]))
			if k = p; k == start {
				break
			}
		}
		slices.Reverse(cycle)
		t.Fatalf("the decisions have no serial order (a decision took a state that no order of whole decisions gives): %d decisions wait on a cycle: %s (back to the first)",
			len(nodes)-len(order), strings.Join(cycle, " "))
	}
	return order
}

// orderNode is a decision in decisionOrder: the position of its first event,
// the decisions that must follow it, and how many of those that must precede
// it are not placed yet.
type orderNode struct {
	home  int
	succ  map[string]bool
	preds int
}
