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
// PostgreSQL). It returns a connection and a function that stops it all; it
// panics when something cannot start (the example cannot run then).
func exampleLedger() (*nats.Conn, func()) {
	nc, stop, err := startExampleLedger()
	if err != nil {
		panic(err)
	}
	return nc, stop
}

func startExampleLedger() (*nats.Conn, func(), error) {
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
	nc, stop := exampleLedger()
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

// A batch: many commands in one request, each with its own key and reply.
func ExampleClient_Batch() {
	nc, stop := exampleLedger()
	defer stop()
	c := client.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	br, err := c.Batch(ctx, []client.Command{
		client.OpenAccount{Key: "open-shop", AccountID: "shop", Currency: "EUR"},
		client.Deposit{Key: "sale-1", AccountID: "shop", Amount: 500, Currency: "EUR"},
		client.Withdraw{Key: "payout-1", AccountID: "shop", Amount: 900, Currency: "EUR"},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, r := range br.Replies {
		fmt.Println(r.Key, r.Status, r.Code)
	}
	// Output:
	// open-shop applied ok
	// sale-1 applied ok
	// payout-1 rejected insufficient_funds
}

// An atomic batch: all of it or none of it, under the batch's own key. Here
// the payout is refused, so neither the sale nor the payout applies; the
// same batch sent again answers the same, duplicate.
func ExampleAtomic() {
	nc, stop := exampleLedger()
	defer stop()
	c := client.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	if _, err := c.OpenAccount(ctx, client.OpenAccount{Key: "open-shop", AccountID: "shop", Currency: "EUR"}); err != nil {
		fmt.Println(err)
		return
	}
	cmds := []client.Command{
		client.Deposit{Key: "sale-1", AccountID: "shop", Amount: 500, Currency: "EUR"},
		client.Withdraw{Key: "payout-1", AccountID: "shop", Amount: 900, Currency: "EUR"},
	}
	for range 2 {
		br, err := c.Batch(ctx, cmds, client.Atomic("settle-1"))
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(br.Status, br.Code, *br.Index, br.Duplicate, br.Replies[0].Code)
	}
	// Without the payout, the batch applies (under a new key: settle-1 is decided).
	br, _ := c.Batch(ctx, cmds[:1], client.Atomic("settle-2"))
	fmt.Println(br.Status, br.Replies[0].Account.Balance)
	// Output:
	// rejected insufficient_funds 1 false linked_event_failed
	// rejected insufficient_funds 1 true linked_event_failed
	// applied 500
}

// A sweep and a conditional write (v1.2 §2.3): UpTo makes the amount a
// maximum, and Moved says what the ledger moved; ExpectedRevision applies a
// write only on the revision the client read, else CodeRevisionMismatch
// (recorded: the revision moves on).
func ExampleWithdraw_upTo() {
	nc, stop := exampleLedger()
	defer stop()
	c := client.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	if _, err := c.OpenAccount(ctx, client.OpenAccount{Key: "open-shop", AccountID: "shop", Currency: "EUR"}); err != nil {
		fmt.Println(err)
		return
	}
	r, err := c.Deposit(ctx, client.Deposit{Key: "sale-1", AccountID: "shop", Amount: 730, Currency: "EUR"})
	if err != nil {
		fmt.Println(err)
		return
	}
	read := int64(r.Account.Revision)
	r, _ = c.Withdraw(ctx, client.Withdraw{Key: "payout-1", AccountID: "shop", Amount: 1_000_000, Currency: "EUR", UpTo: true})
	fmt.Println(r.Status, *r.Moved, r.Account.Balance)

	r, _ = c.Deposit(ctx, client.Deposit{Key: "sale-2", AccountID: "shop", Amount: 5, Currency: "EUR", ExpectedRevision: &read})
	fmt.Println(r.Status, r.Code)
	// Output:
	// applied 730 0
	// rejected revision_mismatch
}
