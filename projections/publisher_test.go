package projections_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/internal/testing/devtest"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/app/audit"
	"github.com/ledgerworks/ledger/projections"
	"github.com/ledgerworks/ledger/projections/projtest"
)

// publisherEnv is a database with a workload posted, and a NATS server.
func publisherEnv(t *testing.T, commands int, seed uint64) (*projtest.Env, *nats.Conn) {
	t.Helper()
	env := projtest.New(t)
	ns := devtest.NATS(t)
	env.Run(t, projtest.Workload{Commands: commands, Seed: seed})
	return env, devtest.Connect(t, ns)
}

func newPublisher(t *testing.T, env *projtest.Env, nc *nats.Conn, opts projections.PublisherOptions) *projections.Publisher {
	t.Helper()
	p, err := projections.NewPublisher(env.Pool, env.Store, nc, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close) // its lease's connection goes back before the pool closes
	return p
}

// publishAll steps a publisher until a round publishes nothing, retrying
// failures (a NATS restart) but the loss of its lease, for up to a minute.
func publishAll(t *testing.T, p *projections.Publisher) {
	t.Helper()
	devtest.CatchUpRetrying(t, p, func(err error) bool { return !errors.Is(err, projections.ErrNoLease) })
}

// leaseEnded waits (a poll of leaseHeld, up to a minute) until no session
// holds the publisher's lease: a publisher gives it up by closing its
// session (Close, or Run's end), and the server ends that session, which
// releases the lock, only after the client has gone; a publisher that tries
// before then is refused (ErrNoLease), as it should be.
func leaseEnded(t *testing.T, env *projtest.Env) {
	t.Helper()
	devtest.Await(t, time.Minute, func() error {
		held, err := leaseHeld(env)
		if err == nil && held {
			err = errors.New("the publisher's lease is still held")
		}
		return err
	})
}

// leaseHeld reports whether a session holds the publisher's lease (its
// advisory lock, a bigint key: classid its high half, objid its low).
func leaseHeld(env *projtest.Env) (bool, error) {
	var held bool
	err := env.Pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT FROM pg_locks l JOIN readmodel.publisher_checkpoints c
		ON l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND ((l.classid::bigint << 32) | l.objid::bigint) = c.lease_key
		WHERE c.name = 'events' AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()))`).Scan(&held)
	return held, err
}

// streamMessages reads every message of LEDGER_EVENTS, in stream order.
func streamMessages(t testing.TB, nc *nats.Conn) []*jetstream.RawStreamMsg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, projections.EventsStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("message %d: %v", seq, err)
		}
		out = append(out, m)
	}
	return out
}

// wantPublished: LEDGER_EVENTS is whole by the audit's events-out check (the
// one home of "every stored event up to the publisher's checkpoint once, in
// order, none unstored"), nothing is stored after the checkpoint, and each
// message carries its event with the body and subject PROTOCOL.md §4.1 names.
func wantPublished(tb testing.TB, env *projtest.Env, nc *nats.Conn) {
	tb.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	found, err := audit.EventsOut(context.Background(), env.Store, env.Pool, audit.EventsOutOptions{JS: js})
	if err != nil {
		tb.Fatal(err)
	}
	rep, violations := found.Report, found.Violations
	if len(violations) > 0 || rep.Pending > 0 {
		tb.Fatalf("LEDGER_EVENTS: %d pending after the checkpoint, violations %+v", rep.Pending, violations)
	}
	stored := map[uuid.UUID]eventstore.RecordedEvent{}
	for _, re := range devtest.ReadAll(tb, env.Store) {
		stored[re.ID] = re
	}
	for _, m := range streamMessages(tb, nc) {
		var body projections.EventMessage
		if err := json.Unmarshal(m.Data, &body); err != nil {
			tb.Fatalf("message %d: %v", m.Sequence, err)
		}
		re := stored[body.ID]
		if body.Stream != re.Stream || body.Revision != re.Revision || body.Type != re.Type || body.Position != re.Position.String() ||
			string(body.Data) != string(re.Data) || m.Subject != projections.EventSubject(re.Stream, re.Type) {
			tb.Fatalf("message %d (%s@%d) does not carry its event: %+v on %s", m.Sequence, re.Stream, re.Revision, body, m.Subject)
		}
	}
}

// TestPublisherPublishesEveryEventOnceInOrder: every stored event reaches
// LEDGER_EVENTS once, in order, with its ID as Nats-Msg-Id; the checkpoint
// follows; a publisher whose checkpoint row was lost (a crash between the
// acknowledgements and the checkpoint) resumes after the stream's last message
// and publishes nothing twice.
func TestPublisherPublishesEveryEventOnceInOrder(t *testing.T) {
	env, nc := publisherEnv(t, 150, 1)
	p := newPublisher(t, env, nc, projections.PublisherOptions{BatchSize: 64})
	publishAll(t, p)
	p.Close()
	leaseEnded(t, env)
	stored := devtest.ReadAll(t, env.Store)
	wantPublished(t, env, nc)
	if got := p.Position(); got != stored[len(stored)-1].Position {
		t.Fatalf("publisher at %s, store's last event at %s", got, stored[len(stored)-1].Position)
	}

	// The checkpoint row goes back to the start; a new publisher trusts the stream.
	if _, err := env.Pool.Exec(context.Background(), `UPDATE readmodel.publisher_checkpoints SET commit_position = 0, prepare_position = 0`); err != nil {
		t.Fatal(err)
	}
	env.Run(t, projtest.Workload{Commands: 40, Seed: 2, Prefix: "v"})
	p2 := newPublisher(t, env, nc, projections.PublisherOptions{BatchSize: 64})
	publishAll(t, p2)
	stored = devtest.ReadAll(t, env.Store)
	msgs := streamMessages(t, nc)
	if len(msgs) != len(stored) {
		t.Fatalf("%d messages for %d events: the new publisher published again", len(msgs), len(stored))
	}
	wantPublished(t, env, nc)
}

// TestPublisherRecordsWhatTheStreamHolds: a round whose checkpoint failed
// after its events were published leaves the stream ahead of the checkpoint; a
// publisher that takes the lease then records what the stream holds, events
// counted, though nothing new comes to publish (it used to wait for a new
// event, and the chaos suite's PostgreSQL restart waited 20 s with it).
func TestPublisherRecordsWhatTheStreamHolds(t *testing.T) {
	env, nc := publisherEnv(t, 30, 4)
	p := newPublisher(t, env, nc, projections.PublisherOptions{BatchSize: 16})
	publishAll(t, p)
	p.Close()
	leaseEnded(t, env)
	stored := devtest.ReadAll(t, env.Store)
	want := publisherRow(t, env)
	back := stored[len(stored)-8].Position // the last round's 7 events not counted
	if _, err := env.Pool.Exec(context.Background(), `UPDATE readmodel.publisher_checkpoints SET commit_position = $1, prepare_position = $2, events = events - 7`,
		int64(back.Commit), int64(back.Prepare)); err != nil {
		t.Fatal(err)
	}
	p2 := newPublisher(t, env, nc, projections.PublisherOptions{BatchSize: 16})
	if n, err := p2.Step(context.Background()); err != nil || n != 0 {
		t.Fatalf("a round with nothing new: %d published, %v", n, err)
	}
	if got := publisherRow(t, env); got != want {
		t.Fatalf("checkpoint %s after the new publisher's first round, want %s", got, want)
	}
	if msgs := streamMessages(t, nc); len(msgs) != len(stored) {
		t.Fatalf("%d messages for %d events", len(msgs), len(stored))
	}
}

// TestPublisherCheckerFindsAGap: the check used above fails when a message of
// the stream is gone.
func TestPublisherCheckerFindsAGap(t *testing.T) {
	env, nc := publisherEnv(t, 20, 3)
	publishAll(t, newPublisher(t, env, nc, projections.PublisherOptions{}))
	wantPublished(t, env, nc)
	msgs := streamMessages(t, nc)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(context.Background(), projections.EventsStream)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteMsg(context.Background(), msgs[5].Sequence); err != nil {
		t.Fatal(err)
	}
	t.Log(devtest.Failure(t, func(tb testing.TB) { wantPublished(tb, env, nc) }))
}

// TestPublisherSurvivesNATSRestart: NATS restarts (same JetStream directory)
// while the publisher runs and commands flow; at the end every event is
// published once, in order.
func TestPublisherSurvivesNATSRestart(t *testing.T) {
	env := projtest.New(t)
	dir := t.TempDir()
	ns := devtest.NATSAt(t, "127.0.0.1:0", dir)
	addr := ns.Addr().String()
	nc := devtest.Connect(t, ns, nats.ReconnectWait(50*time.Millisecond))
	p := newPublisher(t, env, nc, projections.PublisherOptions{BatchSize: 32, MinBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond, AckTimeout: time.Second})
	run := devtest.Go(t, p.Run)
	env.Run(t, projtest.Workload{Commands: 100, Seed: 4})
	ns.Shutdown()
	ns.WaitForShutdown()
	env.Run(t, projtest.Workload{Commands: 100, Seed: 5, Prefix: "v"})
	devtest.NATSAt(t, addr, dir)
	env.Run(t, projtest.Workload{Commands: 100, Seed: 6, Prefix: "u"})
	stored := devtest.ReadAll(t, env.Store)
	last := stored[len(stored)-1].Position
	devtest.Await(t, time.Minute, func() error {
		if at := p.Position(); at != last {
			return fmt.Errorf("publisher at %s, the store's last event at %s", at, last)
		}
		return nil
	})
	if err := run.Stop(); err != nil {
		t.Fatal(err)
	}
	wantPublished(t, env, nc)
}

// TestPublisherLease: of two publishers, one publishes; the other waits for the
// lease and takes over when the first one's session ends.
func TestPublisherLease(t *testing.T) {
	env, nc := publisherEnv(t, 30, 7)
	a := newPublisher(t, env, nc, projections.PublisherOptions{})
	b := newPublisher(t, env, nc, projections.PublisherOptions{})
	publishAll(t, a)
	if _, err := b.Step(context.Background()); !errors.Is(err, projections.ErrNoLease) {
		t.Fatalf("second publisher: %v, want ErrNoLease", err)
	}
	if held, err := leaseHeld(env); !held || err != nil { // what leaseEnded waits on sees a's lease
		t.Fatalf("a holds the lease, leaseHeld says %v (%v)", held, err)
	}
	if err := devtest.Go(t, a.Run).Stop(); err != nil { // a's Run ends and gives up the lease
		t.Fatal(err)
	}
	leaseEnded(t, env)
	env.Run(t, projtest.Workload{Commands: 30, Seed: 8, Prefix: "v"})
	publishAll(t, b)
	wantPublished(t, env, nc)
}

// TestRebuildNeverRepublishes: a rebuild of the read models leaves the
// publisher's checkpoint alone, and a publisher after it publishes nothing again.
func TestRebuildNeverRepublishes(t *testing.T) {
	env, nc := publisherEnv(t, 40, 9)
	p := newPublisher(t, env, nc, projections.PublisherOptions{})
	publishAll(t, p)
	p.Close()
	leaseEnded(t, env)
	before := publisherRow(t, env)
	if _, err := rebuild(t, env, projections.RebuildOptions{}); err != nil {
		t.Fatal(err)
	}
	if after := publisherRow(t, env); after != before {
		t.Fatalf("publisher checkpoint %q after the rebuild, %q before", after, before)
	}
	publishAll(t, newPublisher(t, env, nc, projections.PublisherOptions{}))
	stored, msgs := devtest.ReadAll(t, env.Store), streamMessages(t, nc)
	if len(msgs) != len(stored) {
		t.Fatalf("%d messages for %d events after a rebuild", len(msgs), len(stored))
	}
}

func publisherRow(t *testing.T, env *projtest.Env) string {
	t.Helper()
	var c, p, n int64
	if err := env.Pool.QueryRow(context.Background(), `SELECT commit_position, prepare_position, events FROM readmodel.publisher_checkpoints WHERE name = 'events'`).Scan(&c, &p, &n); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%d/%d (%d events)", c, p, n)
}
