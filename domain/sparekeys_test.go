package domain

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// TestSpareKeysHoldTheSameKeys: accounts folded one command at a time, each
// forgetting its keys into one SpareKeys and the next taking its storage
// (the audit's fold), hold after each command exactly the keys and the state
// of accounts that make a map for each (ForgetKeys), and the storage passes
// from one account to the next, so no account keeps a map between commands.
func TestSpareKeysHoldTheSameKeys(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var spare SpareKeys
	reused, made := map[string]*Account{}, map[string]*Account{}
	for i := range 12 {
		id := fmt.Sprintf("acc%d", i%3)
		cmd := Command{Type: CmdDeposit, IdempotencyKey: fmt.Sprintf("k%d", i), AccountID: id, Amount: 5, HasAmount: true, Currency: "EUR", At: at}
		if i < 3 {
			cmd = Command{Type: CmdOpenAccount, IdempotencyKey: fmt.Sprintf("open%d", i), AccountID: id, Currency: "EUR", At: at}
		}
		for _, accs := range []map[string]*Account{reused, made} {
			a := accs[id]
			if a == nil {
				a = NewAccount(id)
				a.KeyLimit = 1
				accs[id] = a
			}
			if accs[id] == reused[id] {
				a.UseSpareKeys(&spare)
			}
			d := DecideAccount(a, cmd)
			if err := EvolveAccount(a, storedOf(t, cmd, d.Events, 0, uint64(a.Revision+1), "p")); err != nil {
				t.Fatal(err)
			}
			if got := keysOf(a); !slices.Equal(got, []string{cmd.IdempotencyKey}) {
				t.Fatalf("command %d: %s keeps %v, not only its key %s", i, id, got, cmd.IdempotencyKey)
			}
			if accs[id] == reused[id] {
				a.ForgetKeysInto(&spare)
			} else {
				a.ForgetKeys()
			}
			if a.Keys != nil || a.keyOrder.names != nil {
				t.Fatalf("command %d: %s keeps storage of its keys between commands", i, id)
			}
		}
		if ok, diff := SameState(reused[id], made[id]); !ok || reused[id].Forgot() != made[id].Forgot() {
			t.Fatalf("command %d: %s differs: %s", i, id, diff)
		}
		if spare.m == nil {
			t.Fatalf("command %d: the storage of the keys forgotten was not kept", i)
		}
	}
}
