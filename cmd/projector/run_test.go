package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/platform/freeport"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/projections"
	"github.com/ledgerworks/ledger/projections/projtest"
)

// TestRunProjectsAnswersAndStopsCleanly: `projector run`, in this process
// under a context its test cancels as SIGTERM cancels Main's, projects the
// events the ledger writes while it runs, answers ledger.v1.query.account
// over NATS and GET /v1/accounts/{id} over HTTP from them, and, its
// context cancelled, returns nil (exit status 0) within its shutdown
// timeout, every projection's live checkpoint still at the store's head
// (stopped caught up) and none of its goroutines left (its NATS connection, responders, publisher,
// HTTP server and pools all ended).
func TestRunProjectsAnswersAndStopsCleanly(t *testing.T) {
	ctx := context.Background()
	env := projtest.New(t)
	ns := devtest.NATS(t)
	nc := devtest.Connect(t, ns)
	port, err := freeport.Loopback()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	env.MustApply(t, "open_account", map[string]any{"idempotency_key": "o-a", "account_id": "a", "currency": "EUR"})

	const shutdown = 10 * time.Second
	before := goleak.IgnoreCurrent()
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- newApp().Run(runCtx, []string{"projector", "run", "--database-url", env.URL, "--eventstore-url", env.URL,
			"--nats-url", ns.ClientURL(), "--http-addr", addr, "--shutdown-timeout", shutdown.String(),
			"--poll-interval", "10ms", "--log-level", "warn", "--data-dir", t.TempDir()})
	}()

	dep := env.MustApply(t, "deposit", map[string]any{"idempotency_key": "d-a", "account_id": "a", "amount": 250, "currency": "EUR"})
	if acc := queryNATS(t, nc, done, "a", dep.Position); acc["balance"] != float64(250) || acc["account_id"] != "a" {
		t.Fatalf("ledger.v1.query.account at %s: %v, want account a with a balance of 250", dep.Position, acc)
	}
	if acc := queryHTTP(t, addr, done, "a", dep.Position); acc["balance"] != float64(250) || acc["account_id"] != "a" {
		t.Fatalf("GET /v1/accounts/a at %s: %v, want account a with a balance of 250", dep.Position, acc)
	}

	head, err := env.Store.Head(ctx)
	if err != nil {
		t.Fatal(err)
	}
	devtest.Await(t, time.Minute, func() error { return liveAt(ctx, env.Pool, head) })

	cancel() // a stop mid-batch would roll that batch back, to be applied again: the test stops it caught up
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("projector run, its context cancelled: %v, want nil (exit 0)", err)
		}
	case <-time.After(shutdown + time.Minute):
		t.Fatalf("projector run did not return within its shutdown timeout (%s) and a minute after its context was cancelled", shutdown)
	}
	if err := liveAt(ctx, env.Pool, head); err != nil {
		t.Fatalf("after the stop: %v", err)
	}
	// The test's own NATS connection and server go first: the server's
	// goroutines (LEDGER_EVENTS's loops among them) are not the program's,
	// and a connection of the program left open would go on reconnecting.
	nc.Close()
	ns.Shutdown()
	ns.WaitForShutdown()
	devtest.Await(t, time.Minute, func() error { return goleak.Find(before) })
}

// queryNATS asks ledger.v1.query.account for id at minPosition until the
// projector's responders answer (failing t should run end first).
func queryNATS(t *testing.T, nc *nats.Conn, run <-chan error, id, minPosition string) map[string]any {
	t.Helper()
	req, _ := json.Marshal(map[string]any{"account_id": id, "min_position": minPosition})
	var acc map[string]any
	devtest.Await(t, time.Minute, func() error {
		ended(t, run)
		msg, err := nc.Request("ledger.v1.query.account", req, 10*time.Second)
		if err != nil {
			return err // no responders yet
		}
		acc = nil
		return json.Unmarshal(msg.Data, &acc)
	})
	return acc
}

// queryHTTP gets /v1/accounts/{id} at minPosition from the projector at
// addr once it listens, on a connection of its own (none kept alive).
func queryHTTP(t *testing.T, addr string, run <-chan error, id, minPosition string) map[string]any {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}
	u := fmt.Sprintf("http://%s/v1/accounts/%s?min_position=%s", addr, url.PathEscape(id), url.QueryEscape(minPosition))
	var acc map[string]any
	devtest.Await(t, time.Minute, func() error {
		ended(t, run)
		resp, err := client.Get(u)
		if err != nil {
			return err // not listening yet
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %s: %s", u, resp.Status, body)
		}
		acc = nil
		return json.Unmarshal(body, &acc)
	})
	return acc
}

// ended fails t if run has ended: the program stopped before it answered.
func ended(t *testing.T, run <-chan error) {
	t.Helper()
	select {
	case err := <-run:
		t.Fatalf("projector run ended before it answered: %v", err)
	default:
	}
}

// liveAt says whether every projection's live checkpoint is at head.
func liveAt(ctx context.Context, pool *pgxpool.Pool, head eventstore.Position) error {
	live, err := projections.Checkpoints.LiveByName(ctx, pool)
	if err != nil {
		return err
	}
	for _, name := range projections.Names {
		if pos, ok := live[name]; !ok || pos != head {
			return fmt.Errorf("%s's live checkpoint is %v (stored: %v), not the head %v", name, pos, ok, head)
		}
	}
	return nil
}
