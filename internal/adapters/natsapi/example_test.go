package natsapi_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ledgerworks/ledger/client"
	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/adapters/natsapi"
	"github.com/ledgerworks/ledger/internal/app/reply"
	"github.com/ledgerworks/ledger/internal/platform/embednats"
)

// echo stands in for ledger.Service: it applies every well-formed command.
type echo struct{}

func (echo) HandleRaw(_ context.Context, typ string, body []byte) reply.Reply {
	cmd, ierr := domain.DecodeCommand(domain.CommandType(typ), body)
	if ierr != nil {
		return reply.Reply{Status: domain.StatusInvalid, Code: domain.CodeInvalidRequest, Message: ierr.Error()}
	}
	return reply.Reply{Status: domain.StatusApplied, Code: domain.CodeOK, IdempotencyKey: cmd.IdempotencyKey}
}

// An intake answers the ledger's subjects with a Handler's decisions (here
// echo; ledger.Service in the programs); a client (the ledger's Go client)
// sends commands to it as requests, which LEDGER_COMMANDS also stores.
func ExampleNew() {
	dir, _ := os.MkdirTemp("", "example-")
	defer os.RemoveAll(dir)
	srv, err := embednats.Start(embednats.Options{Addr: "127.0.0.1:0", StoreDir: dir})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Shutdown()
	nc, _ := nats.Connect(srv.ClientURL())
	defer nc.Close()

	in := natsapi.New(nc, echo{}, natsapi.Options{Logger: slog.New(slog.DiscardHandler)})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := in.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	defer in.Stop(ctx)

	r, err := client.New(nc).Deposit(ctx, client.Deposit{Key: "dep-1", AccountID: "alice", Amount: 1000, Currency: "EUR"})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(r.Status, r.Code, r.Key)
	// Output: applied ok dep-1
}
