package ledger

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/ledgerworks/ledger/internal/testing/devtest"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/app/reply"
)

// ---- harness shared by the saga, hold, refund and process tests ----

var quietLog = slog.New(slog.DiscardHandler)

func newSagaService(st Store, clk *devtest.Clock) *Service {
	return New(st, Options{Clock: clk.Now, Logger: quietLog})
}

// twoSagaServices is two newSagaService instances named apart (Producer), so
// that their events differ in their metadata as two instances' do: a store
// that cannot report a repeat (KurrentDB) shows the one that lost a race
// another's events when it reads them back (repeats.go).
func twoSagaServices(st Store, clk *devtest.Clock) []*Service {
	return []*Service{New(st, Options{Clock: clk.Now, Logger: quietLog, Producer: "a"}), New(st, Options{Clock: clk.Now, Logger: quietLog, Producer: "b"})}
}

// forgetfulSagaService is newSagaService where every aggregate keeps one key
// and one closed hold:
// the steps a recovery runs again were forgotten (found through their claims
// on the stores that locate no events, as KurrentDB).
func forgetfulSagaService(st Store, clk *devtest.Clock) *Service {
	return New(st, Options{Clock: clk.Now, Logger: quietLog, RecentKeys: 1, RecentHolds: 1})
}

// body builds a command body from name/value pairs.
func body(kv ...any) string {
	m := map[string]any{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func send(s *Service, typ string, kv ...any) Reply {
	return s.HandleRaw(context.Background(), typ, []byte(body(kv...)))
}

func must(t *testing.T, s *Service, typ string, kv ...any) Reply {
	t.Helper()
	r := send(s, typ, kv...)
	if r.Status != domain.StatusApplied {
		t.Fatalf("%s %s: %+v", typ, body(kv...), r)
	}
	return r
}

func openFunded(t *testing.T, s *Service, id, currency string, amount int64) {
	t.Helper()
	must(t, s, "open_account", "idempotency_key", "open-"+id, "account_id", id, "currency", currency)
	if amount > 0 {
		must(t, s, "deposit", "idempotency_key", "fund-"+id, "account_id", id, "amount", amount, "currency", currency)
	}
}

// openClosed opens an account with nothing in it and closes it.
func openClosed(t *testing.T, s *Service, id, currency string) {
	t.Helper()
	openFunded(t, s, id, currency, 0)
	must(t, s, "close_account", "idempotency_key", "close-"+id, "account_id", id)
}

func transferBody(key, id, from, to string, amount int64) []any {
	return []any{"idempotency_key", key, "transfer_id", id, "from", from, "to", to, "amount", amount, "currency", "EUR"}
}

// sameReply compares two replies but for the duplicate flag.
func sameReply(a, b Reply) bool {
	a.Duplicate, b.Duplicate = false, false
	return reflect.DeepEqual(a, b)
}

// oneOriginal checks the replies to one key sent many times at once: exactly
// one is the original (duplicate false), and every other is a duplicate equal
// to it but for that flag. It returns the original.
func oneOriginal(t *testing.T, replies []Reply) Reply {
	t.Helper()
	first := -1
	for i, r := range replies {
		if !r.Duplicate {
			if first >= 0 {
				t.Fatalf("replies %d and %d are both the original:\n%+v\n%+v", first, i, replies[first], r)
			}
			first = i
		}
	}
	if first < 0 {
		t.Fatalf("no reply is the original: %+v", replies)
	}
	for i, r := range replies {
		if !sameReply(r, replies[first]) {
			t.Fatalf("reply %d: %+v\nthe original (%d): %+v", i, r, first, replies[first])
		}
	}
	return replies[first]
}

func eventTypes(r Reply) []string {
	var out []string
	for _, e := range r.Events {
		out = append(out, strings.TrimPrefix(e.Stream, "account-")+":"+e.Type)
	}
	return out
}

// ---- transfers ----

func TestTransferCompletes(t *testing.T) {
	devtest.Stores(t, devtest.AnyStore, func(t *testing.T, st eventstore.Store) {
		clk := devtest.NewClock()
		s := newSagaService(st, clk)
		openFunded(t, s, "alice", "EUR", 100)
		openFunded(t, s, "bob", "EUR", 0)
		first := send(s, "transfer", transferBody("t-1", "t1", "alice", "bob", 30)...)
		if first.Status != domain.StatusApplied || first.Code != domain.CodeOK || first.Duplicate ||
			first.Transfer == nil || *first.Transfer != (reply.TransferView{TransferID: "t1", Status: "completed"}) {
			t.Fatalf("transfer: %+v", first)
		}
		want := []string{"transfer-t1:TransferRequested", "alice:Debited", "bob:Credited", "transfer-t1:TransferCompleted"}
		if got := eventTypes(first); !reflect.DeepEqual(got, want) {
			t.Fatalf("events %v, want %v", got, want)
		}
		if first.Account == nil || first.Account.AccountID != "alice" || first.Account.Balance != 70 || first.Position == "" {
			t.Fatalf("account %+v position %q", first.Account, first.Position)
		}
		// Duplicates, warm and cold, and the lookup: the same reply.
		for i, svc := range []*Service{s, newSagaService(st, clk)} {
			dup := send(svc, "transfer", transferBody("t-1", "t1", "alice", "bob", 30)...)
			if !dup.Duplicate || !sameReply(dup, first) {
				t.Fatalf("duplicate %d:\n got %+v\nwant %+v", i, dup, first)
			}
			got, err := svc.Lookup(context.Background(), "t-1")
			if err != nil || got == nil || !reflect.DeepEqual(*got, first) {
				t.Fatalf("lookup %d: %v %+v", i, err, got)
			}
		}
		a := audit(t, st, true)
		if a.balance("alice") != 70 || a.balance("bob") != 30 {
			t.Fatalf("balances %d %d", a.balance("alice"), a.balance("bob"))
		}
	})
}

func TestTransferRejections(t *testing.T) {
	devtest.Stores(t, devtest.AnyStore, func(t *testing.T, st eventstore.Store) {
		clk := devtest.NewClock()
		s := newSagaService(st, clk)
		openFunded(t, s, "alice", "EUR", 100)
		openFunded(t, s, "bob", "EUR", 0)
		openFunded(t, s, "usd", "USD", 100)

		// Refused by the source: recorded, the same forever.
		poor := transferBody("t-poor", "poor", "alice", "bob", 500)
		r := send(s, "transfer", poor...)
		if r.Status != domain.StatusRejected || r.Code != domain.CodeInsufficientFunds || r.Transfer.Status != "rejected" {
			t.Fatalf("insufficient: %+v", r)
		}
		if got := eventTypes(r); !reflect.DeepEqual(got, []string{"transfer-poor:TransferRequested", "alice:CommandRejected", "transfer-poor:TransferRejected"}) {
			t.Fatalf("events %v", got)
		}
		must(t, s, "deposit", "idempotency_key", "more", "account_id", "alice", "amount", 1000, "currency", "EUR")
		if again := send(newSagaService(st, clk), "transfer", poor...); !again.Duplicate || !sameReply(again, r) {
			t.Fatalf("retry after the deposit: %+v", again)
		}

		// Other currency than the source's: rejected before money moved.
		r = send(s, "transfer", "idempotency_key", "t-cur", "transfer_id", "cur", "from", "usd", "to", "bob", "amount", 5, "currency", "EUR")
		if r.Code != domain.CodeCurrencyMismatch || r.Transfer.Status != "rejected" {
			t.Fatalf("currency: %+v", r)
		}
		// To itself: recorded with the request.
		r = send(s, "transfer", transferBody("t-self", "self", "alice", "alice", 5)...)
		if r.Code != domain.CodeSameAccount || r.Transfer.Status != "rejected" || r.Account != nil ||
			!reflect.DeepEqual(eventTypes(r), []string{"transfer-self:TransferRequested", "transfer-self:TransferRejected"}) {
			t.Fatalf("same account: %+v", r)
		}
		if again := send(s, "transfer", transferBody("t-self", "self", "alice", "alice", 5)...); !again.Duplicate || !sameReply(again, r) {
			t.Fatalf("same account again: %+v", again)
		}

		// A missing account: not recorded, so the retry after it exists goes through.
		r = send(s, "transfer", transferBody("t-early", "early", "alice", "carol", 5)...)
		if r.Code != domain.CodeAccountNotFound || len(r.Events) != 0 || len(devtest.StreamEvents(t, st, "transfer-early")) != 0 {
			t.Fatalf("missing destination: %+v", r)
		}
		openFunded(t, s, "carol", "EUR", 0)
		if r = send(s, "transfer", transferBody("t-early", "early", "alice", "carol", 5)...); r.Status != domain.StatusApplied || r.Duplicate {
			t.Fatalf("after open: %+v", r)
		}
		if r = send(s, "transfer", transferBody("t-nosrc", "nosrc", "dave", "carol", 5)...); r.Code != domain.CodeAccountNotFound {
			t.Fatalf("missing source: %+v", r)
		}

		// The id of someone else's transfer, and a key bound to another request.
		before := len(devtest.SettledAll(t, st))
		r = send(s, "transfer", transferBody("t-other", "early", "alice", "carol", 5)...)
		if r.Code != domain.CodeTransferExists || r.Status != domain.StatusRejected || len(r.Events) != 0 {
			t.Fatalf("used id: %+v", r)
		}
		r = send(s, "transfer", transferBody("t-early", "early", "alice", "carol", 6)...)
		if r.Code != domain.CodeIdempotencyKeyConflict || !reflect.DeepEqual(r.Fields, []string{"amount"}) {
			t.Fatalf("same key, other amount: %+v", r)
		}
		r = send(s, "transfer", transferBody("more", "fresh", "alice", "carol", 6)...)
		if r.Code != domain.CodeIdempotencyKeyConflict {
			t.Fatalf("deposit's key as a transfer: %+v", r)
		}
		r = send(s, "transfer", transferBody("more", "early", "alice", "carol", 6)...)
		if r.Code != domain.CodeIdempotencyKeyConflict {
			t.Fatalf("deposit's key on a used transfer id: %+v", r)
		}
		if after := len(devtest.SettledAll(t, st)); after != before {
			t.Fatalf("refusals wrote %d events", after-before)
		}
		audit(t, st, true)
	})
}

// The compensation path: the destination is closed, so the source is credited
// back and the transfer ends failed, the source whole.
func TestTransferIntoClosedAccountFails(t *testing.T) {
	devtest.Stores(t, devtest.AnyStore, func(t *testing.T, st eventstore.Store) {
		clk := devtest.NewClock()
		s := newSagaService(st, clk)
		openFunded(t, s, "alice", "EUR", 100)
		openFunded(t, s, "bob", "EUR", 0)
		openFunded(t, s, "usd", "USD", 0)
		must(t, s, "close_account", "idempotency_key", "close-bob", "account_id", "bob")
		r := send(s, "transfer", transferBody("t-1", "t1", "alice", "bob", 40)...)
		status := "failed" // debited, refused by the destination, credited back
		want := []string{"transfer-t1:TransferRequested", "alice:Debited", "bob:CommandRejected", "transfer-t1:TransferCreditRefused", "alice:Credited", "transfer-t1:TransferFailed"}
		if devtest.MultiAppends(st) { // one decision over both accounts: nothing leaves the source
			status, want = "rejected", []string{"transfer-t1:TransferRequested", "alice:CommandRejected", "transfer-t1:TransferRejected"}
		}
		if r.Status != domain.StatusRejected || r.Code != domain.CodeAccountClosed || r.Transfer.Status != status {
			t.Fatalf("reply %+v", r)
		}
		if got := eventTypes(r); !reflect.DeepEqual(got, want) {
			t.Fatalf("events %v, want %v", got, want)
		}
		if r.Account.AccountID != "alice" || r.Account.Balance != 100 {
			t.Fatalf("source not whole: %+v", r.Account)
		}
		if dup := send(newSagaService(st, clk), "transfer", transferBody("t-1", "t1", "alice", "bob", 40)...); !dup.Duplicate || !sameReply(dup, r) {
			t.Fatalf("duplicate %+v", dup)
		}
		// Another currency at the destination fails the same way.
		r = send(s, "transfer", transferBody("t-2", "t2", "alice", "usd", 40)...)
		if r.Code != domain.CodeCurrencyMismatch || r.Transfer.Status != status || r.Account.Balance != 100 {
			t.Fatalf("currency at destination: %+v", r)
		}
		a := audit(t, st, true)
		if a.balance("alice") != 100 || a.balance("bob") != 0 || a.balance("usd") != 0 {
			t.Fatalf("balances alice %d bob %d usd %d", a.balance("alice"), a.balance("bob"), a.balance("usd"))
		}
	})
}

// The same transfer sent 10 times at once to two instances over one store: one
// debit, one credit, and every reply the same.
func TestSameTransferTenTimesTwoInstances(t *testing.T) {
	devtest.Stores(t, devtest.AnyStore, func(t *testing.T, st eventstore.Store) {
		clk := devtest.NewClock()
		svcs := twoSagaServices(st, clk)
		openFunded(t, svcs[0], "alice", "EUR", 100)
		openFunded(t, svcs[1], "bob", "EUR", 0)
		openFunded(t, svcs[0], "carol", "EUR", 0)
		must(t, svcs[1], "close_account", "idempotency_key", "close-carol", "account_id", "carol")
		for _, c := range []struct {
			key, id, to, status string
		}{{"t-1", "t1", "bob", "completed"}, {"t-2", "t2", "carol", map[bool]string{true: "rejected", false: "failed"}[devtest.MultiAppends(st)]}} {
			replies := make([]Reply, 10)
			var wg sync.WaitGroup
			for i := range replies {
				wg.Add(1)
				go func() {
					defer wg.Done()
					replies[i] = send(svcs[i%2], "transfer", transferBody(c.key, c.id, "alice", c.to, 30)...)
				}()
			}
			wg.Wait()
			if o := oneOriginal(t, replies); o.Transfer == nil || o.Transfer.Status != c.status {
				t.Fatalf("%s: %+v, want %s", c.key, o, c.status)
			}
			got, err := svcs[0].Lookup(context.Background(), c.key)
			if err != nil || got == nil || !sameReply(*got, replies[0]) {
				t.Fatalf("lookup %+v %v", got, err)
			}
		}
		alice := devtest.StreamEvents(t, st, "account-alice")
		debits := 2 // one per transfer (the second credited back)
		if devtest.MultiAppends(st) {
			debits = 1 // the refused one never debited
		}
		if n := countType(alice, domain.EvDebited); n != debits {
			t.Fatalf("%d debits of alice", n)
		}
		if n := countType(devtest.StreamEvents(t, st, "account-bob"), domain.EvCredited); n != 1 {
			t.Fatalf("%d credits of bob", n)
		}
		a := audit(t, st, true)
		if a.balance("alice") != 70 || a.balance("bob") != 30 {
			t.Fatalf("balances %d %d", a.balance("alice"), a.balance("bob"))
		}
	})
}

// A transfer decided at once on a cache another instance has moved past: the
// append's expected revisions send it back to the store's heads, so that what
// it records is what the store held. Instance a caches every account; b then
// empties the source, opens the destination a cached as missing, and takes
// from a destination a cached too full to be credited.
func TestTransferDecidedOnAStaleCache(t *testing.T) {
	devtest.Stores(t, devtest.MultiAppend, func(t *testing.T, st eventstore.Store) {
		clk := devtest.NewClock()
		a, b := newSagaService(st, clk), newSagaService(st, clk)
		openFunded(t, a, "src", "EUR", 100)
		openFunded(t, a, "dst", "EUR", 0)
		must(t, b, "withdraw", "idempotency_key", "w-src", "account_id", "src", "amount", 100, "currency", "EUR")
		if r := send(a, "transfer", transferBody("t-1", "t1", "src", "dst", 100)...); r.Code != domain.CodeInsufficientFunds || r.Account.Balance != 0 {
			t.Fatalf("a transfer of what b withdrew: %+v", r) // a's cache still holds 100
		}
		if r := send(a, "transfer", transferBody("t-2", "t2", "src", "late", 1)...); r.Code != domain.CodeAccountNotFound {
			t.Fatalf("a transfer to a missing account: %+v", r)
		}
		openFunded(t, b, "late", "EUR", 0) // a still holds late as missing
		must(t, b, "deposit", "idempotency_key", "d-src", "account_id", "src", "amount", 10, "currency", "EUR")
		if r := send(a, "transfer", transferBody("t-3", "t3", "src", "late", 10)...); r.Status != domain.StatusApplied || r.Transfer.Status != "completed" {
			t.Fatalf("a transfer to an account b opened: %+v", r)
		}
		// full holds 2^63 - 1,024 (fillNearTheTop); b takes 1,000 out; a, on
		// its cache, would refuse a credit of 2,000 as an overflow, and record
		// the refusal forever.
		fillNearTheTop(t, a, "full")
		must(t, b, "withdraw", "idempotency_key", "w-full", "account_id", "full", "amount", 1000, "currency", "EUR")
		must(t, a, "deposit", "idempotency_key", "d-src2", "account_id", "src", "amount", 2000, "currency", "EUR")
		if r := send(a, "transfer", transferBody("t-4", "t4", "src", "full", 2000)...); r.Status != domain.StatusApplied || r.Transfer.Status != "completed" {
			t.Fatalf("a transfer to an account b took from: %+v", r)
		}
		audit(t, st, true)
	})
}

// fillNearTheTop opens id and deposits MaxAmount into it 1,024 times, in two
// batches: its balance is then 2^63 - 1,024.
func fillNearTheTop(t *testing.T, s *Service, id string) {
	t.Helper()
	openFunded(t, s, id, "EUR", 0)
	for half := range 2 {
		cmds := make([]batchCmd, 512)
		for i := range cmds {
			cmds[i] = batchCmd{"deposit", map[string]any{"idempotency_key": fmt.Sprintf("fill-%s-%d-%d", id, half, i), "account_id": id, "amount": domain.MaxAmount, "currency": "EUR"}}
		}
		if r := s.HandleBatch(context.Background(), batchBody(cmds), 0); r.Status != domain.StatusApplied {
			t.Fatalf("fill %s: %+v", id, r)
		}
	}
}

// sagaSteps are the failpoints of a transfer, by the path it takes.
var (
	completedSteps = []string{"transfer/requested", "transfer/debit", "transfer/credit", "transfer/complete"}
	failedSteps    = []string{"transfer/requested", "transfer/debit", "transfer/credit", "transfer/refuse", "transfer/compensate", "transfer/fail"}
	rejectedSteps  = []string{"transfer/requested", "transfer/debit", "transfer/reject"}
)

// A crash at every step of every path, then a recovery by the transfer process
// (another instance) or by the client's retry: every transfer ends decided, no
// money created or lost. Forgetful: the same where every aggregate keeps one
// key, so that the steps a recovery runs again were forgotten (found by their
// claims on the stores that locate no events, as KurrentDB).
func TestTransferCrashAtEveryStep(t *testing.T) {
	transferCrashAtEveryStep(t, newSagaService)
}

func TestTransferCrashAtEveryStepForgetful(t *testing.T) {
	transferCrashAtEveryStep(t, forgetfulSagaService)
}

func transferCrashAtEveryStep(t *testing.T, newSagaService func(Store, *devtest.Clock) *Service) {
	devtest.Stores(t, devtest.SingleAppend, func(t *testing.T, st eventstore.Store) {
		clk := devtest.NewClock()
		setup := newSagaService(st, clk)
		openFunded(t, setup, "alice", "EUR", 1000)
		openFunded(t, setup, "bob", "EUR", 0)
		openClosed(t, setup, "closed", "EUR")
		rig := &crashRig{t: t, st: st, clk: clk, newService: newSagaService}
		type path struct {
			crashPath
			to     string
			amount int64
			status string
		}
		paths := []path{
			{crashPath{"completed", completedSteps}, "bob", 10, "completed"},
			{crashPath{"failed", failedSteps}, "closed", 10, "failed"},
			{crashPath{"rejected", rejectedSteps}, "bob", 1_000_000, "rejected"},
		}
		everyStep(rig, paths, byEither, func(p path, step, by, id string) {
			tb := transferBody("k-"+id, id, "alice", p.to, p.amount)
			r := rig.crashThenRecover("transfer", tb, step, by, func() {
				audit(t, st, false) // half-way, money is in flight, never lost
			})
			if r.Transfer == nil || r.Transfer.Status != p.status {
				t.Fatalf("%s crashed at %s, recovered by %s: %+v", id, step, by, r)
			}
			audit(t, st, true)
		})
		a := audit(t, st, true)
		completed := int64(2 * len(completedSteps) * 10)
		if a.balance("alice") != 1000-completed || a.balance("bob") != completed {
			t.Fatalf("balances alice %d bob %d", a.balance("alice"), a.balance("bob"))
		}
	})
}
