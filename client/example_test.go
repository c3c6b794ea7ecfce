package client_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ledgerworks/ledger/client"
	"github.com/ledgerworks/ledger/eventstore/memory"
	"github.com/ledgerworks/ledger/internal/platform/config"
	"github.com/ledgerworks/ledger/internal/platform/embednats"
	"github.com/ledgerworks/ledger/internal/platform/node"
)

// exampleLedger starts what the examples talk to: an embedded NATS server and
// a ledger on the in-memory event store (`ledger dev` runs the same with
// PostgreSQL). It returns a connection and a function that stops it all.
func exampleLedger() (*nats.Conn, func(), error) {
	dir, err := os.MkdirTemp("", "client-example-")
	if err != nil {
		return nil, nil, err
	}
	srv, err := embednats.Start(embednats.Options{Addr: "127.0.0.1:0", StoreDir: dir})
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	quiet := slog.New(slog.DiscardHandler)
	n, err := node.Start(context.Background(), node.Options{Name: "example", NATS: config.NATS{URL: srv.ClientURL()}, Store: memory.New(), Logger: quiet})
	if err != nil {
		srv.Shutdown()
		os.RemoveAll(dir)
		return nil, nil, err
	}
	nc, err := nats.Connect(srv.ClientURL())
	stop := func() {
		if nc != nil {
			nc.Close()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = n.Stop(ctx)
		srv.Shutdown()
		srv.WaitForShutdown()
		os.RemoveAll(dir)
	}
	if err != nil {
		stop()
		return nil, nil, err
	}
	return nc, stop, nil
}

func Example() {
	nc, stop, err := exampleLedger()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer stop()

	c := client.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	if _, err := c.OpenAccount(ctx, client.OpenAccount{Key: "open-alice", AccountID: "alice", Currency: "EUR"}); err != nil {
		fmt.Println(err) // no definite answer before ctx ended: call again, same key
		return
	}
	r, err := c.Deposit(ctx, client.Deposit{Key: "dep-1", AccountID: "alice", Amount: 1000, Currency: "EUR"})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(r.Status, r.Account.Balance)

	// A refusal is a reply, not an error.
	r, _ = c.Withdraw(ctx, client.Withdraw{Key: "wd-1", AccountID: "alice", Amount: 5000, Currency: "EUR"})
	fmt.Println(r.Status, r.Code)

	// The same key again answers the original outcome: nothing moves twice.
	r, _ = c.Deposit(ctx, client.Deposit{Key: "dep-1", AccountID: "alice", Amount: 1000, Currency: "EUR"})
	fmt.Println(r.Status, r.Duplicate, r.Account.Balance)
	// Output:
	// applied 1000
	// rejected insufficient_funds
	// applied true 1000
}
