package projections

import (
	"fmt"
	"maps"
	"slices"
	"testing"

	"github.com/ledgerworks/ledger/domain"
)

// TestAccountMemoRecallsWhatItRemembered: an account's last row is recalled
// as it was remembered (its currency and status included, as the memo keeps
// them as indexes), the last remembered winning; a complete memo answers an
// account it lacks as one with no row.
func TestAccountMemoRecallsWhatItRemembered(t *testing.T) {
	am := newAccountMemo(true)
	want := map[string]memoAccount{}
	currencies := []string{"EUR", "USD", "JPY"}
	statuses := []domain.AccountStatus{"", domain.AccountStatusOpen, "closed", "frozen"}
	for i := range 1000 {
		id := fmt.Sprintf("a-%d", i%300)
		a := memoAccount{
			state: BalanceState{Currency: currencies[i%3], Balance: int64(i*7 - 3000), Held: int64(i % 11), Status: statuses[i%4]},
			rev:   int64(i),
		}
		am.remember(id, a)
		want[id] = a
	}
	got := map[string]memoAccount{}
	ids := append(slices.Sorted(maps.Keys(want)), "none")
	if unknown := am.recall(ids, func(id string, a memoAccount) { got[id] = a }); len(unknown) != 0 {
		t.Fatalf("a complete memo left %v to read", unknown)
	}
	for id, a := range want {
		if got[id] != a {
			t.Fatalf("%s: recalled %+v, remembered %+v", id, got[id], a)
		}
	}
	if got["none"] != (memoAccount{rev: -1}) {
		t.Fatalf("an account never remembered: %+v, want no row", got["none"])
	}
}

// TestAccountMemoPastItsNamesForgetsTheAccount: an account remembered with a
// currency past the memo's names' bound is not answered from the memo (not
// by its earlier row, nor as one with no row): it is read back.
func TestAccountMemoPastItsNamesForgetsTheAccount(t *testing.T) {
	am := newAccountMemo(true)
	am.remember("a", memoAccount{state: BalanceState{Currency: "EUR", Balance: 5}, rev: 0})
	for i := 0; len(am.names) < memoNamesLimit; i++ {
		am.remember("b", memoAccount{state: BalanceState{Currency: fmt.Sprintf("C%d", i)}, rev: int64(i)})
	}
	am.remember("a", memoAccount{state: BalanceState{Currency: "XTS", Balance: 6}, rev: 1})
	unknown := am.recall([]string{"a", "c"}, func(id string, a memoAccount) {
		t.Errorf("%s answered from the memo past its names' bound: %+v", id, a)
	})
	if !slices.Equal(unknown, []string{"a", "c"}) {
		t.Fatalf("left to read: %v, want [a c]", unknown)
	}
}
