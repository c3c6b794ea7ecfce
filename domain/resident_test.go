package domain

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"reflect"
	"slices"
	"testing"
	"time"
)

func fnvPrint(key string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(key))
	return h.Sum64()
}

// chained folds cmd, decided on a, into a through stored events that carry
// the stream's chain hash, as a store's do; it returns the decision.
func chained(t *testing.T, a *Account, cmd Command) Decision {
	t.Helper()
	d := DecideAccount(a, cmd)
	for j := range d.Events {
		ev := storedOf(t, cmd, d.Events, j, uint64(a.Revision+1), "p")
		ev.Metadata.Chain = ChainHash(a.LastChain, ev)
		if err := EvolveAccount(a, ev); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

func limited(id string) *Account {
	a := NewAccount(id)
	a.KeyLimit, a.HoldLimit, a.RefundLimit = 3, 1, 1
	return a
}

// probes are commands whose decision reads nothing a Resident forgets.
func probes(at time.Time, a *Account) []Command {
	ps := []Command{
		{Type: CmdDeposit, AccountID: "a", Amount: 9, HasAmount: true, Currency: "EUR"},
		{Type: CmdDeposit, AccountID: "a", Amount: 9, HasAmount: true, Currency: "USD"},
		{Type: CmdWithdraw, AccountID: "a", Amount: 3, HasAmount: true, Currency: "EUR"},
		{Type: CmdWithdraw, AccountID: "a", Amount: 1 << 40, HasAmount: true, Currency: "EUR"},
		{Type: CmdPlaceHold, AccountID: "a", HoldID: "new", Amount: 2, HasAmount: true, Currency: "EUR"},
		{Type: CmdCloseAccount, AccountID: "a"},
		{Type: CmdOpenAccount, AccountID: "a", Currency: "EUR"},
	}
	for id, h := range a.Holds {
		if h.Status == HoldStatusActive {
			ps = append(ps, Command{Type: CmdCaptureHold, AccountID: "a", HoldID: id, Amount: 1, HasAmount: true},
				Command{Type: CmdReleaseHold, AccountID: "a", HoldID: id}, Command{Type: CmdReleaseHold, AccountID: "a", HoldID: id, At: at.Add(2 * time.Hour)})
		}
	}
	for i := range ps {
		ps[i].IdempotencyKey = fmt.Sprintf("probe-%d", i)
		if ps[i].At.IsZero() {
			ps[i].At = at
		}
	}
	return ps
}

// TestResidentDecidesAsTheAggregate: after every command of an account's
// life, the aggregate made from its Resident holds the same state and decides
// every probe as the aggregate itself. It fails when Compact or Into drops a
// field a decision reads (the overdraft, the holds, the status...).
func TestResidentDecidesAsTheAggregate(t *testing.T) {
	at := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	a := limited("a")
	cmds := append(sampleAccountCommands(at),
		Command{Type: CmdPlaceHold, AccountID: "a", HoldID: "h3", Amount: 4, HasAmount: true, Currency: "EUR", ExpiresAt: at.Add(time.Hour)},
		Command{Type: CmdPlaceHold, AccountID: "a", HoldID: "h4", Amount: 5, HasAmount: true, Currency: "EUR"})
	compacted := 0
	for i, cmd := range cmds {
		cmd.IdempotencyKey, cmd.At = fmt.Sprintf("k%d", i), at
		chained(t, a, cmd)
		r, tail, ok := Compact(a, fnvPrint)
		if !ok {
			continue
		}
		compacted++
		b := limited("a")
		if err := r.Into(b, tail); err != nil {
			t.Fatalf("after %s: %v", cmd.Type, err)
		}
		if same, diff := SameState(b, a); !same {
			t.Fatalf("after %s: %s", cmd.Type, diff)
		}
		if b.SnapshotRevision != a.SnapshotRevision || !b.EffectiveFrom.Equal(a.EffectiveFrom) || !b.Forgot() || !reflect.DeepEqual(b.Metadata, a.Metadata) {
			t.Fatalf("after %s: snapshot revision %d effective %v forgot %v, want %d %v true", cmd.Type, b.SnapshotRevision, b.EffectiveFrom, b.Forgot(), a.SnapshotRevision, a.EffectiveFrom)
		}
		for _, p := range probes(at, a) {
			want, got := decided(t, DecideAccount(a, p)), decided(t, DecideAccount(b, p))
			if want != got {
				t.Fatalf("after %s, %s %s: the resident's aggregate decided %s, the aggregate %s", cmd.Type, p.Type, p.HoldID, got, want)
			}
		}
	}
	if compacted < len(cmds)-1 {
		t.Fatalf("%d of %d states compacted", compacted, len(cmds))
	}
}

func decided(t *testing.T, d Decision) string {
	b, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestResidentRefusesWhatCannotBeForgotten: an aggregate holding a key, a
// closed hold or a refunded sum that no lookup could find again is not
// compacted.
func TestResidentRefusesWhatCannotBeForgotten(t *testing.T) {
	at := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	life := func(a *Account, cmds ...Command) *Account {
		for i, c := range cmds {
			c.IdempotencyKey, c.At, c.AccountID = fmt.Sprintf("k%d", i), at, "a"
			chained(t, a, c)
		}
		return a
	}
	opened := Command{Type: CmdOpenAccount, Currency: "EUR"}
	dep := Command{Type: CmdDeposit, Amount: 9, HasAmount: true, Currency: "EUR"}
	hold := Command{Type: CmdPlaceHold, HoldID: "h", Amount: 2, HasAmount: true, Currency: "EUR"}
	release := Command{Type: CmdReleaseHold, HoldID: "h"}
	refund := Command{Type: CmdRefund, OriginalKey: "k1", Amount: 1, HasAmount: true}
	keepsKeys := life(NewAccount("a"), opened)
	keepsHolds := life(limited("a"), opened, dep, hold, release)
	keepsHolds.HoldLimit = 0
	keepsRefunds := life(limited("a"), opened, dep, refund)
	keepsRefunds.RefundLimit = 0
	unchained := life(limited("a"), opened)
	unchained.LastChain = "not a hash"
	for name, a := range map[string]*Account{"every key kept": keepsKeys, "every hold kept": keepsHolds, "every refund kept": keepsRefunds, "a chain that is no hash": unchained, "no events": limited("a")} {
		if _, _, ok := Compact(a, fnvPrint); ok {
			t.Errorf("%s: compacted", name)
		}
	}
	for name, a := range map[string]*Account{"holds": life(limited("a"), opened, dep, hold, release), "refunds": life(limited("a"), opened, dep, refund)} {
		if _, _, ok := Compact(a, fnvPrint); !ok {
			t.Errorf("%s forgettable: not compacted", name)
		}
	}
}

// TestResidentPrints: the aggregate made from a Resident may have decided
// its most recent keys (ResidentPrints of them, those it was itself made
// from counted), no other; with a print that collides everywhere, any key.
func TestResidentPrints(t *testing.T) {
	at := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	a := limited("a")
	chained(t, a, Command{Type: CmdOpenAccount, AccountID: "a", Currency: "EUR", IdempotencyKey: "k0", At: at})
	for i := 1; i <= 3; i++ {
		chained(t, a, Command{Type: CmdDeposit, AccountID: "a", Amount: 1, HasAmount: true, Currency: "EUR", IdempotencyKey: fmt.Sprintf("k%d", i), At: at})
	}
	r, tail, _ := Compact(a, fnvPrint)
	b := limited("a")
	mustInto(t, r, b, tail)
	chained(t, b, Command{Type: CmdDeposit, AccountID: "a", Amount: 1, HasAmount: true, Currency: "EUR", IdempotencyKey: "k4", At: at})
	r, tail, _ = Compact(b, fnvPrint)
	c := limited("a")
	mustInto(t, r, c, tail)
	var may []string
	for i := range 6 {
		if k := fmt.Sprintf("k%d", i); c.MayHaveDecided(k, fnvPrint) {
			may = append(may, k)
		}
	}
	if want := []string{"k1", "k2", "k3", "k4"}; !reflect.DeepEqual(may, want) {
		t.Fatalf("may have decided %v, want %v", may, want)
	}
	r, tail, _ = Compact(a, func(string) uint64 { return 7 })
	d := limited("a")
	mustInto(t, r, d, tail)
	seven := func(string) uint64 { return 7 }
	if !d.MayHaveDecided("never", seven) || d.MayHaveDecided("k4", fnvPrint) {
		t.Fatal("a colliding print does not route")
	}
}

// TestResidentOnlyOfDurableState: Compact makes a Resident only of an
// aggregate that is the store's state (Account.Durable): folded from stored
// events, or with the decisions it folded ahead confirmed (ForgetDurable);
// never one holding a decision not confirmed (the pending state of an
// append that may fail), even under stored events folded on top of it, nor
// one a fold stopped in, even once confirmed. It fails when Compact ignores
// Durable, or when a fold on an unconfirmed or torn state confirms it.
func TestResidentOnlyOfDurableState(t *testing.T) {
	at := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	dep := func(key string) Command {
		return Command{Type: CmdDeposit, IdempotencyKey: key, AccountID: "a", Amount: 9, HasAmount: true, Currency: "EUR", At: at}
	}
	compacts := func(a *Account) bool { _, _, ok := Compact(a, fnvPrint); return ok }
	a := limited("a")
	chained(t, a, Command{Type: CmdOpenAccount, IdempotencyKey: "o", AccountID: "a", Currency: "EUR", At: at})
	chained(t, a, dep("d0"))
	if !compacts(a) {
		t.Fatal("an aggregate folded from stored events: not compacted")
	}
	cmd := dep("ahead")
	d := DecideAccount(a, cmd)
	if err := EvolveAccountDecided(a, storedOf(t, cmd, d.Events, 0, uint64(a.Revision+1), "p"), d.Events[0].Data); err != nil {
		t.Fatal(err)
	}
	if compacts(a) {
		t.Fatal("compacted with a decision folded ahead of its append")
	}
	chained(t, a, dep("d1")) // a stored event on the unconfirmed state
	if compacts(a) {
		t.Fatal("compacted once a stored event was folded on an unconfirmed decision")
	}
	a.ForgetDurable(a.Revision) // the store accepted the appends
	if !compacts(a) {
		t.Fatal("confirmed durable: not compacted")
	}
	cmd = dep("torn")
	d = DecideAccount(a, cmd)
	bad, ok := d.Events[0].Data.(Credited)
	if !ok {
		t.Fatalf("a deposit decided %T", d.Events[0].Data)
	}
	bad.BalanceAfter++
	if err := EvolveAccountDecided(a, storedOf(t, cmd, d.Events, 0, uint64(a.Revision+1), "p"), bad); err == nil {
		t.Fatal("a credit with the wrong balance_after folded")
	}
	a.ForgetDurable(a.Revision)
	chained(t, a, dep("d2"))
	if compacts(a) {
		t.Fatal("compacted after a fold stopped in it")
	}
}

func mustInto(t *testing.T, r Resident, a *Account, tail []byte) {
	t.Helper()
	if err := r.Into(a, tail); err != nil {
		t.Fatal(err)
	}
}

// TestResidentTailRefusesWhatCompactDidNotWrite: Into refuses a tail cut
// short anywhere or followed by more bytes, and takes the tail whole. It
// fails when a read past a field's end is not caught.
func TestResidentTailRefusesWhatCompactDidNotWrite(t *testing.T) {
	at := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	a := limited("a")
	chained(t, a, Command{Type: CmdOpenAccount, AccountID: "a", Currency: "EUR", IdempotencyKey: "o", At: at, Metadata: map[string]string{"tier": "gold", "x": ""}})
	chained(t, a, Command{Type: CmdDeposit, AccountID: "a", Amount: 9, HasAmount: true, Currency: "EUR", IdempotencyKey: "d", At: at})
	chained(t, a, Command{Type: CmdPlaceHold, AccountID: "a", HoldID: "h", Amount: 4, HasAmount: true, Currency: "EUR", IdempotencyKey: "h", At: at, ExpiresAt: at.Add(time.Hour)})
	r, tail, ok := Compact(a, fnvPrint)
	if !ok || len(tail) == 0 {
		t.Fatalf("compacted %v with a tail of %d bytes", ok, len(tail))
	}
	whole := limited("a")
	mustInto(t, r, whole, tail)
	if same, diff := SameState(whole, a); !same || !reflect.DeepEqual(whole.Metadata, a.Metadata) {
		t.Fatalf("from the whole tail: %s, metadata %v", diff, whole.Metadata)
	}
	for n := 1; n < len(tail); n++ { // 0: no tail, an account with neither
		if err := r.Into(limited("a"), tail[:n]); err == nil {
			t.Fatalf("a tail cut to %d of %d bytes taken", n, len(tail))
		}
	}
	if err := r.Into(limited("a"), append(slices.Clone(tail), 0)); err == nil {
		t.Fatal("a tail with a byte more taken")
	}
}
