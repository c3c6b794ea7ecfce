package domain

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

// BenchmarkAccountHeapPerPart measures the live heap of an account aggregate's
// parts, as the ledger holds them after folding stored events: the aggregate
// itself (keeping one key), one key record (with every key kept), one active
// hold, one closed hold (placed and released), one refunded original (a
// deposit refunded in part). The constants of ApproxBytes come from it. Run:
//
//	go test ./domain -run '^$' -bench AccountHeapPerPart -benchtime 1x -count 3
func BenchmarkAccountHeapPerPart(b *testing.B) {
	const n = 50_000
	at := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	for b.Loop() {
		before := live()
		accs := make([]*Account, 1000)
		for i := range accs {
			accs[i] = build(b, fmt.Sprintf("base-%d", i), at, 1, 0, 0, 0, false)
		}
		base := float64(live()-before) / float64(len(accs))
		runtime.KeepAlive(accs)
		accs = nil
		for _, part := range []struct {
			name                     string
			keyLimit                 int
			deposits, holds, release int
			refund                   bool
		}{{"key-record", 0, n, 0, 0, false}, {"active-hold", 1, 0, n, 0, false}, {"closed-hold", 1, 0, n, n, false}, {"refunded-original", 1, n, 0, 0, true}} {
			before := live()
			a := build(b, "a", at, part.keyLimit, part.deposits, part.holds, part.release, part.refund)
			b.ReportMetric(float64(live()-before)/n, part.name+"-B")
			runtime.KeepAlive(a)
		}
		b.ReportMetric(base, "account-B")
	}
}

// build folds an account with deposits (each refunded in part right after
// it when refund is set), holds placed and the first release of them
// released, each command under its own key, through stored copies of the
// events, into an aggregate keeping keyLimit keys (0: all).
func build(b *testing.B, id string, at time.Time, keyLimit, deposits, holds, release int, refund bool) *Account {
	a := NewAccount(id)
	a.KeyLimit = keyLimit
	seq := 0
	do := func(cmd Command) {
		cmd.IdempotencyKey, cmd.At, cmd.AccountID = fmt.Sprintf("%08x-5e1f-4c3a-9d2b-%012x", seq, seq), at, id
		seq++
		d := DecideAccount(a, cmd)
		for j := range d.Events {
			ev := storedOf(&testing.T{}, cmd, d.Events, j, uint64(a.Revision+1), "p")
			ev.Stream = "account-" + id
			if err := EvolveAccount(a, ev); err != nil {
				b.Fatal(err)
			}
		}
	}
	do(Command{Type: CmdOpenAccount, Currency: "EUR"})
	do(Command{Type: CmdDeposit, Amount: 1 << 40, HasAmount: true, Currency: "EUR"})
	for range deposits {
		do(Command{Type: CmdDeposit, Amount: 100, HasAmount: true, Currency: "EUR"})
		if refund {
			do(Command{Type: CmdRefund, OriginalKey: fmt.Sprintf("%08x-5e1f-4c3a-9d2b-%012x", seq-1, seq-1), Amount: 1, HasAmount: true})
		}
	}
	for i := range holds {
		do(Command{Type: CmdPlaceHold, HoldID: fmt.Sprintf("hold-%08d", i), Amount: 100, HasAmount: true, Currency: "EUR"})
	}
	for i := range release {
		do(Command{Type: CmdReleaseHold, HoldID: fmt.Sprintf("hold-%08d", i)})
	}
	return a
}

func live() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
