package domain

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/internal/testing/heaptest"
)

// TestAccountHeapBoundedByItsLimits: an account aggregate that keeps 16 key
// records, closed holds and refunded originals (KeyLimit, HoldLimit,
// RefundLimit, as the ledger's Options.RecentKeys, RecentHolds and
// RecentRefunds bound them) holds the same heap however long its history:
// 50 accounts, each folding a cycle of deposits, holds captured and released
// and deposits refunded, grow by under perCommand bytes a command between
// 280 and 1,120 commands each (the limits long reached). The same accounts
// without limits grow past it (every record, hold and original kept): the
// measure sees a history kept.
func TestAccountHeapBoundedByItsLimits(t *testing.T) {
	const (
		perCommand = 16
		accounts   = 50
		n, m       = 280, 1120
	)
	for _, limit := range []int{16, 0} {
		accs := make([]*Account, accounts)
		for i := range accs {
			accs[i] = NewAccount("a")
			accs[i].KeyLimit, accs[i].HoldLimit, accs[i].RefundLimit = limit, limit, limit
			foldCycles(t, accs[i], 0, n)
		}
		before := heaptest.Live()
		for _, a := range accs {
			foldCycles(t, a, n, m)
		}
		after := heaptest.Live()
		runtime.KeepAlive(accs)
		grew := (float64(after) - float64(before)) / float64(accounts*(m-n))
		t.Logf("limits %d: %.1f bytes a command from %d to %d commands an account", limit, grew, n, m)
		if bounded := grew < perCommand; bounded != (limit > 0) {
			t.Fatalf("limits %d: the heap grew %.1f bytes a command from %d to %d commands an account (%d to %d bytes)", limit, grew, n, m, before, after)
		}
	}
}

// historyCycle is the commands foldCycles repeats on an account: a deposit,
// a hold captured in part, another released, a deposit refunded in part.
var historyCycle = []Command{
	{Type: CmdDeposit, Amount: 100, HasAmount: true, Currency: "EUR"},
	{Type: CmdPlaceHold, HoldID: "c", Amount: 20, HasAmount: true, Currency: "EUR"},
	{Type: CmdCaptureHold, HoldID: "c", Amount: 10, HasAmount: true},
	{Type: CmdPlaceHold, HoldID: "r", Amount: 20, HasAmount: true, Currency: "EUR"},
	{Type: CmdReleaseHold, HoldID: "r"},
	{Type: CmdDeposit, Amount: 50, HasAmount: true, Currency: "EUR"},
	{Type: CmdRefund, OriginalKey: "d", Amount: 20, HasAmount: true},
}

// foldCycles decides commands from..to-1 of a's history (command 0 opens it)
// and folds their events, each event its own bytes as a store gives them.
func foldCycles(t *testing.T, a *Account, from, to int) {
	t.Helper()
	at := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := from; i < to; i++ {
		cmd := Command{Type: CmdOpenAccount, Currency: "EUR"}
		if i > 0 {
			cmd = historyCycle[(i-1)%len(historyCycle)]
			cycle := (i - 1) / len(historyCycle)
			if cmd.HoldID != "" {
				cmd.HoldID = fmt.Sprintf("%s%d", cmd.HoldID, cycle)
			}
			if cmd.OriginalKey != "" {
				cmd.OriginalKey = fmt.Sprintf("k%d", i-1)
			}
		}
		cmd.AccountID, cmd.IdempotencyKey, cmd.At = "a", fmt.Sprintf("k%d", i), at
		d := DecideAccount(a, cmd)
		if len(d.Events) == 0 || d.Rejection != nil {
			t.Fatalf("%s %s: %+v", cmd.Type, cmd.IdempotencyKey, d)
		}
		for j := range d.Events {
			fold(t, a, []StoredEvent{storedOf(t, cmd, d.Events, j, uint64(a.Revision+1), fmt.Sprintf("p%d-%d", i, j))})
		}
	}
}
