package ledger_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore/memory"
	"github.com/ledgerworks/ledger/internal/app/ledger"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// Micro-benchmarks of the command path on the memory store (no I/O), for CPU and
// allocations per command. Run with
//
//	go test ./internal/ledger -run '^$' -bench 'Hot' -benchmem -count 5
//
// HotDeposit is Handle of a new deposit (decide, encode, claim, append, fold,
// reply); HotDuplicate is Handle of a key the cached aggregate already decided;
// HotRawDuplicate is the same from the raw body (strict decoding included), as the
// intake calls it.
func hotService(b *testing.B) (*ledger.Service, []domain.Command, [][]byte) {
	b.Helper()
	svc := ledger.New(memory.New(), ledger.Options{DisableGroupCommit: true, Clock: devtest.NewClock().Now})
	b.Cleanup(svc.Close)
	open := domain.Command{Type: domain.CmdOpenAccount, IdempotencyKey: "hot-open", AccountID: "hot", Currency: "EUR"}
	if r := svc.Handle(context.Background(), open); r.Status != domain.StatusApplied {
		b.Fatalf("open: %+v", r)
	}
	var cmds []domain.Command
	var bodies [][]byte
	for i := range 10 {
		body := fmt.Appendf(nil, `{"idempotency_key":"hot-dep-%d","account_id":"hot","amount":%d,"currency":"EUR"}`, i, 100+i)
		cmd, ierr := domain.DecodeCommand(domain.CmdDeposit, body)
		if ierr != nil {
			b.Fatal(ierr)
		}
		if r := svc.Handle(context.Background(), cmd); r.Status != domain.StatusApplied {
			b.Fatalf("deposit: %+v", r)
		}
		cmds, bodies = append(cmds, cmd), append(bodies, body)
	}
	return svc, cmds, bodies
}

func BenchmarkHotDeposit(b *testing.B) {
	svc, _, _ := hotService(b)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		cmd := domain.Command{Type: domain.CmdDeposit, IdempotencyKey: fmt.Sprintf("hot-new-%d", i), AccountID: "hot", Currency: "EUR", Amount: 7, HasAmount: true}
		if r := svc.Handle(context.Background(), cmd); r.Status != domain.StatusApplied || r.Duplicate {
			b.Fatalf("%+v", r)
		}
	}
}

func BenchmarkHotDuplicate(b *testing.B) {
	svc, cmds, _ := hotService(b)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if r := svc.Handle(context.Background(), cmds[i%len(cmds)]); !r.Duplicate {
			b.Fatalf("%+v", r)
		}
	}
}

func BenchmarkHotRawDuplicate(b *testing.B) {
	svc, _, bodies := hotService(b)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if r := svc.HandleRaw(context.Background(), "deposit", bodies[i%len(bodies)]); !r.Duplicate {
			b.Fatalf("%+v", r)
		}
	}
}
