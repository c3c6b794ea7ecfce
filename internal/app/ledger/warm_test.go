package ledger

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore/memory"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// warmStores are the stores warming runs on: memory, and PostgreSQL (its
// stream listing is SQL of its own).
var warmStores = map[string]func(t *testing.T) Store{
	"memory":   func(*testing.T) Store { return memory.New() },
	"postgres": func(t *testing.T) Store { return devtest.Postgres(t) },
}

// warmed waits for s's warming to end and returns what it loaded.
func warmed(t *testing.T, s *Service) int64 {
	t.Helper()
	var n int64
	devtest.Eventually(t, time.Minute, "warming ends", func() bool {
		var done bool
		n, done = s.Warming()
		return done
	})
	return n
}

// TestWarmingAfterARestart: a service started over a store of 30 accounts
// loads them in the background, into its cache up to nine tenths of it (18
// of 20, never evicting), then as residents up to ResidentAccounts, in all
// up to WarmAccounts; each cached aggregate, and each resident's, holds what
// a cold load gives. With WarmAccounts 0 it loads none.
func TestWarmingAfterARestart(t *testing.T) {
	for name, newStore := range warmStores {
		t.Run(name, func(t *testing.T) {
			st := newStore(t)
			seed := New(st, Options{Clock: clock})
			for i := range 30 {
				id := fmt.Sprintf("w%02d", i)
				mustApply(t, seed, "open_account", fmt.Sprintf(`{"idempotency_key":"o-%s","account_id":%q,"currency":"EUR"}`, id, id))
				mustApply(t, seed, "deposit", fmt.Sprintf(`{"idempotency_key":"d-%s","account_id":%q,"amount":%d,"currency":"EUR"}`, id, id, 10+i))
			}
			seed.Close()
			for _, c := range []struct{ warm, cache, residents, want, cached int }{
				{1000, 20, -1, 18, 18}, {1000, 20, 0, 30, 18}, {1000, 20, 5, 23, 18}, {5, 20, 0, 5, 5}, {0, 20, 0, 0, 0}, {1000, 100, 0, 30, 30}} {
				s := New(st, Options{Clock: clock, CacheSize: c.cache, WarmAccounts: c.warm, ResidentAccounts: c.residents})
				if n := warmed(t, s); n != int64(c.want) || s.accounts.c.Len() != c.cached || s.Residents() != c.want-c.cached {
					t.Fatalf("warm %d, cache %d, residents %d: %d warmed, %d cached, %d residents, want %d, %d", c.warm, c.cache, c.residents, n, s.accounts.c.Len(), s.Residents(), c.want, c.cached)
				}
				for _, stream := range s.accounts.c.Keys() {
					acc, _ := s.accounts.c.Peek(stream)
					if len(acc.Keys) != 2 {
						t.Fatalf("%s cached with %d keys", stream, len(acc.Keys))
					}
					checkWarmed(t, s, stream, acc)
				}
				s.residents.each(func(stream string, res resident) {
					acc := s.newAccount(strings.TrimPrefix(stream, domain.AccountStreamPrefix))
					if err := res.Into(acc, res.tail); err != nil {
						t.Fatal(err)
					}
					checkWarmed(t, s, stream, acc)
				})
				s.Close()
			}
		})
	}
}

// checkWarmed fails unless acc, warmed as stream's, is the account a cold
// load gives, with the balance its deposit left.
func checkWarmed(t *testing.T, s *Service, stream string, acc *domain.Account) {
	t.Helper()
	var i int
	if _, err := fmt.Sscanf(acc.ID, "w%02d", &i); err != nil {
		t.Fatalf("%s warmed as %q", stream, acc.ID)
	}
	if acc.Revision != 1 || acc.Balance != int64(10+i) || acc.Currency != "EUR" || domain.AccountStream(acc.ID) != stream {
		t.Fatalf("%s warmed as %+v", stream, acc)
	}
	cold, err := s.cold.load(context.Background(), stream, acc.ID)
	if err != nil {
		t.Fatal(err)
	}
	if same, diff := domain.SameState(acc, cold); !same {
		t.Fatalf("%s warmed: %s", stream, diff)
	}
}

// TestAStaleWarmedAccountNeverDecides: accounts warmed, then written by
// another instance (the rich one emptied, the poor one funded), are decided
// on what the store holds: a withdrawal from the emptied one is refused, one
// from the funded one applies, and the store's balances say so. (It fails
// when warming gives an aggregate the store's revision without its events.)
func TestAStaleWarmedAccountNeverDecides(t *testing.T) {
	for name, newStore := range warmStores {
		for into, cacheSize := range map[string]int{"cached": 0, "resident": 1} {
			t.Run(name+"/"+into, func(t *testing.T) { staleWarmedNeverDecides(t, newStore(t), cacheSize) })
		}
	}
}

// staleWarmedNeverDecides is TestAStaleWarmedAccountNeverDecides on st,
// warmed into a cache of cacheSize aggregates (0: the default; 1: none
// cached, every account made resident).
func staleWarmedNeverDecides(t *testing.T, st Store, cacheSize int) {
	other := New(st, Options{Clock: clock})
	defer other.Close()
	mustApply(t, other, "open_account", `{"idempotency_key":"o-rich","account_id":"rich","currency":"EUR"}`)
	mustApply(t, other, "deposit", `{"idempotency_key":"d-rich","account_id":"rich","amount":100,"currency":"EUR"}`)
	mustApply(t, other, "open_account", `{"idempotency_key":"o-poor","account_id":"poor","currency":"EUR"}`)
	s := New(st, Options{Clock: clock, WarmAccounts: 10, CacheSize: cacheSize})
	defer s.Close()
	if n := warmed(t, s); n != 2 || (cacheSize == 1) != (s.Residents() == 2) {
		t.Fatalf("%d accounts warmed, %d residents, want 2 (cache of %d)", n, s.Residents(), cacheSize)
	}
	mustApply(t, other, "withdraw", `{"idempotency_key":"w-rich","account_id":"rich","amount":100,"currency":"EUR"}`)
	mustApply(t, other, "deposit", `{"idempotency_key":"d-poor","account_id":"poor","amount":100,"currency":"EUR"}`)
	if r := post(t, s, "withdraw", `{"idempotency_key":"w2-rich","account_id":"rich","amount":60,"currency":"EUR"}`); r.Status != domain.StatusRejected || r.Code != domain.CodeInsufficientFunds {
		t.Fatalf("a withdrawal from the emptied account: %s %s", r.Status, r.Code)
	}
	mustApply(t, s, "withdraw", `{"idempotency_key":"w2-poor","account_id":"poor","amount":60,"currency":"EUR"}`)
	for id, want := range map[string]int64{"rich": 0, "poor": 40} {
		if acc := devtest.Account(t, st, id); acc.Balance != want {
			t.Fatalf("%s: balance %d in the store, want %d", id, acc.Balance, want)
		}
	}
}

// TestWarmAgain: accounts written into the store behind a running
// service's back (another instance here) are warmed by Warm as after a
// start, and decided on without a read of the store, counted as a load of
// a warmed resident (origin warm).
func TestWarmAgain(t *testing.T) {
	st := &readCounting{Store: memory.New()}
	s := New(st, Options{Clock: clock, CacheSize: 1, WarmAccounts: 10})
	defer s.Close()
	if n := warmed(t, s); n != 0 {
		t.Fatalf("%d accounts warmed over an empty store", n)
	}
	other := New(st, Options{Clock: clock})
	for _, id := range []string{"x", "y", "z"} {
		mustApply(t, other, "open_account", fmt.Sprintf(`{"idempotency_key":"o-%s","account_id":%q,"currency":"EUR"}`, id, id))
	}
	other.Close()
	s.Warm(10)
	if n := warmed(t, s); n != 3 || s.Residents() != 3 {
		t.Fatalf("%d accounts warmed again, %d residents, want 3", n, s.Residents())
	}
	before := st.reads.Load()
	mustApply(t, s, "deposit", `{"idempotency_key":"d-y","account_id":"y","amount":5,"currency":"EUR"}`)
	if reads := st.reads.Load() - before; reads != 0 {
		t.Fatalf("%d reads of the store for a warmed account", reads)
	}
	warm, evicted := counterValue(t, s.metrics.residentLoads.WithLabelValues("warm")), counterValue(t, s.metrics.residentLoads.WithLabelValues("eviction"))
	if warm != 1 || evicted != 0 {
		t.Fatalf("resident loads: %v warm, %v eviction, want the warmed one only", warm, evicted)
	}
}

// TestWarmingSkipsBusyAccounts: warming caches an account only when no one
// holds or waits for its lock and it is not cached already.
func TestWarmingSkipsBusyAccounts(t *testing.T) {
	s := New(memory.New(), Options{Clock: clock})
	defer s.Close()
	stream := domain.AccountStream("busy")
	unlock, err := s.locks.lock(context.Background(), stream)
	if err != nil {
		t.Fatal(err)
	}
	if s.warmOne(stream, s.newAccount("busy"), true) {
		t.Fatal("warmed an account whose lock is held")
	}
	unlock()
	if !s.warmOne(stream, s.newAccount("busy"), true) {
		t.Fatal("did not warm a free account")
	}
	if s.warmOne(stream, s.newAccount("busy"), true) {
		t.Fatal("warmed an account already cached")
	}
	if n := s.locks.waiting(stream); n != 0 {
		t.Fatalf("%d holders left on the lock after warming", n)
	}
}
