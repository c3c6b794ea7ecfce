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

// TestBatchRunsGuardsAlone pins each of batchRuns' guards on its own: the
// account check (sameAccountRun) and soleAfter's refusal of a command that
// waits for its key's earlier command to finish (afterKey). Through
// scheduleBatch neither can be pinned alone, which is why TestBatchRuns does
// not: a client's account command (runnable) names only its key and its
// account, so one that comes after a runnable command alone comes after it
// by its account (the same account: a run), or by its key and not its
// account (then that command names another account: both guards refuse
// it), and one whose key's and account's last are one command comes after
// it twice (len(after) 2, no sole one: TestBatchRuns' element 8). Here the
// elements are built by hand in the shapes a schedule that named such a
// command once would give, so that removing either guard alone fails.
func TestBatchRunsGuardsAlone(t *testing.T) {
	dep := func(key, acc string) domain.BatchCommand {
		return domain.BatchCommand{Command: domain.Command{Type: domain.CmdDeposit, IdempotencyKey: key, AccountID: acc, Amount: 1, Currency: "EUR"}}
	}
	elem := func() *batchElement {
		return &batchElement{decided: make(chan struct{}), finished: make(chan struct{})}
	}
	for _, tc := range []struct {
		name  string
		cmds  []domain.BatchCommand
		after func(p *batchElement) *batchElement // element 1's schedule, after element 0 (p)
		want  []batchRun
	}{
		{"after its account's last alone: one run", []domain.BatchCommand{dep("k0", "a"), dep("k1", "a")},
			func(p *batchElement) *batchElement { e := elem(); e.after = []*batchElement{p}; return e },
			[]batchRun{{0, 1}}},
		{"after another account's command alone, not by key: the account check", []domain.BatchCommand{dep("k0", "a"), dep("k1", "b")},
			func(p *batchElement) *batchElement { e := elem(); e.after = []*batchElement{p}; return e },
			[]batchRun{{0}, {1}}},
		{"after its key's and account's last, named once: the afterKey guard", []domain.BatchCommand{dep("k0", "a"), dep("k0", "a")},
			func(p *batchElement) *batchElement {
				e := elem()
				e.after, e.afterKey = []*batchElement{p}, p
				return e
			},
			[]batchRun{{0}, {1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := elem()
			got := batchRuns(tc.cmds, []*batchElement{p, tc.after(p)})
			if !slices.EqualFunc(got, tc.want, slices.Equal) {
				t.Fatalf("runs %v, want %v", got, tc.want)
			}
		})
	}
}
