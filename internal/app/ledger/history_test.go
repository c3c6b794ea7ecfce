package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/eventstore/kurrentdb"
	"github.com/ledgerworks/ledger/eventstore/memory"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// TestOldKeysAnswerAsTheFirstTime: an aggregate that keeps 2 keys answers a
// resend of every key it forgot with the reply it gave the first time (applied
// or recorded refusal, with the account as the command left it), warm and cold
// (a new instance loading from a snapshot), refunds an original it forgot no
// further than what is left of it, names the fields of a conflict under an old
// key, and moves no money twice.
func TestOldKeysAnswerAsTheFirstTime(t *testing.T) {
	devtest.Stores(t, devtest.AnyStore, func(t *testing.T, st eventstore.Store) {
		clk := devtest.NewClock()
		opts := Options{Clock: clk.Now, RecentKeys: 2, SnapshotEvery: 4}
		s := New(st, opts)
		defer s.Close()
		acc := "old-" + strings.ReplaceAll(t.Name(), "/", "-")
		type sent struct{ typ, body string }
		var cmds []sent
		send := func(typ, body string) Reply {
			cmds = append(cmds, sent{typ, body})
			return post(t, s, typ, body)
		}
		send("open_account", fmt.Sprintf(`{"idempotency_key":"%s-open","account_id":"%s","currency":"EUR"}`, acc, acc))
		for i := range 10 {
			send("deposit", fmt.Sprintf(`{"idempotency_key":"%s-d%d","account_id":"%s","amount":%d,"currency":"EUR"}`, acc, i, acc, 100+i))
		}
		expires := clk.Now().Add(time.Hour).Format(time.RFC3339)
		send("place_hold", fmt.Sprintf(`{"idempotency_key":"%s-h","account_id":"%s","hold_id":"h1","amount":50,"currency":"EUR","expires_at":"%s"}`, acc, acc, expires))
		if r := send("withdraw", fmt.Sprintf(`{"idempotency_key":"%s-big","account_id":"%s","amount":100000,"currency":"EUR"}`, acc, acc)); r.Code != domain.CodeInsufficientFunds {
			t.Fatalf("overdraw: %+v", r)
		}
		for i := range 6 {
			send("withdraw", fmt.Sprintf(`{"idempotency_key":"%s-w%d","account_id":"%s","amount":1,"currency":"EUR"}`, acc, i, acc))
		}
		var first []Reply
		for i, c := range cmds { // the first replies, as resent right away by a client
			if i < len(cmds)-2 {
				r := post(t, s, c.typ, c.body)
				r.Duplicate = false
				first = append(first, r)
			}
		}
		clk.Advance(2 * time.Hour) // the hold's expiry has passed: deciding it again would be invalid
		for round, svc := range []*Service{s, New(st, opts)} {
			for i, c := range cmds[:len(cmds)-2] {
				r := post(t, svc, c.typ, c.body)
				if !r.Duplicate {
					t.Fatalf("round %d: resend of %s is not a duplicate: %+v", round, c.body, r)
				}
				r.Duplicate = false
				if !reflect.DeepEqual(r, first[i]) {
					t.Fatalf("round %d: resend of %s:\n got %+v\nwant %+v", round, c.body, r, first[i])
				}
			}
		}
		r := post(t, s, "deposit", fmt.Sprintf(`{"idempotency_key":"%s-d0","account_id":"%s","amount":7,"currency":"EUR"}`, acc, acc))
		if r.Code != domain.CodeIdempotencyKeyConflict || !reflect.DeepEqual(r.Fields, []string{"amount"}) {
			t.Fatalf("another request under an old key: %+v", r)
		}
		// d1 (101) is long forgotten: refund 60 of it, then 41 is too much, 40 is not.
		for _, c := range []struct {
			key    string
			amount int
			code   domain.Code
		}{{"r1", 60, domain.CodeOK}, {"r2", 42, domain.CodeRefundExceedsOriginal}, {"r3", 41, domain.CodeOK}, {"r4", 1, domain.CodeRefundExceedsOriginal}} {
			r := post(t, New(st, opts), "refund", fmt.Sprintf(`{"idempotency_key":"%s-%s","original_key":"%s-d1","amount":%d}`, acc, c.key, acc, c.amount))
			if r.Code != c.code {
				t.Fatalf("refund %s of %d: %+v", c.key, c.amount, r)
			}
		}
		// The money moved once: the stream folds to the sum of what was applied.
		want := int64(0)
		for i := range 10 {
			want += int64(100 + i)
		}
		want -= 6 + 101
		folded := devtest.Account(t, st, acc)
		if folded.Balance != want || folded.Revision != int64(len(cmds)+3) { // and 4 refunds
			t.Fatalf("folded balance %d at revision %d, want %d at %d", folded.Balance, folded.Revision, want, len(cmds)+3)
		}
	})
}

// TestSnapshotThatDoesNotMatchIsIgnored: a cold load ignores a snapshot whose
// bytes were changed (hash), that is of another version, that names a revision
// beyond the stream, or whose chain is not the stream's at its revision (a
// snapshot of another history), and decides on the fold of the stream: the
// balance a corrupt snapshot claims is never spent.
func TestSnapshotThatDoesNotMatchIsIgnored(t *testing.T) {
	st := memory.New()
	opts := Options{Clock: clock, SnapshotEvery: 3}
	s := New(st, opts)
	mustApply(t, s, "open_account", `{"idempotency_key":"o","account_id":"a","currency":"EUR"}`)
	for i := range 5 {
		mustApply(t, s, "deposit", fmt.Sprintf(`{"idempotency_key":"d%d","account_id":"a","amount":100,"currency":"EUR"}`, i))
	}
	s.Close()
	ctx := context.Background()
	good, err := st.ReadSnapshot(ctx, "account-a")
	if err != nil || good.Revision != 5 {
		t.Fatalf("snapshot: %+v, %v", good, err)
	}
	acc, err := domain.DecodeSnapshot("account-a", good.Data)
	if err != nil {
		t.Fatal(err)
	}
	rich := *acc
	rich.Balance = 1_000_000
	richBytes, err := domain.EncodeSnapshot("account-a", &rich) // a well-formed snapshot, its hash right
	if err != nil {
		t.Fatal(err)
	}
	otherChain := strings.Replace(string(richBytes), fmt.Sprintf(`"chain":"%s"`, acc.LastChain), `"chain":"0000"`, 1)
	beyond := *acc
	beyond.Revision = 9
	beyondBytes, err := domain.EncodeSnapshot("account-a", &beyond)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string]string{
		"changed bytes": strings.Replace(string(good.Data), `"balance":500`, `"balance":900000`, 1),
		"other version": strings.Replace(string(good.Data), fmt.Sprintf(`"v":%d`, domain.SnapshotVersion), `"v":99`, 1),
		"other chain":   otherChain,
		"beyond head":   string(beyondBytes),
	} {
		if data == string(good.Data) || data == string(richBytes) {
			t.Fatalf("%s: the snapshot was not changed", name)
		}
		st.CorruptSnapshot("account-a", 5, []byte(data))
		svc := New(st, opts)
		r := post(t, svc, "withdraw", fmt.Sprintf(`{"idempotency_key":"w-%s","account_id":"a","amount":501,"currency":"EUR"}`, name))
		svc.Close() // its snapshot, if it takes one, is written before the next case corrupts it
		if r.Code != domain.CodeInsufficientFunds || r.Account == nil || r.Account.Balance != 500 {
			t.Fatalf("%s: withdrawal of 501 from 500: %+v", name, r)
		}
		if counterValue(t, svc.metrics.snapshotsIgnored) != 1 {
			t.Fatalf("%s: the snapshot was not ignored", name)
		}
	}
	// A well-formed snapshot with the stream's chain at its revision but a state
	// its stream never had: the events after it state the account they leave, so
	// folding them on it fails, and the load folds the stream from its start.
	st.CorruptSnapshot("account-a", 5, richBytes)
	svc := New(st, opts)
	loaded, err := svc.loadAccount(ctx, "account-a", "a", false)
	if err != nil || loaded.Balance != 500 || counterValue(t, svc.metrics.snapshotsIgnored) != 1 {
		t.Fatalf("a well-formed snapshot of a state the stream never had: balance %d, %v", loaded.Balance, err)
	}
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// TestKeyLookupsAnswerEachCaller: concurrent lookups, asked of the store in
// shared rounds, each get their own answer; after close, none is asked.
func TestKeyLookupsAnswerEachCaller(t *testing.T) {
	st := memory.New()
	s := New(st, Options{Clock: clock})
	mustApply(t, s, "open_account", `{"idempotency_key":"o","account_id":"a","currency":"EUR"}`)
	for i := range 50 {
		mustApply(t, s, "deposit", fmt.Sprintf(`{"idempotency_key":"d%d","account_id":"a","amount":1,"currency":"EUR"}`, i))
	}
	k := newKeyLookups(st, newMetrics(nil).lookupBatch)
	var wg sync.WaitGroup
	for i := range 100 { // d0..d49 exist, d50..d99 do not
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := domain.EventID(fmt.Sprintf("d%d", i), "account-a", 0)
			e, err := k.event(context.Background(), id)
			if err != nil || (e != nil) != (i < 50) || (e != nil && e.ID != id) {
				t.Errorf("d%d: found %+v, %v", i, e, err)
			}
		}()
	}
	wg.Wait()
	k.close()
	if _, err := k.event(context.Background(), domain.EventID("d0", "account-a", 0)); !errors.Is(err, errRoundsClosed) {
		t.Fatalf("after close: %v", err)
	}
	s.Close()
}

// TestSnapshotsOnKurrentDB: on KurrentDB (the test server) the ledger keeps
// snapshots in the store's snapshot streams, out of "all"; a new instance
// loads the account from one, answers a key it forgot (through its claim) as
// the duplicate it is, and decides the next command on the right balance. A
// stream holding a saga step written without a claim gets no snapshot.
func TestSnapshotsOnKurrentDB(t *testing.T) {
	st := devtest.KurrentDB(t)
	opts := Options{Clock: clock, Logger: quietLog, RecentKeys: 2, SnapshotEvery: 3}
	s := New(st, opts)
	mustApply(t, s, "open_account", `{"idempotency_key":"o","account_id":"a","currency":"EUR"}`)
	for i := range 10 {
		mustApply(t, s, "deposit", fmt.Sprintf(`{"idempotency_key":"d%d","account_id":"a","amount":100,"currency":"EUR"}`, i))
	}
	s.Close() // waits for the snapshot writes
	ctx := context.Background()
	snap, err := st.ReadSnapshot(ctx, "account-a")
	if err != nil || snap.Revision < 6 {
		t.Fatalf("snapshot: %+v, %v", snap, err)
	}
	for _, re := range devtest.ReadAll(t, st) {
		if strings.HasPrefix(re.Stream, kurrentdb.SnapshotStreamPrefix) {
			t.Fatalf("a snapshot in all: %s", re.Stream)
		}
	}
	before := len(devtest.SettledAll(t, st))
	cold := New(st, opts)
	defer cold.Close()
	if r := post(t, cold, "deposit", `{"idempotency_key":"d1","account_id":"a","amount":100,"currency":"EUR"}`); !r.Duplicate || r.Account == nil || r.Account.Balance != 200 {
		t.Fatalf("resend of a forgotten key after a cold load from the snapshot: %+v", r)
	}
	if n := len(devtest.SettledAll(t, st)); n != before {
		t.Fatalf("the resend wrote %d events", n-before)
	}
	if r := mustApply(t, cold, "withdraw", `{"idempotency_key":"w","account_id":"a","amount":1000,"currency":"EUR"}`); r.Account.Balance != 0 {
		t.Fatalf("withdraw all: %+v", r.Account)
	}

	// A saga step written before steps claimed their keys pins its key: its
	// stream is folded from the start, never snapshotted.
	legacy := domain.Command{Type: domain.CmdTransferCredit, IdempotencyKey: "t0:credit", AccountID: "b", Amount: 5, HasAmount: true, Currency: "EUR", Origin: "t0", Reason: domain.ReasonTransferIn, At: clock()}
	mustApply(t, cold, "open_account", `{"idempotency_key":"ob","account_id":"b","currency":"EUR"}`)
	acc, err := cold.loadAccount(ctx, "account-b", "b", true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cold.appendStep(ctx, decision{cmd: legacy, req: legacy.Canonical(), events: domain.DecideAccount(acc, legacy).Events}, streamHead{stream: "account-b", last: acc.Revision, chain: acc.LastChain}); err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		mustApply(t, cold, "deposit", fmt.Sprintf(`{"idempotency_key":"b%d","account_id":"b","amount":1,"currency":"EUR"}`, i))
	}
	cold.Close()
	if _, err := st.ReadSnapshot(ctx, "account-b"); !errors.Is(err, eventstore.ErrSnapshotNotFound) {
		t.Fatalf("a stream with a pinned key was snapshotted: %v", err)
	}
}

// TestForgottenClosedHoldsAnswerAsKept: an aggregate that keeps one closed hold
// (RecentHolds 1) answers every command naming a hold it forgot as one that
// keeps them all: a new placement under a closed hold's ID is hold_exists, a
// capture or release of a closed hold hold_not_active, an unknown hold
// hold_not_found; warm, and cold from a snapshot in a new instance; a resend of an old capture is its duplicate. On a
// store that reads events by subject the holds are forgotten (and found
// again); elsewhere every hold is kept.
func TestForgottenClosedHoldsAnswerAsKept(t *testing.T) {
	devtest.Stores(t, devtest.AnyStore, func(t *testing.T, st eventstore.Store) {
		clk := devtest.NewClock() // standing: no hold expires
		opts := Options{Clock: clk.Now, RecentHolds: 1, SnapshotEvery: 3}
		bounded := New(st, opts)
		defer bounded.Close()
		opts.RecentHolds = -1
		full := New(st, opts)
		defer full.Close()
		name := strings.ReplaceAll(t.Name(), "/", "-")
		script := func(svc *Service, acc string) []Reply {
			var out []Reply
			send := func(typ, body string) { out = append(out, postAs(t, svc, acc, typ, body)) }
			expires := clk.Now().Add(time.Hour).UTC().Format(time.RFC3339)
			send("open_account", `{'idempotency_key':'ACC-o','account_id':'ACC','currency':'EUR'}`)
			send("deposit", `{'idempotency_key':'ACC-d','account_id':'ACC','amount':1000,'currency':'EUR'}`)
			for i := range 4 {
				send("place_hold", fmt.Sprintf(`{'idempotency_key':'ACC-p%d','account_id':'ACC','hold_id':'h%d','amount':%d,'currency':'EUR','expires_at':'%s'}`, i, i, 10+i, expires))
			}
			send("capture_hold", `{'idempotency_key':'ACC-c0','account_id':'ACC','hold_id':'h0','amount':5}`)
			send("release_hold", `{'idempotency_key':'ACC-r1','account_id':'ACC','hold_id':'h1'}`)
			send("capture_hold", `{'idempotency_key':'ACC-c2','account_id':'ACC','hold_id':'h2'}`)
			for i := range 3 { // closed holds named again under new keys
				send("place_hold", fmt.Sprintf(`{'idempotency_key':'ACC-again-p%d','account_id':'ACC','hold_id':'h%d','amount':1,'currency':'EUR'}`, i, i))
				send("capture_hold", fmt.Sprintf(`{'idempotency_key':'ACC-again-c%d','account_id':'ACC','hold_id':'h%d'}`, i, i))
				send("release_hold", fmt.Sprintf(`{'idempotency_key':'ACC-again-r%d','account_id':'ACC','hold_id':'h%d'}`, i, i))
			}
			send("capture_hold", `{'idempotency_key':'ACC-unknown','account_id':'ACC','hold_id':'nope'}`)
			send("capture_hold", `{'idempotency_key':'ACC-c0','account_id':'ACC','hold_id':'h0','amount':5}`) // a resend
			return out
		}
		want, got := script(full, "fh-"+name), script(bounded, "bh-"+name)
		sameReplies(t, got, want)
		codes := map[domain.Code]int{}
		for _, r := range got {
			codes[r.Code]++
		}
		if codes[domain.CodeHoldExists] != 3 || codes[domain.CodeHoldNotActive] != 6 || codes[domain.CodeHoldNotFound] != 1 || !got[len(got)-1].Duplicate {
			t.Fatalf("codes %v, last %+v", codes, got[len(got)-1])
		}
		// A new instance, cold from a snapshot, finds them too.
		acc := "bh-" + name
		mustApply(t, bounded, "release_hold", fmt.Sprintf(`{"idempotency_key":"%s-r3","account_id":"%s","hold_id":"h3"}`, acc, acc))
		cold := New(st, Options{Clock: opts.Clock, RecentHolds: 1, SnapshotEvery: 3})
		defer cold.Close()
		for i, c := range []struct {
			hold string
			code domain.Code
		}{{"h0", domain.CodeHoldNotActive}, {"h2", domain.CodeHoldNotActive}, {"h3", domain.CodeHoldNotActive}, {"nope", domain.CodeHoldNotFound}} {
			r := post(t, cold, "capture_hold", fmt.Sprintf(`{"idempotency_key":"%s-cold%d","account_id":"%s","hold_id":"%s"}`, acc, i, acc, c.hold))
			if r.Code != c.code {
				t.Fatalf("cold capture of %s: %+v", c.hold, r)
			}
		}
		_, subjects := st.(eventstore.SubjectReader)
		a, err := bounded.loadAccount(context.Background(), domain.AccountStream(acc), acc, true)
		if err != nil {
			t.Fatal(err)
		}
		if a.ForgotHolds() != subjects || (subjects && len(a.Holds) > 1) || (!subjects && len(a.Holds) != 4) {
			t.Fatalf("store reads subjects: %v; the aggregate keeps %d holds, forgot: %v", subjects, len(a.Holds), a.ForgotHolds())
		}
	})
}

// postAs posts body with ACC standing for the account acc and ' for ", and
// returns the reply with acc written ACC again, without what differs from
// account to account (event IDs, positions): replies on two accounts compare.
func postAs(t *testing.T, svc *Service, acc, typ, body string) Reply {
	t.Helper()
	r := post(t, svc, typ, strings.ReplaceAll(strings.ReplaceAll(body, "ACC", acc), "'", `"`))
	r.Position, r.Events = "", nil
	r.Message = strings.ReplaceAll(r.Message, acc, "ACC")
	r.IdempotencyKey = strings.ReplaceAll(r.IdempotencyKey, acc, "ACC")
	if r.Account != nil {
		r.Account.AccountID = strings.ReplaceAll(r.Account.AccountID, acc, "ACC")
	}
	return r
}

// sameReplies fails t at the first reply of a bounded aggregate that is not
// the one an aggregate that keeps everything gave.
func sameReplies(t *testing.T, bounded, full []Reply) {
	t.Helper()
	if len(bounded) != len(full) {
		t.Fatalf("%d replies, %d of the full aggregate", len(bounded), len(full))
	}
	for i := range full {
		if !reflect.DeepEqual(bounded[i], full[i]) {
			t.Fatalf("command %d:\n bounded %+v\n full    %+v", i, bounded[i], full[i])
		}
	}
}

// TestForgottenRefundsAnswerAsKept: an aggregate that keeps the refunded sums
// of two originals (RecentRefunds 2) answers every refund of an original it
// forgot as one that keeps them all (RecentRefunds -1): refunds in part, one
// beyond the rest (refund_exceeds_original), the exact rest, one more once
// nothing is left, resends of old refunds (duplicates), a first refund of an
// original while others are forgotten; warm, and cold from a snapshot in new
// instances. The refunds go round three originals, so that each was
// forgotten since its last. On the stores that read events by subject (the
// others keep every refunded original).
func TestForgottenRefundsAnswerAsKept(t *testing.T) {
	devtest.Stores(t, devtest.AnyStore, func(t *testing.T, st eventstore.Store) {
		if _, ok := st.(eventstore.SubjectReader); !ok {
			t.Skip("a store that reads no subjects keeps every refunded original")
		}
		clk := devtest.NewClock()
		opts := Options{Clock: clk.Now, RecentRefunds: 2, SnapshotEvery: 5}
		fullOpts := opts
		fullOpts.RecentRefunds = -1
		name := strings.ReplaceAll(t.Name(), "/", "-")
		bacc, facc := "br-"+name, "fr-"+name
		run := func(svc *Service, acc string, script func(send func(typ, body string))) []Reply {
			var out []Reply
			script(func(typ, body string) { out = append(out, postAs(t, svc, acc, typ, body)) })
			return out
		}
		refund := func(send func(typ, body string), key, orig, amount string) {
			if amount != "" {
				amount = ",'amount':" + amount
			}
			send("refund", fmt.Sprintf(`{'idempotency_key':'ACC-%s','original_key':'ACC-%s'%s}`, key, orig, amount))
		}
		warm := func(send func(typ, body string)) {
			send("open_account", `{'idempotency_key':'ACC-o','account_id':'ACC','currency':'EUR'}`)
			for i := range 7 {
				send("deposit", fmt.Sprintf(`{'idempotency_key':'ACC-d%d','account_id':'ACC','amount':100,'currency':'EUR'}`, i))
			}
			send("withdraw", `{'idempotency_key':'ACC-w','account_id':'ACC','amount':50,'currency':'EUR'}`)
			for i := range 6 {
				refund(send, fmt.Sprintf("r%d", i), fmt.Sprintf("d%d", i), "10")
			}
			refund(send, "rw", "w", "20")
			for _, round := range [][3]string{{"30", "30", "10"}, {"61", "61", "21"}, {"", "60", ""}, {"1", "", "1"}} {
				for i, orig := range []string{"d0", "d1", "w"} {
					refund(send, "a"+round[0]+orig+round[i], orig, round[i])
				}
			}
			refund(send, "r0", "d0", "10") // resends
			refund(send, "a30d030", "d0", "30")
			refund(send, "a61d161", "d1", "61") // a recorded refusal
			refund(send, "n6", "d6", "")        // a first refund, others forgotten
			refund(send, "a91d2", "d2", "91")
			refund(send, "n6again", "d6", "1")
		}
		bounded, full := New(st, opts), New(st, fullOpts)
		got := run(bounded, bacc, warm)
		recalled := counterValue(t, bounded.metrics.refundsRecalled)
		want := run(full, facc, warm)
		bounded.Close()
		full.Close()
		sameReplies(t, got, want)
		if recalled != 13 {
			t.Fatalf("%v refunded originals recalled, want 13: each of the four rounds', and d2's", recalled)
		}
		codes, dups := map[domain.Code]int{}, 0
		for _, r := range got {
			codes[r.Code]++
			if r.Duplicate {
				dups++
			}
		}
		if codes[domain.CodeRefundExceedsOriginal] != 9 || codes[domain.CodeOK] != len(got)-9 || dups != 3 {
			t.Fatalf("codes %v, %d duplicates", codes, dups)
		}

		// New instances, cold from a snapshot, answer as the warm ones.
		cold := func(send func(typ, body string)) {
			refund(send, "c1", "d3", "91")
			refund(send, "c2", "d3", "90")
			refund(send, "c3", "d4", "")
			refund(send, "c4", "d5", "1")
			refund(send, "c5", "d3", "1")
			refund(send, "ad160", "d1", "60") // a resend
		}
		bounded, full = New(st, opts), New(st, fullOpts)
		defer bounded.Close()
		defer full.Close()
		got, want = run(bounded, bacc, cold), run(full, facc, cold)
		// d3 twice, d4, d5, and d1 for the resend: a cold aggregate holds no
		// keys, so it is decided before the store refuses its events.
		if n := counterValue(t, bounded.metrics.refundsRecalled) + counterValue(t, full.metrics.refundsRecalled); n != 5 {
			t.Fatalf("cold: %v refunded originals recalled, want 5", n)
		}
		sameReplies(t, got, want)
		if got[0].Code != domain.CodeRefundExceedsOriginal || got[4].Code != domain.CodeRefundExceedsOriginal || !got[5].Duplicate || got[1].Code != domain.CodeOK {
			t.Fatalf("cold: %+v", got)
		}
		a, err := bounded.loadAccount(context.Background(), domain.AccountStream(bacc), bacc, true)
		if err != nil {
			t.Fatal(err)
		}
		if !a.ForgotRefunds() || a.Refunded.Len() > 2 || a.SnapshotRevision < 0 {
			t.Fatalf("the bounded aggregate keeps %v, forgot: %v, snapshot at %d", a.Refunded, a.ForgotRefunds(), a.SnapshotRevision)
		}
	})
}

// TestNoSnapshotOfUnconfirmedState: an aggregate holding a decision whose
// pipelined append the store failed is never snapshotted, though a snapshot
// is due on it: a snapshot, like a resident, is only of the store's state
// (domain.Account.Durable). It fails when snapshotIfDue does not check it
// (the snapshot holds the 150 the store never did).
func TestNoSnapshotOfUnconfirmedState(t *testing.T) {
	st := &refusingStore{Store: memory.New()}
	s := New(st, Options{Clock: clock, SnapshotEvery: 3})
	mustApply(t, s, "open_account", `{"idempotency_key":"o","account_id":"a","currency":"EUR"}`)
	mustApply(t, s, "deposit", `{"idempotency_key":"d","account_id":"a","amount":100,"currency":"EUR"}`)
	stream := domain.AccountStream("a")
	held, _ := s.accounts.c.Peek(stream)
	st.fail.Store(true)
	if r := post(t, s, "deposit", `{"idempotency_key":"x","account_id":"a","amount":50,"currency":"EUR"}`); r.Status == domain.StatusApplied {
		t.Fatalf("applied on a store that failed the append: %+v", r)
	}
	st.fail.Store(false)
	if held.Revision != 2 {
		t.Fatalf("the held aggregate is at %d, want the failed decision's 2 folded ahead", held.Revision)
	}
	s.snapshotIfDue(stream, held) // due: 3 events since none
	s.Close()                     // the snapshot writes done
	if snap, err := st.ReadSnapshot(context.Background(), stream); !errors.Is(err, eventstore.ErrSnapshotNotFound) {
		t.Fatalf("a snapshot of an unconfirmed aggregate: revision %d, %v", snap.Revision, err)
	}
}

// countedLocator counts the reads of one event by ID, and of many.
type countedLocator struct {
	eventstore.EventLocator
	byID, byIDs atomic.Int64
}

func (c *countedLocator) ReadEventsByID(ctx context.Context, ids []uuid.UUID) (map[uuid.UUID]eventstore.RecordedEvent, error) {
	c.byIDs.Add(1)
	return c.EventLocator.ReadEventsByID(ctx, ids)
}

func (c *countedLocator) ReadEventByID(ctx context.Context, id uuid.UUID) (eventstore.RecordedEvent, error) {
	c.byID.Add(1)
	return c.EventLocator.ReadEventByID(ctx, id)
}

// TestForgottenKeysReadInRounds: once a resend of a key its aggregate forgot
// has put an account in "old keys" mode, a batch of resends of forgotten
// keys, new deposits between them, answers each resend with the reply it
// gave the first time (duplicate) and applies each new deposit on the
// balance before it; the resends' records are rebuilt from the events the
// batch's lookup read before the account's lock, not read one by one under
// it (ReadEventByID), and the batch's keys are looked up in one request
// (lookUpBatchKeys), not one round each. Before, each resend read its first
// event by ID under the lock (19 reads here), and the batch's commands, each
// started once the one before was decided, asked a round each (22).
func TestForgottenKeysReadInRounds(t *testing.T) {
	devtest.Stores(t, devtest.MultiAppend, func(t *testing.T, st eventstore.Store) {
		loc := &countedLocator{EventLocator: st.(eventstore.EventLocator)}
		s := New(struct {
			eventstore.Store
			eventstore.MultiAppender
			eventstore.EventLocator
		}{st, st.(eventstore.MultiAppender), loc}, Options{Clock: clock, Logger: quietLog, RecentKeys: 2})
		defer s.Close()
		mustApply(t, s, "open_account", `{"idempotency_key":"o","account_id":"a","currency":"EUR"}`)
		const n = 20
		deposit := func(key string, amount int) batchCmd {
			return batchCmd{"deposit", map[string]any{"idempotency_key": key, "account_id": "a", "amount": amount, "currency": "EUR"}}
		}
		body := func(c batchCmd) string { b, _ := json.Marshal(c.body); return string(b) }
		first := make([]Reply, n)
		for i := range n {
			c := deposit(fmt.Sprintf("k%d", i), i+1)
			mustApply(t, s, c.typ, body(c))
			first[i] = post(t, s, c.typ, body(c)) // as resent right away, the aggregate holding it
			first[i].Duplicate = false
		}
		// The first resend of a forgotten key: the store refuses its events
		// (their IDs are taken) and the account goes into "old keys" mode.
		if r := post(t, s, "deposit", body(deposit("k0", 1))); !r.Duplicate {
			t.Fatalf("resend of k0: %+v", r)
		}
		before, beforeRounds := loc.byID.Load(), loc.byIDs.Load()
		var cmds []batchCmd
		balance := int64(n * (n + 1) / 2)
		var want []int64 // the balance each new deposit leaves; 0 for a resend
		for i := 1; i < n; i++ {
			cmds, want = append(cmds, deposit(fmt.Sprintf("k%d", i), i+1)), append(want, 0)
			if i%5 == 0 {
				balance += 1000
				cmds, want = append(cmds, deposit(fmt.Sprintf("new%d", i), 1000)), append(want, balance)
			}
		}
		rs := s.HandleBatch(context.Background(), batchBody(cmds), 0).Replies
		k := 1
		for i, r := range rs {
			if want[i] != 0 {
				if r.Status != domain.StatusApplied || r.Duplicate || r.Account == nil || r.Account.Balance != want[i] {
					t.Errorf("element %d, a new deposit: %+v, want applied at %d", i, r, want[i])
				}
				continue
			}
			if !r.Duplicate {
				t.Errorf("element %d, a resend of k%d: not a duplicate: %+v", i, k, r)
			}
			r.Duplicate = false
			if !reflect.DeepEqual(r, first[k]) {
				t.Errorf("element %d, a resend of k%d:\n got %+v\nwant %+v", i, k, r, first[k])
			}
			k++
		}
		if reads := loc.byID.Load() - before; reads != 0 {
			t.Fatalf("%d events read by ID for %d resends of forgotten keys, want 0 (their records from the batched lookup)", reads, n-1)
		}
		if rounds := loc.byIDs.Load() - beforeRounds; rounds != 1 {
			t.Fatalf("the batch's %d keys looked up in %d requests, want 1", len(cmds), rounds)
		}
	})
}
