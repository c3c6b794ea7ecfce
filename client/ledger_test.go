package client_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/ledgerworks/ledger/client"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/adapters/natsapi"
	"github.com/ledgerworks/ledger/internal/app/query"
	"github.com/ledgerworks/ledger/internal/platform/node"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/internal/testing/pgtest"
	"github.com/ledgerworks/ledger/projections"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// ledgerOn starts a ledger node (the intake, the command service) on ns with
// the event store st, stopped when t ends. With a database URL, it also runs
// the read side: the projector and the NATS queries.
func ledgerOn(t testing.TB, ns *server.Server, st eventstore.Store, dbURL string) *node.Node {
	t.Helper()
	opts := node.Options{
		Name: "ledger-test", Conn: devtest.Connect(t, ns), Store: st, DatabaseURL: dbURL,
		Intake: natsapi.Options{CommandTimeout: 30 * time.Second},
		Logger: slog.New(slog.DiscardHandler),
	}
	if dbURL != "" {
		opts.Runners = []node.Runner{readSide()}
	}
	n, err := node.Start(context.Background(), opts)
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
	return n
}

// readSide is the projector with the NATS queries it serves, as `ledger dev`
// runs them.
func readSide() node.Runner {
	return node.Runner{Name: "read-side", Run: func(ctx context.Context, n *node.Node) error {
		pool, err := projections.NewPool(ctx, n.DatabaseURL)
		if err != nil {
			return err
		}
		defer pool.Close()
		runner, err := projections.NewRunner(pool, n.Store, projections.Options{Logger: n.Logger})
		if err != nil {
			return err
		}
		svc := query.New(pool, query.Options{Logger: n.Logger})
		resp, err := natsapi.ServeReadQueries(n.NC, svc, natsapi.ReadQueryOptions{Queries: query.ReadModelQueries, Logger: n.Logger})
		if err != nil {
			return err
		}
		defer resp.Stop()
		return runner.Run(ctx)
	}}
}

// memoryLedger is a NATS server with a ledger on the memory store, and a
// client connection to it.
func memoryLedger(t testing.TB) (*server.Server, *nats.Conn) {
	t.Helper()
	ns := devtest.NATS(t)
	ledgerOn(t, ns, devtest.Memory(t), "")
	return ns, devtest.Connect(t, ns)
}

// relay stands between a client and a ledger on two real NATS servers: it
// forwards every request on ledger.v1.> from the client's server to the
// ledger's and the reply back, unless hold says to drop it (the command was
// decided, its answer is lost) or to keep it until released.
type relay struct {
	mu       sync.Mutex
	requests map[string]int // subject -> requests forwarded
	// drop, when set, is asked for every reply: true loses it.
	drop func(subject string, req, rep []byte) bool
	// rename, when set, forwards a request on another subject.
	rename func(subject string) string
	// before, when set, is called before the nth request on subject (from
	// 1) is forwarded, and may hold it.
	before func(subject string, n int)
	// held replies wait until release is closed.
	hold        func(subject string, req []byte) bool
	release     chan struct{}
	releaseOnce sync.Once
	dropped     atomic.Int64
}

// relayTo starts a relay from a fresh NATS server (returned with a client
// connection to it) to the ledger's server ledgerNS.
func relayTo(t testing.TB, ledgerNS *server.Server) (*relay, *nats.Conn) {
	t.Helper()
	front := devtest.NATS(t)
	in, out := devtest.Connect(t, front), devtest.Connect(t, ledgerNS)
	r := &relay{requests: map[string]int{}, release: make(chan struct{})}
	var wg sync.WaitGroup
	sub, err := in.Subscribe("ledger.v1.>", func(m *nats.Msg) {
		r.mu.Lock()
		r.requests[m.Subject]++
		n, before := r.requests[m.Subject], r.before
		drop, hold, subject := r.drop, r.hold, m.Subject
		if r.rename != nil {
			subject = r.rename(subject)
		}
		r.mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if before != nil {
				before(m.Subject, n)
			}
			rep, err := out.Request(subject, m.Data, 30*time.Second)
			if err != nil {
				return
			}
			if hold != nil && hold(m.Subject, m.Data) {
				<-r.release
			}
			if drop != nil && drop(m.Subject, m.Data, rep.Data) {
				r.dropped.Add(1)
				return
			}
			_ = m.Respond(rep.Data)
		}()
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := in.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = sub.Unsubscribe()
		r.releaseAll()
		wg.Wait()
	})
	return r, devtest.Connect(t, front)
}

func (r *relay) releaseAll() { r.releaseOnce.Do(func() { close(r.release) }) }

func (r *relay) set(drop func(subject string, req, rep []byte) bool, hold func(subject string, req []byte) bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.drop, r.hold = drop, hold
}

// count is how many requests the relay forwarded on subjects with prefix.
func (r *relay) count(prefix string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for s, c := range r.requests {
		if strings.HasPrefix(s, prefix) {
			n += c
		}
	}
	return n
}

func ctxFor(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// open opens an account and deposits into it, failing t unless both apply.
func open(t testing.TB, c *client.Client, id string, deposit int64) {
	t.Helper()
	ctx := ctxFor(t, time.Minute)
	r, err := c.OpenAccount(ctx, client.OpenAccount{Key: "open-" + id, AccountID: id, Currency: "EUR"})
	if err != nil || r.Status != client.StatusApplied {
		t.Fatalf("open %s: %+v %v", id, r, err)
	}
	if deposit > 0 {
		r, err = c.Deposit(ctx, client.Deposit{Key: "seed-" + id, AccountID: id, Amount: deposit, Currency: "EUR"})
		if err != nil || r.Status != client.StatusApplied {
			t.Fatalf("seed %s: %+v %v", id, r, err)
		}
	}
}
