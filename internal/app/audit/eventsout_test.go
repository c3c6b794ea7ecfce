package audit_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
	"github.com/ledgerworks/ledger/projections"
	"github.com/ledgerworks/ledger/projections/projtest"
)

// eventsOutEnv is a workload published to LEDGER_EVENTS at 3 replicas on a
// 3-node JetStream cluster.
func eventsOutEnv(t *testing.T) (*projtest.Env, *nats.Conn, jetstream.JetStream, *projections.Publisher) {
	t.Helper()
	env := projtest.New(t)
	cluster, _ := devtest.NATSCluster(t)
	nc := devtest.ConnectURL(t, cluster.URL())
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	env.Run(t, projtest.Workload{Commands: 60, Seed: 8})
	// A short duplicate window, so that a repair of a deleted message is not
	// withheld for two minutes.
	pub, err := projections.NewPublisher(env.Pool, env.Store, nc, projections.PublisherOptions{Replicas: 3, Duplicates: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	devtest.CatchUp(t, pub)
	return env, nc, js, pub
}

func auditEventsOut(t *testing.T, env *projtest.Env, js jetstream.JetStream, repair bool) (*audit.Report, error) {
	t.Helper()
	rep, err := audit.Run(context.Background(), env.Store, audit.Options{ReadModels: env.Pool,
		EventsOut: &audit.EventsOutOptions{JS: js, Repair: repair, Page: 16}})
	if rep != nil && rep.EventsOut != nil {
		t.Logf("events out: %+v; violations: %v", *rep.EventsOut, rep.Violations)
	}
	return rep, err
}

// TestAuditEventsOutFindsAndRepairsAGap: on LEDGER_EVENTS at 3 replicas, the
// audit passes; a message deleted from the middle of the stream (a gap, as
// JetStream loses acknowledged messages when several nodes crash) fails it,
// naming the event; --repair is refused while the publisher holds its lease,
// then republishes it under its ID, and the audit passes again, and so does it
// after the publisher goes on past the repaired message. (A repair beside a
// running publisher left its next round's first event out: the audit named it.)
// A message of an event the store does not hold fails it too.
func TestAuditEventsOutFindsAndRepairsAGap(t *testing.T) {
	env, _, js, pub := eventsOutEnv(t)
	ctx := context.Background()
	rep, err := auditEventsOut(t, env, js, false)
	if err != nil {
		t.Fatal(err)
	}
	stored := devtest.ReadAll(t, env.Store)
	if !rep.OK() || rep.EventsOut.Replicas != 3 || rep.EventsOut.Matched != int64(len(stored)) {
		t.Fatalf("clean stream: ok %v, %+v, %d stored", rep.OK(), *rep.EventsOut, len(stored))
	}

	s, err := js.Stream(ctx, projections.EventsStream)
	if err != nil {
		t.Fatal(err)
	}
	const deleted = 7
	if err := s.DeleteMsg(ctx, deleted); err != nil {
		t.Fatal(err)
	}
	rep, err = auditEventsOut(t, env, js, false)
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK() || !rep.Has(audit.InvEventsOut, "missing") || rep.Violations[0].EventID != stored[deleted-1].ID.String() || rep.EventsOut.Missing != 1 {
		t.Fatalf("a gap at message %d (event %s) passed or was not named: %v", deleted, stored[deleted-1].ID, rep.Violations)
	}

	if _, err := auditEventsOut(t, env, js, true); !errors.Is(err, audit.ErrRepairNeedsLease) {
		t.Fatalf("repair beside a publisher holding the lease: %v", err)
	}
	pub.Close()
	// The stream's duplicate window remembers the deleted message's ID for a
	// second: the repair is withheld until it has passed.
	devtest.Eventually(t, 30*time.Second, "the repair republishes the missing event", func() bool {
		rep, err := auditEventsOut(t, env, js, true)
		if err != nil {
			t.Fatal(err)
		}
		return rep.EventsOut.Republished == 1
	})
	rep, err = auditEventsOut(t, env, js, false)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() || rep.EventsOut.Filled != 1 || rep.EventsOut.Missing != 0 {
		t.Fatalf("after the repair: ok %v, %+v", rep.OK(), *rep.EventsOut)
	}

	// The publisher takes the lease again, reads the stream and goes on after
	// the repaired message.
	env.Run(t, projtest.Workload{Commands: 20, Seed: 9, Prefix: "more"})
	devtest.CatchUp(t, pub)
	rep, err = auditEventsOut(t, env, js, false)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() || rep.EventsOut.Duplicates != 0 || rep.EventsOut.Pending != 0 {
		t.Fatalf("the publisher after a repair: ok %v, %+v", rep.OK(), *rep.EventsOut)
	}

	unstored, err := json.Marshal(projections.EventMessage{ID: uuid.New(), Stream: "account-ghost", Position: stored[3].Position.String(), Type: "Credited", Data: json.RawMessage(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg(projections.EventSubject("account-ghost", "Credited"))
	m.Data = unstored
	if _, err := js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	rep, err = auditEventsOut(t, env, js, false)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Has(audit.InvEventsOut, "unstored") || !rep.Has(audit.InvEventsOut, "msg_id_mismatch") {
		t.Fatalf("a message of an event the store does not hold passed: %v", rep.Violations)
	}
}

// TestAuditEventsOutRefusesARepairBehindTheStream: a repair while the stream
// holds events after the publisher's checkpoint would send the publisher back.
func TestAuditEventsOutRefusesARepairBehindTheStream(t *testing.T) {
	env, _, js, pub := eventsOutEnv(t)
	pub.Close()
	ctx := context.Background()
	s, err := js.Stream(ctx, projections.EventsStream)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteMsg(ctx, 3); err != nil {
		t.Fatal(err)
	}
	stored := devtest.ReadAll(t, env.Store)
	if _, err := env.Pool.Exec(ctx, "UPDATE readmodel.publisher_checkpoints SET commit_position = $1, prepare_position = $2",
		int64(stored[10].Position.Commit), int64(stored[10].Position.Prepare)); err != nil {
		t.Fatal(err)
	}
	if _, err := auditEventsOut(t, env, js, true); !errors.Is(err, audit.ErrRepairCheckpointBehind) {
		t.Fatalf("repair behind the stream: %v", err)
	}
}
