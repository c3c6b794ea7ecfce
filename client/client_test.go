package client_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ledgerworks/ledger/client"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// Every command type through its typed method against a real ledger: the
// replies carry what PROTOCOL.md §3 says; rejected and invalid are replies,
// not errors.
func TestCommandsAndReplies(t *testing.T) {
	_, nc := memoryLedger(t)
	c := client.New(nc)
	ctx := ctxFor(t, time.Minute)
	open(t, c, "alice", 10_000)
	open(t, c, "bob", 0)

	check := func(what string, r client.Reply, err error, status client.Status, code client.Code) client.Reply {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if r.Status != status || r.Code != code {
			t.Fatalf("%s: %s %s (%s), want %s %s", what, r.Status, r.Code, r.Message, status, code)
		}
		return r
	}
	r, err := c.Withdraw(ctx, client.Withdraw{Key: "w-1", AccountID: "alice", Amount: 1_000, Currency: "EUR", Metadata: map[string]string{"ref": "atm"}})
	r = check("withdraw", r, err, client.StatusApplied, client.CodeOK)
	if r.Account == nil || r.Account.Balance != 9_000 || r.Account.Available != 9_000 || r.Key != "w-1" || len(r.Events) == 0 || r.Position == "" {
		t.Fatalf("withdraw reply: %+v", r)
	}
	r, err = c.Transfer(ctx, client.Transfer{Key: "t-1", TransferID: "tr-1", From: "alice", To: "bob", Amount: 2_000, Currency: "EUR"})
	r = check("transfer", r, err, client.StatusApplied, client.CodeOK)
	if r.Transfer == nil || r.Transfer.TransferID != "tr-1" || r.Transfer.Status != "completed" || r.Account.Balance != 7_000 {
		t.Fatalf("transfer reply: %+v %+v", r, r.Transfer)
	}
	exp := time.Now().Add(time.Hour).UTC()
	r, err = c.PlaceHold(ctx, client.PlaceHold{Key: "h-1", AccountID: "alice", HoldID: "hold-1", Amount: 500, Currency: "EUR", ExpiresAt: &exp})
	r = check("place_hold", r, err, client.StatusApplied, client.CodeOK)
	if r.Account.Held != 500 || r.Account.Available != 6_500 {
		t.Fatalf("place_hold account: %+v", r.Account)
	}
	r, err = c.CaptureHold(ctx, client.CaptureHold{Key: "c-1", AccountID: "alice", HoldID: "hold-1", Amount: 200, To: "bob"})
	r = check("capture_hold", r, err, client.StatusApplied, client.CodeOK)
	if r.Account.Balance != 6_800 || r.Account.Held != 0 {
		t.Fatalf("capture_hold account: %+v", r.Account)
	}
	_, err = c.PlaceHold(ctx, client.PlaceHold{Key: "h-2", AccountID: "bob", HoldID: "hold-2", Amount: 100, Currency: "EUR"})
	check("place_hold bob", r, err, client.StatusApplied, client.CodeOK)
	r, err = c.ReleaseHold(ctx, client.ReleaseHold{Key: "rl-2", AccountID: "bob", HoldID: "hold-2"})
	r = check("release_hold", r, err, client.StatusApplied, client.CodeOK)
	if r.Account.Held != 0 || r.Account.Balance != 2_200 {
		t.Fatalf("release_hold account: %+v", r.Account)
	}
	r, err = c.Refund(ctx, client.Refund{Key: "rf-1", OriginalKey: "w-1", Amount: 300})
	check("refund", r, err, client.StatusApplied, client.CodeOK)
	r, err = c.PostTransaction(ctx, client.PostTransaction{Key: "tx-1", TransactionID: "txn-1", Postings: []client.Posting{
		{From: "alice", To: "bob", Amount: 100, Currency: "EUR"}, {From: "bob", To: "alice", Amount: 10, Currency: "EUR"},
	}})
	r = check("post_transaction", r, err, client.StatusApplied, client.CodeOK)
	if r.Transaction == nil || r.Transaction.Status != "posted" || len(r.Accounts) != 2 || r.Accounts[0].AccountID != "alice" {
		t.Fatalf("post_transaction reply: %+v", r)
	}
	// A refusal is a reply: the refusing posting is named.
	r, err = c.PostTransaction(ctx, client.PostTransaction{Key: "tx-2", TransactionID: "txn-2", Postings: []client.Posting{
		{From: "bob", To: "alice", Amount: 1, Currency: "EUR"}, {From: "bob", To: "alice", Amount: 1 << 40, Currency: "EUR"},
	}})
	r = check("post_transaction refused", r, err, client.StatusRejected, client.CodeInsufficientFunds)
	if r.Posting == nil || *r.Posting != 1 {
		t.Fatalf("refused transaction names posting %v, want 1", r.Posting)
	}
	r, err = c.Withdraw(ctx, client.Withdraw{Key: "w-big", AccountID: "alice", Amount: 1 << 40, Currency: "EUR"})
	check("withdraw too much", r, err, client.StatusRejected, client.CodeInsufficientFunds)
	r, err = c.Deposit(ctx, client.Deposit{Key: "d-bad", AccountID: "alice", Amount: 5, Currency: "euro"})
	r = check("bad currency", r, err, client.StatusInvalid, client.CodeInvalidRequest)
	if len(r.Fields) != 1 || r.Fields[0] != "currency" {
		t.Fatalf("invalid reply names %v, want [currency]", r.Fields)
	}
	// The same key again: the original outcome, flagged duplicate.
	r, err = c.Withdraw(ctx, client.Withdraw{Key: "w-1", AccountID: "alice", Amount: 1_000, Currency: "EUR", Metadata: map[string]string{"ref": "atm"}})
	r = check("withdraw again", r, err, client.StatusApplied, client.CodeOK)
	if !r.Duplicate || r.Account.Balance != 9_000 {
		t.Fatalf("resent withdraw: duplicate %v, balance %d; want true, 9000", r.Duplicate, r.Account.Balance)
	}
	r, err = c.Withdraw(ctx, client.Withdraw{Key: "w-1", AccountID: "alice", Amount: 999, Currency: "EUR", Metadata: map[string]string{"ref": "atm"}})
	r = check("key reused", r, err, client.StatusInvalid, client.CodeIdempotencyKeyConflict)
	if len(r.Fields) != 1 || r.Fields[0] != "amount" {
		t.Fatalf("conflict names %v, want [amount]", r.Fields)
	}
	open(t, c, "carol", 0)
	r, err = c.CloseAccount(ctx, client.CloseAccount{Key: "close-carol", AccountID: "carol"})
	check("close_account", r, err, client.StatusApplied, client.CodeOK)
	// A Raw body is judged by the ledger, malformed or not.
	r, err = c.Send(ctx, client.Raw{Type: "deposit", Body: []byte(`{"idempotency_key":"raw-1","account_id":"alice","amount":5,"currency":"EUR"}`)})
	check("raw", r, err, client.StatusApplied, client.CodeOK)
	r, err = c.Send(ctx, client.Raw{Type: "deposit", Body: []byte(`not json`)})
	check("raw malformed", r, err, client.StatusInvalid, client.CodeInvalidRequest)
}

// EffectiveAt (§2.3) is sent when set: an account opened effective two hours
// ago takes a deposit effective an hour ago, once; a deposit effective before
// the opening is invalid, and answered again when resent; the same key an hour later is a
// conflict naming effective_at; a time an hour ahead of the ledger's is
// invalid, naming it, and writes nothing.
func TestEffectiveAtSent(t *testing.T) {
	_, nc := memoryLedger(t)
	c := client.New(nc)
	ctx := ctxFor(t, time.Minute)
	opened, past, ahead := time.Now().Add(-2*time.Hour), time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	if r, err := c.OpenAccount(ctx, client.OpenAccount{Key: "open-alice", AccountID: "alice", Currency: "EUR", EffectiveAt: &opened}); err != nil || r.Status != client.StatusApplied {
		t.Fatalf("open effective two hours ago: %+v %v", r, err)
	}
	early := opened.Add(-time.Second)
	if r, err := c.Deposit(ctx, client.Deposit{Key: "eff-0", AccountID: "alice", Amount: 7, Currency: "EUR", EffectiveAt: &early}); err != nil || fmt.Sprint(r.Fields) != "[effective_at]" {
		t.Fatalf("a deposit effective before the opening: %+v %v", r, err)
	}
	dep := client.Deposit{Key: "eff-1", AccountID: "alice", Amount: 7, Currency: "EUR", EffectiveAt: &past}
	for _, want := range []bool{false, true} {
		r, err := c.Deposit(ctx, dep)
		if err != nil || r.Status != client.StatusApplied || r.Duplicate != want || r.Account.Balance != 7 {
			t.Fatalf("deposit effective an hour ago (duplicate %v): %+v %v", want, r, err)
		}
	}
	dep.EffectiveAt = &ahead
	r, err := c.Deposit(ctx, dep)
	if err != nil || r.Code != client.CodeIdempotencyKeyConflict || fmt.Sprint(r.Fields) != "[effective_at]" {
		t.Fatalf("the key with another effective_at: %+v %v", r, err)
	}
	dep.Key = "eff-2"
	r, err = c.Deposit(ctx, dep)
	if err != nil || r.Status != client.StatusInvalid || fmt.Sprint(r.Fields) != "[effective_at]" {
		t.Fatalf("effective an hour ahead: %+v %v", r, err)
	}
	if b, err := c.Deposit(ctx, client.Deposit{Key: "eff-3", AccountID: "alice", Amount: 1, Currency: "EUR"}); err != nil || b.Account.Balance != 8 {
		t.Fatalf("the invalid deposit moved money: %+v %v", b, err)
	}
}

// lostKey finds TestResendAfterLostReply's keys in a reply.
var lostKey = regexp.MustCompile(`"idempotency_key":"lost-[a-z]+"`)

// A command whose reply is lost is resent with its key until the answer is
// definite, and is decided once, alone and in an automatic batch. A first
// call ("hold") is kept in flight, its reply held by the relay, so that two
// concurrent calls queue behind it: with batching (a linger of a minute and
// batches of two, so that they go together whatever the machine's load) they
// go as one ledger.v1.cmd.batch, whose reply is lost, and are resent; with
// WithoutBatching each goes alone on ledger.v1.cmd.deposit and the relay sees
// no batch. The held reply is released once the relay has seen a batch, or,
// without batching, once both calls are answered.
func TestResendAfterLostReply(t *testing.T) {
	for _, mode := range []string{"alone", "batching"} {
		t.Run(mode, func(t *testing.T) {
			ns, st := devtest.NATS(t), devtest.Memory(t)
			ledgerOn(t, ns, st, "")
			direct := client.New(devtest.Connect(t, ns))
			open(t, direct, "alice", 0)
			open(t, direct, "bob", 0)

			rl, nc := relayTo(t, ns)
			rl.before = func(subject string, _ int) {
				if subject == client.BatchSubject {
					rl.releaseAll()
				}
			}
			var mu sync.Mutex
			lost := map[string]bool{}
			rl.set(func(_ string, _, rep []byte) bool { // lose the first reply of every lost- key
				mu.Lock()
				defer mu.Unlock()
				// A batch's reply is lost for all its keys: its elements,
				// resent and batched again in any order, are not lost twice.
				keys := lostKey.FindAllString(string(rep), -1)
				for _, k := range keys {
					if lost[k] {
						return false
					}
				}
				for _, k := range keys {
					lost[k] = true
				}
				return len(keys) > 0
			}, func(_ string, req []byte) bool { return strings.Contains(string(req), `"hold"`) })
			opts := []client.Option{client.WithAttemptTimeout(5 * time.Second), client.WithLinger(time.Minute), client.WithMaxBatch(2)}
			if mode == "alone" {
				opts = append(opts, client.WithoutBatching())
			}
			c := client.New(nc, opts...)
			ctx := ctxFor(t, 2*time.Minute)
			held := make(chan error, 1)
			go func() {
				_, err := c.Deposit(ctx, client.Deposit{Key: "hold", AccountID: "alice", Amount: 1, Currency: "EUR"})
				held <- err
			}()
			devtest.Eventually(t, time.Minute, "the held call reached the relay", func() bool { return rl.count("ledger.v1.cmd.") == 1 })
			var wg sync.WaitGroup
			for _, id := range []string{"alice", "bob"} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r, err := c.Deposit(ctx, client.Deposit{Key: "lost-" + id, AccountID: id, Amount: 700, Currency: "EUR"})
					if err != nil || r.Status != client.StatusApplied || !r.Duplicate {
						t.Errorf("%s's deposit after a lost reply: %+v %v; want applied, duplicate", id, r, err)
					}
				}()
			}
			wg.Wait()
			rl.releaseAll()
			if err := <-held; err != nil {
				t.Fatalf("the held call: %v", err)
			}
			batches, singles := rl.count(client.BatchSubject), rl.count("ledger.v1.cmd.deposit")
			if mode == "batching" && (batches == 0 || rl.dropped.Load() != 1) {
				t.Fatalf("%d batches and %d single deposits, %d replies lost; want the two calls batched, one batch reply lost", batches, singles, rl.dropped.Load())
			}
			if mode == "alone" && (batches != 0 || rl.dropped.Load() != 2) {
				t.Fatalf("%d batches and %d single deposits, %d replies lost without batching; want no batch, two replies lost", batches, singles, rl.dropped.Load())
			}
			if a, b := devtest.Account(t, st, "alice"), devtest.Account(t, st, "bob"); a.Balance != 701 || b.Balance != 700 {
				t.Fatalf("alice folds to %d, bob to %d; want 701 and 700: each deposit moved money once", a.Balance, b.Balance)
			}
		})
	}
}

// A context that ends before any definite answer: the error is an
// IndefiniteError wrapping ctx's error and the last attempt's failure; sent
// again with the same key once the ledger answers, the command is decided once.
func TestContextEndsWithoutAnswer(t *testing.T) {
	ns := devtest.NATS(t)
	ledgerOn(t, ns, devtest.Memory(t), "")
	direct := client.New(devtest.Connect(t, ns))
	open(t, direct, "alice", 0)
	rl, nc := relayTo(t, ns)
	rl.set(func(string, []byte, []byte) bool { return true }, nil) // every reply lost

	c := client.New(nc, client.WithAttemptTimeout(100*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err := c.Deposit(ctx, client.Deposit{Key: "dep-ctx", AccountID: "alice", Amount: 50, Currency: "EUR"})
	var ie *client.IndefiniteError
	if !errors.As(err, &ie) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error %v (%T), want an IndefiniteError wrapping the deadline", err, err)
	}
	if ie.Key != "dep-ctx" || ie.Attempts < 2 || !errors.Is(err, client.ErrAttemptTimeout) {
		t.Fatalf("IndefiniteError %+v: want key dep-ctx, resent at least once, last failure a timeout", ie)
	}
	r, err := direct.Deposit(ctxFor(t, time.Minute), client.Deposit{Key: "dep-ctx", AccountID: "alice", Amount: 50, Currency: "EUR"})
	if err != nil || !r.Duplicate || r.Account.Balance != 50 {
		t.Fatalf("the same key sent again: %+v %v; want a duplicate at balance 50", r, err)
	}

	// No ledger at all: no responders, the client keeps trying until ctx ends.
	empty := devtest.Connect(t, devtest.NATS(t))
	ctx2, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	_, err = client.New(empty).Deposit(ctx2, client.Deposit{Key: "dep-none", AccountID: "alice", Amount: 1, Currency: "EUR"})
	if !errors.As(err, &ie) || !errors.Is(err, client.ErrNoResponders) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("without a ledger: %v, want an IndefiniteError after no responders", err)
	}
}

// A call made while another is in flight waits at most the linger for
// company, then goes alone: it is answered while the first is still held.
func TestLingerFlushesALoneCall(t *testing.T) {
	ns := devtest.NATS(t)
	ledgerOn(t, ns, devtest.Memory(t), "")
	direct := client.New(devtest.Connect(t, ns))
	open(t, direct, "alice", 0)
	rl, nc := relayTo(t, ns)
	rl.set(nil, func(_ string, req []byte) bool { return strings.Contains(string(req), `"slow"`) })
	c := client.New(nc, client.WithLinger(5*time.Millisecond))
	ctx := ctxFor(t, time.Minute)

	slow := make(chan error, 1)
	go func() {
		_, err := c.Deposit(ctx, client.Deposit{Key: "slow", AccountID: "alice", Amount: 1, Currency: "EUR"})
		slow <- err
	}()
	devtest.Eventually(t, 30*time.Second, "the first call reached the relay", func() bool { return rl.count("ledger.v1.cmd.") == 1 })
	r, err := c.Deposit(ctx, client.Deposit{Key: "lone", AccountID: "alice", Amount: 2, Currency: "EUR"})
	if err != nil || r.Status != client.StatusApplied {
		t.Fatalf("lone call: %+v %v", r, err)
	}
	select {
	case err := <-slow:
		t.Fatalf("the held call ended (%v) before it was released", err)
	default:
	}
	rl.releaseAll()
	if err := <-slow; err != nil {
		t.Fatal(err)
	}
}

// Concurrent calls are coalesced into batches; each gets its own definite
// reply, and each key moves money once.
func TestConcurrentCalls(t *testing.T) {
	ns, st := devtest.NATS(t), devtest.Memory(t)
	ledgerOn(t, ns, st, "")
	rl, nc := relayTo(t, ns)
	c := client.New(nc)
	open(t, c, "alice", 0)
	const callers, each = 32, 10
	ctx := ctxFor(t, 2*time.Minute)
	var wg sync.WaitGroup
	errs := make(chan error, callers*each)
	for g := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				key := fmt.Sprintf("c-%d-%d", g, i)
				r, err := c.Deposit(ctx, client.Deposit{Key: key, AccountID: "alice", Amount: 1, Currency: "EUR"})
				if err == nil && (r.Status != client.StatusApplied || r.Key != key || r.Duplicate) {
					err = fmt.Errorf("%s: %s %s duplicate %v key %s", key, r.Status, r.Code, r.Duplicate, r.Key)
				}
				if err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if acc := devtest.Account(t, st, "alice"); acc.Balance != callers*each {
		t.Fatalf("alice's stream folds to %d, want %d", acc.Balance, callers*each)
	}
	singles, batches := rl.count("ledger.v1.cmd.deposit"), rl.count(client.BatchSubject)
	if batches == 0 || singles+batches >= callers*each {
		t.Fatalf("%d calls went in %d single requests and %d batches: the concurrent calls were not coalesced", callers*each, singles, batches)
	}
	t.Logf("%d calls: %d single requests, %d batches", callers*each, singles, batches)
}

// A closed client answers no more: a call returns an IndefiniteError at once,
// and the hook saw nothing to resend.
func TestClosedClient(t *testing.T) {
	_, nc := memoryLedger(t)
	resends := 0
	c := client.New(nc, client.WithResendHook(func(string, int, error) { resends++ }))
	open(t, c, "alice", 0)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	_, err := c.Deposit(ctxFor(t, time.Minute), client.Deposit{Key: "after-close", AccountID: "alice", Amount: 1, Currency: "EUR"})
	if !errors.Is(err, client.ErrClosed) || resends != 0 {
		t.Fatalf("a call after Close: %v (%d resends), want ErrClosed at once", err, resends)
	}
}

// A command that can never be published (over the server's max payload) ends
// at once with an error, not in a loop of resends until ctx ends.
func TestUnpublishableCommandEndsAtOnce(t *testing.T) {
	_, nc := memoryLedger(t)
	resends := 0
	c := client.New(nc, client.WithoutBatching(), client.WithResendHook(func(string, int, error) { resends++ }))
	huge := append([]byte(`{"idempotency_key":"huge","account_id":"a","amount":1,"currency":"EUR","metadata":{"x":"`), make([]byte, nc.MaxPayload())...)
	_, err := c.Send(ctxFor(t, time.Minute), client.Raw{Type: "deposit", Body: append(huge, `"}}`...)})
	var ie *client.IndefiniteError
	if !errors.As(err, &ie) || !errors.Is(err, nats.ErrMaxPayload) || resends != 0 {
		t.Fatalf("a body over the max payload: %v (%d resends), want an error at once", err, resends)
	}
}
