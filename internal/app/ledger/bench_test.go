package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/app/ledger"
	"github.com/ledgerworks/ledger/internal/testing/bench/seed"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// BenchmarkKeyCheck measures the key check on an account stream of 10 events and
// on one of 100,000 (ARCHITECTURE decision 4: a check must not get slower as a
// stream grows), on the PostgreSQL store:
//
//   - duplicate: Handle of a key the stream already decided (warm cache), which
//     must answer without writing; over 10 keys spread over the stream (the same
//     working set on both streams) or over 1,000 (the long stream's checks then
//     touch records that are no longer in the CPU's caches);
//   - decide: the pure decision on the cached aggregate (key lookup, request hash
//     through Canonical as decideOnAccount computes it, DecideAccount), no I/O,
//     over the same key sets;
//   - decide+append: Handle of a new deposit (warm cache), including its append;
//   - cold-load: a fresh Service answering one duplicate, i.e. reading and folding
//     the whole stream once.
//
// Run (cold-load takes about a second per round on the long stream: give it
// few rounds):
//
//	go test ./internal/ledger -run '^$' -bench 'KeyCheck/.*/(duplicate|decide)/' -benchtime 20000x -count 5
//	go test ./internal/ledger -run '^$' -bench 'KeyCheck/.*/(decide\+append|cold-load)' -benchtime 3x
//
// (The test cluster runs without fsync: decide+append here measures the append's
// CPU and round trips, not the disk; `ledger bench` measures it with fsync on.)
func BenchmarkKeyCheck(b *testing.B) {
	ctx := context.Background()
	store := devtest.Postgres(b)

	lengths := []int{10, 100_000}
	streams := map[int]*seed.Stream{}
	for _, n := range lengths {
		start := time.Now()
		st, err := seed.Account(ctx, store, fmt.Sprintf("kc-%d", n), n, seed.Options{})
		if err != nil {
			b.Fatal(err)
		}
		streams[n] = st
		b.Logf("seeded %s: %d events, %d key claims in %s", st.Stream, st.Events, st.Claims, time.Since(start).Round(time.Millisecond))
	}

	svc := ledger.New(store, ledger.Options{})
	b.Cleanup(svc.Close)
	for _, n := range lengths {
		st := streams[n]
		// Known keys: 10 spread over the stream (the same working set on both
		// streams), or 1,000 spread over it (on the short stream, its 10).
		keySets := []struct {
			name string
			cmds []domain.Command
		}{{"keys=10", knownKeys(b, st, 10)}, {"keys=spread", knownKeys(b, st, 1000)}}
		for _, ks := range keySets {
			b.Run(fmt.Sprintf("events=%d/duplicate/%s", n, ks.name), func(b *testing.B) {
				handleOne(b, svc, ks.cmds[0], true) // warm the cache
				for i := 0; b.Loop(); i++ {
					handleOne(b, svc, ks.cmds[i%len(ks.cmds)], true)
				}
			})
		}
		for _, ks := range keySets {
			b.Run(fmt.Sprintf("events=%d/decide/%s", n, ks.name), func(b *testing.B) {
				acc := fold(b, store, st)
				fresh := newDeposit(b, st, "decide", 0)
				for i := 0; b.Loop(); i++ {
					// What decideOnAccount does before it appends: look the key up
					// (a known key: compare the request), else decide.
					known := ks.cmds[i%len(ks.cmds)]
					rec, ok := acc.Keys[known.IdempotencyKey]
					if !ok {
						b.Fatal("seeded key not in the aggregate")
					}
					if j, err := domain.Judge(rec.DecidedFor(nil), known.Canonical()); err != nil || j.Verdict != domain.KeyDuplicate {
						b.Fatal("seeded key answered as a conflict")
					}
					if _, ok := acc.Keys[fresh.IdempotencyKey]; ok {
						b.Fatal("fresh key already decided")
					}
					if d := domain.DecideAccount(acc, fresh); len(d.Events) != 1 {
						b.Fatalf("decision: %+v", d)
					}
				}
			})
		}
		b.Run(fmt.Sprintf("events=%d/decide+append", n), func(b *testing.B) {
			handleOne(b, svc, keySets[0].cmds[0], true) // warm the cache
			for i := 0; b.Loop(); i++ {
				handleOne(b, svc, newDeposit(b, st, "append", i), false)
			}
		})
		b.Run(fmt.Sprintf("events=%d/cold-load", n), func(b *testing.B) {
			cmd := keySets[0].cmds[0]
			for b.Loop() {
				cold := ledger.New(store, ledger.Options{})
				handleOne(b, cold, cmd, true)
				cold.Close()
			}
		})
	}
}

// knownKeys decodes n of the stream's commands spread over its whole length.
func knownKeys(b *testing.B, st *seed.Stream, n int) []domain.Command {
	b.Helper()
	out, err := st.Spread(n)
	if err != nil {
		b.Fatal(err)
	}
	return out
}

// depositSeq keeps the keys of new deposits unique across benchmark rounds.
var depositSeq atomic.Int64

func newDeposit(b *testing.B, st *seed.Stream, tag string, i int) domain.Command {
	b.Helper()
	body := fmt.Appendf(nil, `{"idempotency_key":"%s-%s-%d-%d","account_id":%q,"amount":7,"currency":%q}`, st.AccountID, tag, depositSeq.Add(1), i, st.AccountID, st.Currency)
	cmd, ierr := domain.DecodeCommand(domain.CmdDeposit, body)
	if ierr != nil {
		b.Fatal(ierr)
	}
	return cmd
}

func handleOne(b *testing.B, svc *ledger.Service, cmd domain.Command, wantDup bool) {
	r := svc.Handle(context.Background(), cmd)
	if r.Status != domain.StatusApplied || r.Duplicate != wantDup {
		b.Fatalf("%s %s: %s %s duplicate=%v: %s", cmd.Type, cmd.IdempotencyKey, r.Status, r.Code, r.Duplicate, r.Message)
	}
}

// fold reads the stream and folds it into an aggregate, as the service does on a
// cache miss.
func fold(b *testing.B, store eventstore.StreamReader, st *seed.Stream) *domain.Account {
	b.Helper()
	acc := domain.NewAccount(st.AccountID)
	next := uint64(0)
	for {
		evs, err := store.ReadStream(context.Background(), st.Stream, next, eventstore.Forwards, 4096)
		if errors.Is(err, eventstore.ErrStreamNotFound) {
			break
		}
		if err != nil {
			b.Fatal(err)
		}
		for _, re := range evs {
			m, err := domain.DecodeMetadata(re.Metadata)
			if err != nil {
				b.Fatal(err)
			}
			if err := domain.EvolveAccount(acc, domain.StoredEvent{ID: re.ID, Stream: re.Stream, Revision: re.Revision, Position: re.Position.String(), Type: re.Type, Data: re.Data, Metadata: m}); err != nil {
				b.Fatal(err)
			}
		}
		if len(evs) < 4096 {
			break
		}
		next = evs[len(evs)-1].Revision + 1
	}
	return acc
}
