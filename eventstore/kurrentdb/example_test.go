package kurrentdb_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/google/uuid"

	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/eventstore/kurrentdb"
	"github.com/ledgerworks/ledger/eventstore/kurrentdb/kurrenttest"
)

// Open the store from a LEDGER_EVENTSTORE_URL, append with an expected revision,
// retry the same append (an idempotent answer: the original revisions) and read
// the stream back.
func ExampleOpen() {
	srv, err := kurrenttest.New() // a real server: kurrentdb://localhost:2113?tls=false
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Stop()

	ctx := context.Background()
	store, err := kurrentdb.Open(ctx, srv.URL())
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	batch := []eventstore.EventData{
		{ID: uuid.MustParse("00000000-0000-0000-0000-000000000001"), Type: "Opened", Data: []byte(`{}`)},
		{ID: uuid.MustParse("00000000-0000-0000-0000-000000000002"), Type: "Credited", Data: []byte(`{"amount":5}`)},
	}
	first, err := store.Append(ctx, "account-alice", eventstore.NoStream, batch)
	if err != nil {
		log.Fatal(err)
	}
	again, err := store.Append(ctx, "account-alice", eventstore.NoStream, batch)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(first.FirstRevision, first.LastRevision, again == first)

	// A decision made on revision 0 is stale: the stream is at 1.
	stale := eventstore.EventData{ID: uuid.MustParse("00000000-0000-0000-0000-000000000003"), Type: "Debited", Data: []byte(`{"amount":1}`)}
	_, err = store.Append(ctx, "account-alice", eventstore.Exact(0), []eventstore.EventData{stale})
	var wrong *eventstore.WrongExpectedRevisionError
	fmt.Println(errors.As(err, &wrong), wrong.Actual)

	events, err := store.ReadStream(ctx, "account-alice", 0, eventstore.Forwards, 0)
	if err != nil {
		log.Fatal(err)
	}
	for _, e := range events {
		fmt.Println(e.Revision, e.Type)
	}
	// Output:
	// 0 1 true
	// true 1
	// 0 Opened
	// 1 Credited
}
