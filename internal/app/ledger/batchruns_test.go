package ledger

import (
	"slices"
	"testing"

	"github.com/ledgerworks/ledger/domain"
)

// unitDeposit is a batch's deposit of 1 EUR on acc.
func unitDeposit(key, acc string) batchCmd {
	return batchCmd{"deposit", map[string]any{"idempotency_key": key, "account_id": acc, "amount": 1, "currency": "EUR"}}
}

// TestBatchRuns: the consecutive commands of one account that come after
// the one before them alone are decided on one worker (one run); a command
// that comes after anything else, or is not an account command, starts a run
// of its own, and an invalid command is in none.
func TestBatchRuns(t *testing.T) {
	dep := unitDeposit
	cmds := []batchCmd{
		dep("k0", "a"), dep("k1", "a"), // 0 1: one run
		dep("k2", "b"), // 2: b's own
		dep("k3", "a"), // 3: after 1 alone, a run on with 0 and 1
		{"transfer", map[string]any{"idempotency_key": "k4", "transfer_id": "t", "from": "a", "to": "b", "amount": 1, "currency": "EUR"}}, // 4: not an account command
		dep("k5", "a"), // 5: after the transfer
		dep("k6", "a"), // 6: after 5 alone
		{"deposit", map[string]any{"idempotency_key": "k7"}}, // 7: invalid, in no run
		dep("k6", "a"), // 8: its key's and its account's last are one command, named twice: its own
		dep("k9", "b"), // 9: after the transfer, which names b
		dep("k9", "c"), // 10: after 9 alone (its key), of another account: its own
	}
	b, ierr := domain.DecodeBatch(batchBody(cmds))
	if ierr != nil {
		t.Fatal(ierr)
	}
	if b.Commands[7].Invalid == nil {
		t.Fatalf("element 7 is valid: %+v", b.Commands[7])
	}
	got := batchRuns(b.Commands, scheduleBatch(b.Commands))
	want := []batchRun{{0, 1, 3}, {2}, {4}, {5, 6}, {8}, {9}, {10}}
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("runs %v, want %v", got, want)
	}
}
