package domain

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// TestRefundsReadAsAMap: random writes and deletes over 12 originals, crossing
// the slice's bound (refundsInline) both ways, read as a map of the same
// writes reads: each original's sum, the count, every entry once.
func TestRefundsReadAsAMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(474, 1))
	for round := range 2000 {
		var r Refunds
		ref := map[string]RefundedSum{}
		for op := range 60 {
			k := fmt.Sprintf("o%d", rng.IntN(12))
			if rng.IntN(3) == 0 {
				r.Delete(k)
				delete(ref, k)
			} else {
				s := RefundedSum{Amount: int64(rng.IntN(1000)), Findable: rng.IntN(2) == 0}
				r.set(k, s)
				ref[k] = s
			}
			if r.Len() != len(ref) {
				t.Fatalf("round %d op %d: %d originals, the map %d", round, op, r.Len(), len(ref))
			}
			for i := range 12 {
				k := fmt.Sprintf("o%d", i)
				got, gin := r.Lookup(k)
				want, win := ref[k]
				if got != want || gin != win {
					t.Fatalf("round %d op %d: %s = %v %v, the map %v %v", round, op, k, got, gin, want, win)
				}
			}
			n := 0
			for k, s := range r.All() {
				n++
				if ref[k] != s {
					t.Fatalf("round %d op %d: All yields %s %v, the map %v", round, op, k, s, ref[k])
				}
			}
			if n != len(ref) {
				t.Fatalf("round %d op %d: All yields %d, the map %d", round, op, n, len(ref))
			}
		}
	}
}

// TestRefundsUpToEachOriginalPastTheSlice: an account of 10 deposits, each
// refunded in two parts, decided and folded as the ledger does and read back
// through a snapshot at each step: a refund up to its original is accepted,
// one past it refused, at 8, 9 and 10 originals (where Refunds leaves its
// slice for a map); then each original, refunded whole, refuses one minor
// unit more with funds there.
func TestRefundsUpToEachOriginalPastTheSlice(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a := NewAccount("a")
	n := 0
	run := func(cmd Command) Decision {
		n++
		cmd.IdempotencyKey, cmd.At, cmd.AccountID = fmt.Sprintf("k%d", n), at, "a"
		d := DecideAccount(a, cmd)
		for j := range d.Events {
			if err := EvolveAccount(a, storedOf(t, cmd, d.Events, j, uint64(a.Revision+1), fmt.Sprint(a.Revision+1))); err != nil {
				t.Fatal(err)
			}
		}
		return d
	}
	run(Command{Type: CmdOpenAccount, Currency: "EUR"})
	for range 10 {
		run(Command{Type: CmdDeposit, Amount: 100, HasAmount: true, Currency: "EUR"})
	}
	for i := range 10 {
		orig := fmt.Sprintf("k%d", i+2)
		for _, step := range []struct {
			amount int64
			ok     bool
		}{{60, true}, {41, false}, {40, true}, {1, false}} {
			d := run(Command{Type: CmdRefund, OriginalKey: orig, Amount: step.amount, HasAmount: true})
			if (d.Rejection == nil) != step.ok {
				t.Fatalf("original %d (%s), a refund of %d: %+v (want accepted: %v), refunded %v", i, orig, step.amount, d.Rejection, step.ok, a.Refunded.Map())
			}
			b := viaSnapshot(t, a)
			if b.Refunded.Len() != a.Refunded.Len() || b.Refunded.Of(orig).Amount != a.Refunded.Of(orig).Amount {
				t.Fatalf("through a snapshot: %v, the aggregate %v", b.Refunded.Map(), a.Refunded.Map())
			}
		}
	}
	run(Command{Type: CmdDeposit, Amount: 10_000, HasAmount: true, Currency: "EUR"})
	for i := range 10 {
		orig := fmt.Sprintf("k%d", i+2)
		if d := run(Command{Type: CmdRefund, OriginalKey: orig, Amount: 1, HasAmount: true}); d.Rejection == nil {
			t.Errorf("original %s, refunded whole, refunded again by 1: accepted (balance %d)", orig, a.Balance)
		}
	}
	if a.Refunded.Len() != 10 {
		t.Fatalf("refunded %v, want 10 originals", a.Refunded.Map())
	}
}
