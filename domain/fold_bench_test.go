package domain

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkFoldAccount measures the fold of an account's events, per event, on
// a stream of every kind of account event but the closure (801 events): their
// decoding alone (DecodeEvent), the fold from their stored data (a cold load:
// DecodeEvent, then the fold and the key records) and from the decided payloads (the ledger after its append:
// EventSubject, as the append computes it, then the fold). Run (BENCHMARKS.md,
// "The event registry"):
//
//	go test ./domain -run '^$' -bench FoldAccount -benchmem -count 5
func BenchmarkFoldAccount(b *testing.B) {
	stored, decided := foldBenchStream(b)
	b.Run("decode", perEvent(len(stored), func(b *testing.B) {
		for _, ev := range stored {
			if _, err := DecodeEvent(ev.Type, ev.Data); err != nil {
				b.Fatal(err)
			}
		}
	}))
	b.Run("stored", perEvent(len(stored), func(b *testing.B) {
		a := NewAccount("a")
		for _, ev := range stored {
			if err := EvolveAccount(a, ev); err != nil {
				b.Fatal(err)
			}
		}
	}))
	b.Run("decided", perEvent(len(stored), func(b *testing.B) {
		a := NewAccount("a")
		for i, ev := range stored {
			ev.Metadata.Subject = EventSubject(decided[i])
			if err := EvolveAccountDecided(a, ev, decided[i].Data); err != nil {
				b.Fatal(err)
			}
		}
	}))
}

// perEvent is a benchmark that runs once per iteration over n events and
// reports its time per event.
func perEvent(n int, once func(b *testing.B)) func(b *testing.B) {
	return func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			once(b)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/event")
	}
}

// foldBenchStream is the stream of BenchmarkFoldAccount: an account opened,
// then 100 rounds of a deposit, a withdrawal, a refused withdrawal (recorded),
// a hold placed and captured in part, a hold placed and released, and a refund
// of the round's deposit; as stored events and as decided.
func foldBenchStream(b *testing.B) ([]StoredEvent, []NewEvent) {
	at := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	a := NewAccount("a")
	var stored []StoredEvent
	var decided []NewEvent
	seq := 0
	do := func(cmd Command) {
		cmd.IdempotencyKey, cmd.At, cmd.AccountID = fmt.Sprintf("k%d", seq), at, "a"
		seq++
		d := DecideAccount(a, cmd)
		for j, ne := range d.Events {
			ev := storedOf(&testing.T{}, cmd, d.Events, j, uint64(a.Revision+1), fmt.Sprint(seq))
			if err := EvolveAccount(a, ev); err != nil {
				b.Fatal(err)
			}
			stored, decided = append(stored, ev), append(decided, ne)
		}
	}
	do(Command{Type: CmdOpenAccount, Currency: "EUR"})
	for i := range 100 {
		do(Command{Type: CmdDeposit, Amount: 100, HasAmount: true, Currency: "EUR"})
		deposit := fmt.Sprintf("k%d", seq-1)
		do(Command{Type: CmdWithdraw, Amount: 30, HasAmount: true, Currency: "EUR"})
		do(Command{Type: CmdWithdraw, Amount: 1 << 40, HasAmount: true, Currency: "EUR"})
		do(Command{Type: CmdPlaceHold, HoldID: fmt.Sprintf("c%d", i), Amount: 20, HasAmount: true, Currency: "EUR"})
		do(Command{Type: CmdCaptureHold, HoldID: fmt.Sprintf("c%d", i), Amount: 15, HasAmount: true})
		do(Command{Type: CmdPlaceHold, HoldID: fmt.Sprintf("r%d", i), Amount: 10, HasAmount: true, Currency: "EUR"})
		do(Command{Type: CmdReleaseHold, HoldID: fmt.Sprintf("r%d", i)})
		do(Command{Type: CmdRefund, OriginalKey: deposit, Amount: 5, HasAmount: true})
	}
	if len(stored) != 801 || a.Keys["k3"].Status != StatusRejected {
		b.Fatalf("the stream did not go as planned: %d events", len(stored))
	}
	return stored, decided
}
