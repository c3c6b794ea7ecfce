package postgres_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/uuid"

	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/eventstore/postgres"
	"github.com/ledgerworks/ledger/internal/pgtest"
	"github.com/ledgerworks/ledger/migrations"
)

// BenchmarkAppendMulti appends group commits of 1 and 16 commands, each command
// two parts like the ledger's: one event at the next revision of an existing
// account stream, and one to a new claim stream. One op is one AppendMulti.
func BenchmarkAppendMulti(b *testing.B) {
	ctx := context.Background()
	url := pgtest.URL(b)
	if err := migrations.Up(ctx, url); err != nil {
		b.Fatal(err)
	}
	s, err := postgres.Open(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	for _, commands := range []int{1, 16} {
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
		})
	}
}
