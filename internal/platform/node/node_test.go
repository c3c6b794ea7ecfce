package node_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ledgerworks/ledger/client"
	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore/kurrentdb/kurrenttest"
	"github.com/ledgerworks/ledger/internal/adapters/natsapi"
	"github.com/ledgerworks/ledger/internal/app/reply"
	"github.com/ledgerworks/ledger/internal/platform/config"
	"github.com/ledgerworks/ledger/internal/platform/node"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/internal/testing/pgtest"
	"github.com/ledgerworks/ledger/projections/projtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type command = devtest.Command

var cmd = devtest.NewCommand

func send(t *testing.T, nc *nats.Conn, c command) reply.Reply {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lc := client.New(nc, client.WithoutBatching())
	defer lc.Close()
	r, err := devtest.Send(ctx, lc, c)
	if err != nil {
		t.Errorf("%s %s: %v", c.Type, c.Key, err)
	}
	return r
}

// Two instances on one NATS (same queue group, a connection each) and one
// PostgreSQL; every command is sent twice at once, from two clients, so that the
// queue group often hands the two copies to different instances.
func TestTwoInstancesApplyEveryKeyOnce(t *testing.T) {
	ns := devtest.NATS(t)
	dbURL := devtest.DatabaseURL(t)
	quiet := slog.New(slog.DiscardHandler)
	var nodes []*node.Node
	for i := range 2 {
		n, err := node.Start(context.Background(), node.Options{
			Name:          fmt.Sprintf("ledger-%d", i),
			NATS:          config.NATS{URL: ns.ClientURL()},
			EventStoreURL: dbURL,
			HTTPAddr:      "127.0.0.1:0",
			Logger:        quiet,
		})
		if err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, n)
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := n.Stop(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	clients := []*nats.Conn{devtest.Connect(t, ns), devtest.Connect(t, ns)}

	const accounts = 10
	const initial = 1_000_000
	balance := map[string]int64{}
	for i := range accounts {
		id := fmt.Sprintf("acc-%d", i)
		for _, c := range []command{
			cmd("open_account", map[string]any{"idempotency_key": "open-" + id, "account_id": id, "currency": "EUR"}),
			cmd("deposit", map[string]any{"idempotency_key": "seed-" + id, "account_id": id, "amount": initial, "currency": "EUR"}),
		} {
			if r := send(t, clients[0], c); r.Status != domain.StatusApplied {
				t.Fatalf("%s: %+v", c.Key, r)
			}
		}
		balance[id] = initial
	}

	rnd := rand.New(rand.NewPCG(1, 2))
	var cmds []command
	for i := range 200 {
		ai := rnd.IntN(accounts)
		a := fmt.Sprintf("acc-%d", ai)
		amount := int64(1 + rnd.IntN(1000))
		switch i % 4 {
		case 0, 1:
			cmds = append(cmds, cmd("deposit", map[string]any{"idempotency_key": fmt.Sprintf("dep-%d", i), "account_id": a, "amount": amount, "currency": "EUR"}))
			balance[a] += amount
		case 2:
			cmds = append(cmds, cmd("withdraw", map[string]any{"idempotency_key": fmt.Sprintf("wd-%d", i), "account_id": a, "amount": amount, "currency": "EUR"}))
			balance[a] -= amount
		case 3:
			b := fmt.Sprintf("acc-%d", (ai+1+rnd.IntN(accounts-1))%accounts)
			cmds = append(cmds, cmd("transfer", map[string]any{"idempotency_key": fmt.Sprintf("tr-%d", i), "transfer_id": fmt.Sprintf("t-%d", i), "from": a, "to": b, "amount": amount, "currency": "EUR"}))
			balance[a] -= amount
			balance[b] += amount
		}
	}

	replies := make([][2]reply.Reply, len(cmds))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i, c := range cmds {
		for j := range 2 {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer func() { <-sem; wg.Done() }()
				replies[i][j] = send(t, clients[j], c)
			}()
		}
	}
	wg.Wait()
	for i, c := range cmds {
		a, b := replies[i][0], replies[i][1]
		if a.Status != domain.StatusApplied || b.Status != domain.StatusApplied {
			t.Fatalf("%s: replies %+v / %+v", c.Key, a, b)
		}
		if !slices.Equal(a.Events, b.Events) {
			t.Fatalf("%s: the two replies name different events: %+v / %+v", c.Key, a.Events, b.Events)
		}
	}
	// Both instances took part.
	for i, n := range nodes {
		handled := answered(t, n, natsapi.SourceRequest)
		if handled < 0.2*float64(2*len(cmds)) {
			t.Errorf("instance %d answered only %v of %d requests", i, handled, 2*len(cmds))
		}
	}

	store := nodes[0].Store
	projtest.AuditOK(t, store, nil) // among the invariants: every key decided once, every event ID unique
	for id, want := range balance {
		if got := devtest.Account(t, store, id).Balance; got != want {
			t.Errorf("%s: balance %d, want %d", id, got, want)
		}
	}

	// The operational endpoints answer.
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		resp, err := http.Get(nodes[0].HTTPURL() + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("%s: %d %s", path, resp.StatusCode, b)
		}
		for _, metric := range []string{"ledger_commands_total", "ledger_account_cache_bytes", "ledger_group_commit_batch_commands"} {
			if path == "/metrics" && !strings.Contains(string(b), metric) {
				t.Errorf("/metrics lacks %s", metric) // the intake's, and the command service's (ledger.Options.Metrics)
			}
		}
	}
}

// answered sums ledger_commands_total of one source on n.
func answered(t *testing.T, n *node.Node, source string) float64 {
	t.Helper()
	mfs, err := n.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != "ledger_commands_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "source" && l.GetValue() == source {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}

// The same node on the KurrentDB backend (an in-process emulation of its gRPC API),
// selected by the event store URL's scheme.
func TestNodeOnKurrentDB(t *testing.T) {
	ns := devtest.NATS(t)
	_, kurrentURL := kurrenttest.Start(t)
	n, err := node.Start(context.Background(), node.Options{
		NATS:          config.NATS{URL: ns.ClientURL()},
		EventStoreURL: kurrentURL,
		Logger:        slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := n.Stop(ctx); err != nil {
			t.Error(err)
		}
	})
	nc := devtest.Connect(t, ns)
	open := cmd("open_account", map[string]any{"idempotency_key": "open-k", "account_id": "k", "currency": "EUR"})
	dep := cmd("deposit", map[string]any{"idempotency_key": "dep-k", "account_id": "k", "amount": 42, "currency": "EUR"})
	for _, c := range []command{open, dep} {
		if r := send(t, nc, c); r.Status != domain.StatusApplied || r.Duplicate {
			t.Fatalf("%s: %+v", c.Key, r)
		}
	}
	if r := send(t, nc, dep); !r.Duplicate || r.Account == nil || r.Account.Balance != 42 {
		t.Fatalf("resend: %+v", r)
	}
	projtest.AuditOK(t, n.Store, nil)
}
