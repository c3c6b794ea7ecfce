package ledger

import (
	"context"
	"fmt"
	"maps"
	"math/rand"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/internal/testing/devtest"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/testing/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// clock stands still at devtest.Epoch.
var clock = devtest.NewClock().Now

func newService(st Store) *Service { return New(st, Options{Clock: clock}) }

func post(t testing.TB, s *Service, typ, body string) Reply {
	t.Helper()
	return s.HandleRaw(context.Background(), typ, []byte(body))
}

func mustApply(t testing.TB, s *Service, typ, body string) Reply {
	t.Helper()
	r := post(t, s, typ, body)
	if r.Status != domain.StatusApplied {
		t.Fatalf("%s %s: %+v", typ, body, r)
	}
	return r
}

func countType(evs []eventstore.RecordedEvent, typ string) int {
	n := 0
	for _, e := range evs {
		if e.Type == typ {
			n++
		}
	}
	return n
}

func TestSameDepositTenTimes(t *testing.T) {
	devtest.Stores(t, devtest.AnyStore, func(t *testing.T, st eventstore.Store) {
		s := newService(st)
		mustApply(t, s, "open_account", `{"idempotency_key":"open-a","account_id":"a","currency":"EUR"}`)
		var replies []Reply
		for i := 0; i < 10; i++ {
			replies = append(replies, post(t, s, "deposit", `{"idempotency_key":"dep-1","account_id":"a","amount":500,"currency":"EUR"}`))
		}
		if n := countType(devtest.StreamEvents(t, st, "account-a"), domain.EvCredited); n != 1 {
			t.Fatalf("%d Credited events, want 1", n)
		}
		dups := 0
		for i, r := range replies {
			if r.Status != domain.StatusApplied || !reflect.DeepEqual(r.Events, replies[0].Events) || !reflect.DeepEqual(r.Account, replies[0].Account) {
				t.Fatalf("reply %d differs from the first: %+v vs %+v", i, r, replies[0])
			}
			if r.Duplicate {
				dups++
			}
		}
		if dups != 9 || replies[0].Duplicate {
			t.Fatalf("%d duplicates (first duplicate=%v), want 9 after a fresh first", dups, replies[0].Duplicate)
		}
		if replies[0].Account.Balance != 500 || len(replies[0].Events) != 1 || replies[0].Events[0].Type != domain.EvCredited {
			t.Fatalf("reply %+v", replies[0])
		}
	})
}

func TestConcurrentWithdrawal(t *testing.T) {
	devtest.Stores(t, devtest.AnyStore, func(t *testing.T, st eventstore.Store) {
		s := newService(st)
		mustApply(t, s, "open_account", `{"idempotency_key":"open-a","account_id":"a","currency":"EUR"}`)
		mustApply(t, s, "deposit", `{"idempotency_key":"dep","account_id":"a","amount":1000,"currency":"EUR"}`)
		replies := make([]Reply, 50)
		var wg sync.WaitGroup
		for i := range replies {
			wg.Add(1)
			go func() {
				defer wg.Done()
				replies[i] = post(t, s, "withdraw", `{"idempotency_key":"w-1","account_id":"a","amount":300,"currency":"EUR"}`)
			}()
		}
		wg.Wait()
		if n := countType(devtest.StreamEvents(t, st, "account-a"), domain.EvDebited); n != 1 {
			t.Fatalf("%d debits, want 1", n)
		}
		if o := oneOriginal(t, replies); o.Status != domain.StatusApplied || o.Account.Balance != 700 {
			t.Fatalf("the withdrawal: %+v, want applied, balance 700", o)
		}
	})
}

// Two service instances over one store race on the same commands: the store's
// expected revision and deterministic IDs keep each key to one set of events.
func TestTwoInstancesRace(t *testing.T) {
	devtest.Stores(t, devtest.AnyStore, func(t *testing.T, st eventstore.Store) {
		// Two producers: their events differ in their metadata, as two
		// instances' do, so a store that cannot report a repeat (KurrentDB)
		// shows the loser another's events when it reads them back.
		a, b := New(st, Options{Clock: clock, Producer: "a"}), New(st, Options{Clock: clock, Producer: "b"})
		defer a.Close()
		defer b.Close()
		mustApply(t, a, "open_account", `{"idempotency_key":"open-a","account_id":"a","currency":"EUR"}`)
		var wg sync.WaitGroup
		replies := make([][]Reply, 2)
		for i, s := range []*Service{a, b} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := 0; k < 40; k++ {
					replies[i] = append(replies[i], post(t, s, "deposit", fmt.Sprintf(`{"idempotency_key":"d-%d","account_id":"a","amount":%d,"currency":"EUR"}`, k, k+1)))
				}
			}()
		}
		wg.Wait()
		evs := devtest.StreamEvents(t, st, "account-a")
		if n := countType(evs, domain.EvCredited); n != 40 {
			t.Fatalf("%d credits, want 40", n)
		}
		// Both replies carry the same outcome, and exactly one is the original:
		// when the two appends raced at the same revision, the second is a
		// repeat (docs/design.md section 1), answered as a duplicate.
		for k := 0; k < 40; k++ {
			if o := oneOriginal(t, []Reply{replies[0][k], replies[1][k]}); o.Status != domain.StatusApplied {
				t.Fatalf("key d-%d: %+v", k, o)
			}
		}
		audit(t, st, true)
	})
}

func TestKeyReusedWithAnotherRequest(t *testing.T) {
	devtest.Stores(t, devtest.AnyStore, func(t *testing.T, st eventstore.Store) {
		s := newService(st)
		mustApply(t, s, "open_account", `{"idempotency_key":"open-a","account_id":"a","currency":"EUR"}`)
		mustApply(t, s, "open_account", `{"idempotency_key":"open-b","account_id":"b","currency":"EUR"}`)
		mustApply(t, s, "deposit", `{"idempotency_key":"k","account_id":"a","amount":100,"currency":"EUR"}`)
		before := len(devtest.SettledAll(t, st))
		r := post(t, s, "deposit", `{"idempotency_key":"k","account_id":"a","amount":200,"currency":"EUR"}`)
		if r.Code != domain.CodeIdempotencyKeyConflict || !reflect.DeepEqual(r.Fields, []string{"amount"}) || len(r.Events) != 0 {
			t.Fatalf("same account: %+v", r)
		}
		// the same key on another account, and as another command type
		r = post(t, s, "deposit", `{"idempotency_key":"k","account_id":"b","amount":100,"currency":"EUR"}`)
		if r.Code != domain.CodeIdempotencyKeyConflict || !reflect.DeepEqual(r.Fields, []string{"account_id"}) {
			t.Fatalf("other account: %+v", r)
		}
		r = post(t, s, "withdraw", `{"idempotency_key":"k","account_id":"b","amount":100,"currency":"EUR"}`)
		if r.Code != domain.CodeIdempotencyKeyConflict || !contains(r.Fields, "type") {
			t.Fatalf("other type: %+v", r)
		}
		// a fresh service (cold caches) sees the same
		r = post(t, newService(st), "deposit", `{"idempotency_key":"k","account_id":"b","amount":100,"currency":"EUR"}`)
		if r.Code != domain.CodeIdempotencyKeyConflict {
			t.Fatalf("cold cache, other account: %+v", r)
		}
		conflictsWroteNothing(t, st, before)
	})
}

// TestKeyConflictFieldsFromTheStore: records keep only the request's hash, so a
// conflict reads the original request from the key's first event; the fields it
// names are those of the recorded request, warm cache or cold, for a key in the
// middle of a stream as for its first.
func TestKeyConflictFieldsFromTheStore(t *testing.T) {
	devtest.Stores(t, devtest.AnyStore, func(t *testing.T, st eventstore.Store) {
		s := newService(st)
		mustApply(t, s, "open_account", `{"idempotency_key":"open-c","account_id":"c","currency":"EUR","metadata":{"tier":"gold"}}`)
		for i := range 5 {
			mustApply(t, s, "deposit", fmt.Sprintf(`{"idempotency_key":"dep-%d","account_id":"c","amount":%d,"currency":"EUR"}`, i, 10+i))
		}
		mustApply(t, s, "withdraw", `{"idempotency_key":"w","account_id":"c","amount":3,"currency":"EUR"}`)
		before := len(devtest.SettledAll(t, st))
		cases := []struct {
			typ, body string
			fields    []string
		}{
			{"deposit", `{"idempotency_key":"dep-2","account_id":"c","amount":99,"currency":"EUR"}`, []string{"amount"}},
			{"withdraw", `{"idempotency_key":"dep-3","account_id":"c","amount":13,"currency":"EUR"}`, []string{"type"}},
			{"withdraw", `{"idempotency_key":"w","account_id":"c","amount":4,"currency":"USD"}`, []string{"amount", "currency"}},
			{"open_account", `{"idempotency_key":"open-c","account_id":"c","currency":"EUR","metadata":{"tier":"silver"}}`, []string{"metadata"}},
		}
		for _, svc := range []*Service{s, newService(st)} {
			for _, c := range cases {
				r := post(t, svc, c.typ, c.body)
				if r.Code != domain.CodeIdempotencyKeyConflict || !reflect.DeepEqual(r.Fields, c.fields) || len(r.Events) != 0 || r.Account != nil {
					t.Fatalf("%s %s: %+v, want fields %v", c.typ, c.body, r, c.fields)
				}
			}
		}
		// the original request still answers as a duplicate
		if r := post(t, s, "deposit", `{"idempotency_key":"dep-2","account_id":"c","amount":12,"currency":"EUR"}`); !r.Duplicate {
			t.Fatalf("original request: %+v", r)
		}
		conflictsWroteNothing(t, st, before)
	})
}

func contains(xs []string, x string) bool {
	for _, s := range xs {
		if s == x {
			return true
		}
	}
	return false
}

func TestRejectionIsRecordedForever(t *testing.T) {
	devtest.Stores(t, devtest.AnyStore, func(t *testing.T, st eventstore.Store) {
		s := newService(st)
		mustApply(t, s, "open_account", `{"idempotency_key":"open-a","account_id":"a","currency":"EUR"}`)
		w := `{"idempotency_key":"w","account_id":"a","amount":50,"currency":"EUR"}`
		first := post(t, s, "withdraw", w)
		if first.Status != domain.StatusRejected || first.Code != domain.CodeInsufficientFunds || first.Duplicate || len(first.Events) != 1 {
			t.Fatalf("first: %+v", first)
		}
		mustApply(t, s, "deposit", `{"idempotency_key":"d","account_id":"a","amount":100,"currency":"EUR"}`)
		for _, svc := range []*Service{s, newService(st)} { // warm and cold
			again := post(t, svc, "withdraw", w)
			if again.Code != domain.CodeInsufficientFunds || !again.Duplicate || !reflect.DeepEqual(again.Events, first.Events) || !reflect.DeepEqual(again.Account, first.Account) {
				t.Fatalf("retry after the deposit: %+v, first %+v", again, first)
			}
		}
		// A refusal about an account that does not exist is not recorded: a retry
		// after the account exists is decided afresh.
		r := post(t, s, "deposit", `{"idempotency_key":"early","account_id":"z","amount":5,"currency":"EUR"}`)
		if r.Code != domain.CodeAccountNotFound || len(devtest.StreamEvents(t, st, "account-z")) != 0 {
			t.Fatalf("not found: %+v", r)
		}
		mustApply(t, s, "open_account", `{"idempotency_key":"open-z","account_id":"z","currency":"EUR"}`)
		mustApply(t, s, "deposit", `{"idempotency_key":"early","account_id":"z","amount":5,"currency":"EUR"}`)
	})
}

func TestLookupReturnsTheOriginalReply(t *testing.T) {
	devtest.Stores(t, devtest.AnyStore, func(t *testing.T, st eventstore.Store) {
		s := newService(st)
		mustApply(t, s, "open_account", `{"idempotency_key":"open-a","account_id":"a","currency":"EUR"}`)
		orig := mustApply(t, s, "deposit", `{"idempotency_key":"d","account_id":"a","amount":7,"currency":"EUR"}`)
		mustApply(t, s, "deposit", `{"idempotency_key":"d2","account_id":"a","amount":8,"currency":"EUR"}`)
		got, err := newService(st).Lookup(context.Background(), "d")
		if err != nil || got == nil || !reflect.DeepEqual(*got, orig) {
			t.Fatalf("lookup: %v\n got %+v\nwant %+v", err, got, orig)
		}
		if got, err := s.Lookup(context.Background(), "never"); got != nil || err != nil {
			t.Fatalf("unknown key: found %+v, err=%v", got, err)
		}
	})
}

// TestPropertyRandomCommands drives 10,000 seeded random commands, 20% of them
// resends of earlier keys (some with another request), through both backends, and
// checks PROTOCOL.md §6 invariants 1, 3 and 5 on each store and that both stores
// end with the same events in every stream.
func TestPropertyRandomCommands(t *testing.T) {
	propertyRandomCommands(t, Options{Clock: clock})
}

// TestPropertyRandomCommandsForgetful is the same with aggregates that keep 3
// keys, one closed hold and one refunded original, a cache of 2 accounts and
// a snapshot every 7 events: nearly every
// resend is of a key the aggregate forgot, and nearly every load is cold, from a
// snapshot (on the stores that locate events and keep snapshots).
func TestPropertyRandomCommandsForgetful(t *testing.T) {
	propertyRandomCommands(t, Options{Clock: clock, RecentKeys: 3, RecentHolds: 1, RecentRefunds: 1, CacheSize: 2, SnapshotEvery: 7})
}

func propertyRandomCommands(t *testing.T, opts Options) {
	const seed, n, workers = 20261122, 10_000, 4
	// The streams of every backend, by whether it appends to several streams at
	// once (a transfer or a transaction is one append there, a saga elsewhere)
	// and its subtest's name: the backends of a kind must hold the same events.
	perBackend := map[bool]map[string]map[string][]string{}
	var mu sync.Mutex
	devtest.Stores(t, devtest.AnyStore, func(t *testing.T, st eventstore.Store) {
		s := New(st, opts)
		var wg sync.WaitGroup
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				runWorker(t, s, rand.New(rand.NewSource(seed+int64(w))), w, n/workers)
			}()
		}
		wg.Wait()
		audit(t, st, true)
		mu.Lock()
		multi := devtest.MultiAppends(st)
		if perBackend[multi] == nil {
			perBackend[multi] = map[string]map[string][]string{}
		}
		perBackend[multi][t.Name()] = streamDigest(t, st)
		mu.Unlock()
	})
	for _, kind := range perBackend {
		names := slices.Sorted(maps.Keys(kind))
		for _, name := range names[1:] {
			if !reflect.DeepEqual(kind[names[0]], kind[name]) {
				t.Errorf("%s and %s hold different events", names[0], name)
			}
		}
	}
}

// runWorker owns its accounts, so each stream sees the same commands in the same
// order on every backend.
func runWorker(t *testing.T, s *Service, rng *rand.Rand, w, n int) {
	type sent struct{ typ, body string }
	var history []sent
	accounts := []string{}
	for i := 0; i < 5; i++ {
		id := fmt.Sprintf("w%d-%d", w, i)
		accounts = append(accounts, id)
		cur := "EUR"
		if i == 4 {
			cur = "USD"
		}
		body := fmt.Sprintf(`{"idempotency_key":"open-%s","account_id":"%s","currency":"%s","overdraft_limit":%d}`, id, id, cur, rng.Intn(3)*100)
		mustApply(t, s, "open_account", body)
	}
	for i := 0; i < n; i++ {
		if len(history) > 0 && rng.Intn(5) == 0 { // 20% resends
			h := history[rng.Intn(len(history))]
			body := h.body
			if rng.Intn(10) == 0 { // some with another request under the same key
				body = strings.Replace(body, `"currency":"EUR"`, `"currency":"GBP"`, 1)
			}
			r := post(t, s, h.typ, body)
			if body == h.body && !r.Duplicate && r.Code != domain.CodeAccountNotFound {
				t.Errorf("resend of %s was not a duplicate: %+v", body, r)
			}
			if body != h.body && r.Code != domain.CodeIdempotencyKeyConflict && r.Code != domain.CodeAccountNotFound {
				t.Errorf("key reuse with another request was not a conflict: %+v", r)
			}
			continue
		}
		key := fmt.Sprintf("w%d-c%d", w, i)
		acct := accounts[rng.Intn(len(accounts))]
		amt := rng.Intn(500) + 1
		var typ, body string
		x := rng.Intn(10)
		if _, multi := s.mover.(atomicMover); multi && rng.Intn(6) == 0 {
			x = 10 + rng.Intn(2) // transactions and captures into accounts, where the store can
		}
		switch {
		case x == 10:
			var ps []string
			for range 1 + rng.Intn(3) {
				from, to := accounts[rng.Intn(len(accounts))], accounts[rng.Intn(len(accounts))]
				if from != to {
					ps = append(ps, fmt.Sprintf(`{"from":"%s","to":"%s","amount":%d,"currency":"EUR"}`, from, to, rng.Intn(300)+1))
				}
			}
			if len(ps) == 0 {
				continue
			}
			typ, body = "post_transaction", fmt.Sprintf(`{"idempotency_key":"%s","transaction_id":"x-%s","postings":[%s]}`, key, key, strings.Join(ps, ","))
		case x == 11:
			to := accounts[rng.Intn(len(accounts))]
			if to == acct {
				continue
			}
			typ, body = "capture_hold", fmt.Sprintf(`{"idempotency_key":"%s","account_id":"%s","hold_id":"h%d","to":"%s"}`, key, acct, rng.Intn(20), to)
		case x < 4:
			typ, body = "deposit", fmt.Sprintf(`{"idempotency_key":"%s","account_id":"%s","amount":%d,"currency":"EUR"}`, key, acct, amt)
		case x < 7:
			typ, body = "withdraw", fmt.Sprintf(`{"idempotency_key":"%s","account_id":"%s","amount":%d,"currency":"EUR"}`, key, acct, amt)
		case x < 8:
			typ, body = "place_hold", fmt.Sprintf(`{"idempotency_key":"%s","account_id":"%s","hold_id":"h%d","amount":%d,"currency":"EUR"}`, key, acct, rng.Intn(20), amt)
		case x < 9:
			op := []string{"capture_hold", "release_hold"}[rng.Intn(2)]
			typ, body = op, fmt.Sprintf(`{"idempotency_key":"%s","account_id":"%s","hold_id":"h%d"}`, key, acct, rng.Intn(20))
		default:
			if len(history) == 0 {
				continue
			}
			orig := history[rng.Intn(len(history))]
			if orig.typ == "post_transaction" {
				continue // their refusals are not recorded (what was refunded only grows): TestRefundOfATransaction
			}
			typ, body = "refund", fmt.Sprintf(`{"idempotency_key":"%s","original_key":"%s","amount":%d}`, key, keyOf([]byte(orig.body)), rng.Intn(100)+1)
		}
		r := post(t, s, typ, body)
		if r.Status == domain.StatusError {
			t.Errorf("%s %s: %+v", typ, body, r)
		}
		history = append(history, sent{typ, body})
	}
}

// streamDigest maps each stream to its events' IDs, types and data, in order.
func streamDigest(t *testing.T, st eventstore.AllReader) map[string][]string {
	out := map[string][]string{}
	for _, e := range devtest.ReadAll(t, st) {
		out[e.Stream] = append(out[e.Stream], fmt.Sprintf("%d %s %s %s", e.Revision, e.ID, e.Type, e.Data))
	}
	return out
}

// TestStaleCacheKnowsTheKeyBeforeInvalid: instance a cached an account, instance
// b then placed a hold on it under key h, and the clock passed the hold's expiry.
// The same request, and another request under h, sent to a must be answered from
// h's record (the original reply, and a key conflict), not refused as invalid by
// a decision taken on a's stale cache: the ledger decides again on the store's
// head before it answers invalid.
func TestStaleCacheKnowsTheKeyBeforeInvalid(t *testing.T) {
	devtest.Stores(t, devtest.AnyStore, func(t *testing.T, st eventstore.Store) {
		clk := devtest.NewClock()
		a, b := newSagaService(st, clk), newSagaService(st, clk)
		must(t, a, "open_account", "idempotency_key", "open", "account_id", "a", "currency", "EUR")
		must(t, a, "deposit", "idempotency_key", "dep", "account_id", "a", "amount", 500, "currency", "EUR")
		hold := []any{"idempotency_key", "h", "account_id", "a", "hold_id", "h1", "amount", 100, "currency", "EUR",
			"expires_at", clk.Now().Add(10 * time.Minute).Format(time.RFC3339)}
		orig := must(t, b, "place_hold", hold...)
		clk.Advance(time.Hour)
		before := len(devtest.SettledAll(t, st))
		r := send(a, "place_hold", hold...)
		if r.Status != domain.StatusApplied || !r.Duplicate || !reflect.DeepEqual(r.Events, orig.Events) {
			t.Fatalf("resend on the stale instance: %+v, want the original %+v", r, orig)
		}
		other := append(append([]any{}, hold...), "amount", 200)
		if r := send(a, "place_hold", other...); r.Code != domain.CodeIdempotencyKeyConflict {
			t.Fatalf("another request under the key on the stale instance: %+v", r)
		}
		if after := len(devtest.SettledAll(t, st)); after != before {
			t.Fatalf("answers wrote %d events", after-before)
		}
	})
}

// conflictsWroteNothing fails the test when the store holds other than before
// events (counted by devtest.SettledAll), naming the events past the last two
// it held.
func conflictsWroteNothing(t *testing.T, st eventstore.Store, before int) {
	t.Helper()
	all := devtest.SettledAll(t, st)
	if len(all) == before {
		return
	}
	for _, e := range all[max(0, min(before, len(all))-2):] {
		t.Logf("event %s %s revision %d: %s", e.Stream, e.Type, e.Revision, e.Data)
	}
	t.Fatalf("conflicts wrote %d events", len(all)-before)
}
