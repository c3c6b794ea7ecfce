package postgres_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/eventstore/postgres"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// BenchmarkAppendMulti appends group commits of 1, 16 and 256 commands, each command
// two parts like the ledger's: one event at the next revision of an existing
// account stream, and one to a new claim stream. One op is one AppendMulti.
func BenchmarkAppendMulti(b *testing.B) {
	ctx := context.Background()
	s := devtest.Postgres(b)
	for _, commands := range []int{1, 16, 256} {
		b.Run(fmt.Sprintf("commands=%d", commands), func(b *testing.B) {
			accounts := make([]string, commands)
			revs := make([]int64, commands)
			for i := range accounts {
				accounts[i] = fmt.Sprintf("account-%d-%s", commands, uuid.NewString())
				revs[i] = -1
			}
			data := []byte(`{"amount":"12.34","currency":"EUR","account":"account-1"}`)
			meta := []byte(`{"key":"k","type":"post","hash":"0123456789abcdef0123456789abcdef"}`)
			parts := make([]eventstore.StreamAppend, 0, 2*commands)
			cpu0, cpuOK := serverCPU(ctx, s)
			own0 := ownCPU()
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				parts = parts[:0]
				for i, a := range accounts {
					parts = append(parts,
						eventstore.StreamAppend{Stream: a, Expected: eventstore.ExactOrNoStream(revs[i]), Events: []eventstore.EventData{{ID: uuid.New(), Type: "Posted", Data: data, Metadata: meta}}},
						eventstore.StreamAppend{Stream: "claim-" + uuid.NewString(), Expected: eventstore.NoStream, Events: []eventstore.EventData{{ID: uuid.New(), Type: "Claimed", Data: data, Metadata: meta}}},
					)
				}
				if _, err := s.AppendMulti(ctx, parts); err != nil {
					b.Fatal(err)
				}
				for i := range revs {
					revs[i]++
				}
			}
			b.ReportMetric(float64(b.N*commands)/b.Elapsed().Seconds(), "commands/s")
			b.ReportMetric(float64((ownCPU()-own0).Microseconds())/float64(b.N), "client-µs/op")
			if cpu1, ok := serverCPU(ctx, s); ok && cpuOK {
				b.ReportMetric(float64((cpu1-cpu0).Microseconds())/float64(b.N), "server-µs/op")
			}
		})
	}
}

// ownCPU is the CPU time this process has used (user and system): the client
// side of the appends, which the machine's load moves less than the wall time.
func ownCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// serverCPU is the CPU time the server's backends for the store's database have
// used (from /proc: the test server runs on this machine), false when unknown.
func serverCPU(ctx context.Context, s *postgres.Store) (time.Duration, bool) {
	rows, err := s.Pool().Query(ctx, "SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
	if err != nil {
		return 0, false
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return 0, false
	}
	var ticks int64
	for _, pid := range pids {
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(int(pid)) + "/stat")
		if err != nil {
			return 0, false
		}
		// The fields after the command name (which may hold spaces): utime and
		// stime are the 12th and 13th.
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		for _, i := range []int{11, 12} {
			n, err := strconv.ParseInt(f[i], 10, 64)
			if err != nil {
				return 0, false
			}
			ticks += n
		}
	}
	return time.Duration(ticks) * (time.Second / 100), true // USER_HZ
}

// BenchmarkEventsExist is the key finder's batched lookup (ledger's
// keyLookups): one EventsExist of 64 IDs, half of them stored, its
// allocations beside its time (they do not move with the machine's load).
//
//	go test -run '^$' -bench EventsExist -benchtime 2000x -benchmem ./eventstore/postgres/
func BenchmarkEventsExist(b *testing.B) {
	ctx := context.Background()
	s := devtest.Postgres(b)
	const n = 64
	ids := make([]uuid.UUID, n)
	parts := make([]eventstore.StreamAppend, 0, n/2)
	for i := range ids {
		ids[i] = uuid.New()
		if i%2 == 0 {
			parts = append(parts, eventstore.StreamAppend{Stream: "exist-" + uuid.NewString(), Expected: eventstore.NoStream, Events: []eventstore.EventData{{ID: ids[i], Type: "Claimed", Data: []byte(`{}`), Metadata: []byte(`{}`)}}})
		}
	}
	if _, err := s.AppendMulti(ctx, parts); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		got, err := s.EventsExist(ctx, ids)
		if err != nil {
			b.Fatal(err)
		}
		if len(got) != n/2 {
			b.Fatalf("%d of %d found, want %d", len(got), n, n/2)
		}
	}
}

// BenchmarkReadFew reads what the ledger's refreshes and the projector's and
// the publisher's polls mostly read: a read asking for thousands of events
// that finds a few (a 2-event stream, max 4,096) or none (a stream that does
// not exist). Its bytes per op are what the read allocates: they must follow
// the rows returned, not the limit asked.
func BenchmarkReadFew(b *testing.B) {
	ctx := context.Background()
	s := devtest.Postgres(b)
	stream := "account-readfew-" + uuid.NewString()
	evs := []eventstore.EventData{
		{ID: uuid.New(), Type: "Credited", Data: []byte(`{"amount":5,"currency":"EUR"}`), Metadata: []byte(`{"key":"k1"}`)},
		{ID: uuid.New(), Type: "Credited", Data: []byte(`{"amount":7,"currency":"EUR"}`), Metadata: []byte(`{"key":"k2"}`)},
	}
	if _, err := s.Append(ctx, stream, eventstore.NoStream, evs); err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct{ name, stream string }{{"events=2", stream}, {"events=0", "account-readfew-none"}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := s.ReadStream(ctx, c.stream, 0, eventstore.Forwards, 4096); err != nil && c.name == "events=2" {
					b.Fatal(err)
				}
			}
		})
	}
}
