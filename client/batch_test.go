package client_test

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ledgerworks/ledger/client"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// An explicit batch that is not atomic: one reply per command, in order, each
// as if sent alone (applied, rejected, invalid, a duplicate of an earlier
// element), the batch itself applied.
func TestBatchNotAtomic(t *testing.T) {
	ns, st := devtest.NATS(t), devtest.Memory(t)
	ledgerOn(t, ns, st, "")
	c := client.New(devtest.Connect(t, ns))
	open(t, c, "alice", 1_000)
	open(t, c, "bob", 0)
	br, err := c.Batch(ctxFor(t, time.Minute), []client.Command{
		client.Deposit{Key: "b-d1", AccountID: "alice", Amount: 100, Currency: "EUR"},
		client.Withdraw{Key: "b-w1", AccountID: "bob", Amount: 50, Currency: "EUR"},
		client.Deposit{Key: "b-bad", AccountID: "alice", Amount: 1, Currency: "euro"},
		client.Deposit{Key: "b-d1", AccountID: "alice", Amount: 100, Currency: "EUR"},
		client.Transfer{Key: "b-t1", TransferID: "b-t1", From: "alice", To: "bob", Amount: 300, Currency: "EUR"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if br.Status != client.StatusApplied || len(br.Replies) != 5 {
		t.Fatalf("batch: %s %s with %d replies", br.Status, br.Code, len(br.Replies))
	}
	want := []struct {
		status client.Status
		code   client.Code
		dup    bool
	}{
		{client.StatusApplied, client.CodeOK, false},
		{client.StatusRejected, client.CodeInsufficientFunds, false},
		{client.StatusInvalid, client.CodeInvalidRequest, false},
		{client.StatusApplied, client.CodeOK, true},
		{client.StatusApplied, client.CodeOK, false},
	}
	for i, w := range want {
		r := br.Replies[i]
		if r.Status != w.status || r.Code != w.code || r.Duplicate != w.dup {
			t.Errorf("element %d: %s %s duplicate %v, want %s %s %v", i, r.Status, r.Code, r.Duplicate, w.status, w.code, w.dup)
		}
	}
	if r := br.Replies[4]; r.Transfer == nil || r.Transfer.Status != "completed" || r.Account.Balance != 800 {
		t.Errorf("the transfer's reply: %+v", r)
	}
	if acc := devtest.Account(t, st, "alice"); acc.Balance != 800 {
		t.Fatalf("alice folds to %d, want 800", acc.Balance)
	}
	// An element the client cannot put in a batch: an error, nothing sent.
	if _, err := c.Batch(ctxFor(t, time.Minute), []client.Command{client.Raw{Type: "deposit", Body: []byte("not json")}}); err == nil {
		t.Fatal("a batch with a body that is not a JSON object was sent")
	}
}

// A batch whose reply is lost is resent: the replies are the original
// outcomes, flagged duplicate, and the money moved once.
func TestBatchLostReplyResent(t *testing.T) {
	st, rl, nc := lostBatchReply(t)
	c := client.New(nc, client.WithAttemptTimeout(200*time.Millisecond))
	br, err := c.Batch(ctxFor(t, time.Minute), []client.Command{
		client.Deposit{Key: "l-1", AccountID: "alice", Amount: 10, Currency: "EUR"},
		client.Deposit{Key: "l-2", AccountID: "alice", Amount: 20, Currency: "EUR"},
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range br.Replies {
		if r.Status != client.StatusApplied || !r.Duplicate {
			t.Errorf("element %d after the lost reply: %s duplicate %v, want applied, duplicate", i, r.Status, r.Duplicate)
		}
	}
	// At least one resend: more when a resend's reply, too, took longer than
	// the attempt timeout (each answered the same, duplicate).
	if rl.dropped.Load() != 1 || rl.count(client.BatchSubject) < 2 {
		t.Fatalf("%d replies lost of %d batch requests, want 1 of 2 or more", rl.dropped.Load(), rl.count(client.BatchSubject))
	}
	if acc := devtest.Account(t, st, "alice"); acc.Balance != 30 {
		t.Fatalf("alice folds to %d, want 30", acc.Balance)
	}
}

// An atomic batch goes with atomic and its own key, and is resent whole, the
// same body, until its answer is definite.
func TestAtomicBatchResentWithItsKey(t *testing.T) {
	ns := devtest.NATS(t)
	ledgerOn(t, ns, devtest.Memory(t), "")
	open(t, client.New(devtest.Connect(t, ns)), "alice", 0)
	rl, nc := relayTo(t, ns)
	var mu sync.Mutex
	var bodies [][]byte
	rl.set(func(subject string, req, _ []byte) bool {
		mu.Lock()
		defer mu.Unlock()
		bodies = append(bodies, req)
		return len(bodies) == 1
	}, nil)
	c := client.New(nc, client.WithAttemptTimeout(200*time.Millisecond))
	br, err := c.Batch(ctxFor(t, time.Minute), []client.Command{
		client.Deposit{Key: "a-1", AccountID: "alice", Amount: 10, Currency: "EUR"},
		client.Deposit{Key: "a-2", AccountID: "alice", Amount: 20, Currency: "EUR"},
	}, client.Atomic("atomic-1"))
	if err != nil {
		t.Fatal(err)
	}
	if !br.Status.Definite() {
		t.Fatalf("atomic batch: %s %s, not definite", br.Status, br.Code)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(bodies) != 2 || !bytes.Equal(bodies[0], bodies[1]) || !strings.Contains(string(bodies[0]), `"atomic":true`) || !strings.Contains(string(bodies[0]), `"idempotency_key":"atomic-1"`) {
		t.Fatalf("atomic batch requests: %q", bodies)
	}
}

// Calls coalesced into a batch whose reply is lost are resent, each with its
// key: every call gets its original outcome, and the money moved once.
func TestBatchedCallsResentAfterLostReply(t *testing.T) {
	st, rl, nc := lostBatchReply(t)
	c := client.New(nc, client.WithAttemptTimeout(300*time.Millisecond))
	const callers = 16
	var wg sync.WaitGroup
	dups := make(chan bool, callers)
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := c.Deposit(ctxFor(t, time.Minute), client.Deposit{Key: "lb-" + string(rune('a'+i)), AccountID: "alice", Amount: 1, Currency: "EUR"})
			if err != nil || r.Status != client.StatusApplied {
				t.Errorf("call %d: %+v %v", i, r, err)
			}
			dups <- r.Duplicate
		}()
	}
	wg.Wait()
	close(dups)
	resent := 0
	for d := range dups {
		if d {
			resent++
		}
	}
	if rl.dropped.Load() != 1 || resent == 0 {
		t.Fatalf("%d batch replies lost, %d calls answered as resent duplicates; want 1 and some", rl.dropped.Load(), resent)
	}
	if acc := devtest.Account(t, st, "alice"); acc.Balance != callers {
		t.Fatalf("alice folds to %d, want %d", acc.Balance, callers)
	}
}

// Against a ledger before v1.2, which answers ledger.v1.cmd.batch as an
// unknown command type (here the real ledger, the relay forwarding batches on
// a subject it does not know), the client sends one request per command and
// every call is answered.
func TestNoBatchesBeforeV12(t *testing.T) {
	ns, st := devtest.NATS(t), devtest.Memory(t)
	ledgerOn(t, ns, st, "")
	open(t, client.New(devtest.Connect(t, ns)), "alice", 0)
	rl, nc := relayTo(t, ns)
	rl.mu.Lock()
	rl.rename = func(s string) string {
		if s == client.BatchSubject {
			return s + "_unknown"
		}
		return s
	}
	rl.mu.Unlock()
	c := client.New(nc)
	const callers = 16
	var wg sync.WaitGroup
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 5 {
				r, err := c.Deposit(ctxFor(t, time.Minute), client.Deposit{Key: "old-" + string(rune('a'+i)) + string(rune('0'+j)), AccountID: "alice", Amount: 1, Currency: "EUR"})
				if err != nil || r.Status != client.StatusApplied || r.Duplicate {
					t.Errorf("call %d/%d: %+v %v", i, j, r, err)
				}
			}
		}()
	}
	wg.Wait()
	if acc := devtest.Account(t, st, "alice"); acc.Balance != callers*5 {
		t.Fatalf("alice folds to %d, want %d", acc.Balance, callers*5)
	}
	// The batches in flight when the first answer came (at most
	// DefaultMaxInFlight) found out too; none went after.
	if n := rl.count(client.BatchSubject); n < 1 || n > client.DefaultMaxInFlight {
		t.Fatalf("%d batches sent to a ledger without them, want 1-%d", n, client.DefaultMaxInFlight)
	}
}

// lostBatchReply starts a ledger on the memory store with alice open, and a
// relay that loses the reply to the first batch request; every later batch
// request is forwarded only once that reply is lost, so that it finds the
// first one's commands decided, however slow the machine (a resend the relay
// forwarded first would be decided first, and answered not duplicate).
func lostBatchReply(t *testing.T) (eventstore.Store, *relay, *nats.Conn) {
	t.Helper()
	ns, st := devtest.NATS(t), devtest.Memory(t)
	ledgerOn(t, ns, st, "")
	open(t, client.New(devtest.Connect(t, ns)), "alice", 0)
	rl, nc := relayTo(t, ns)
	lost := make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(lost) }) }) // before the relay's, which waits for its forwards
	rl.mu.Lock()
	rl.before = func(subject string, n int) {
		if subject == client.BatchSubject && n > 1 {
			<-lost
		}
	}
	rl.mu.Unlock()
	rl.set(func(subject string, _, _ []byte) bool {
		lose := false
		if subject == client.BatchSubject {
			once.Do(func() { lose = true; close(lost) })
		}
		return lose
	}, nil)
	return st, rl, nc
}
