package natsapi

import (
	"context"
	"encoding/json"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/app/reply"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// handlerFunc adapts a function to Handler.
type handlerFunc func(ctx context.Context, typ string, body []byte) reply.Reply

func (f handlerFunc) HandleRaw(ctx context.Context, typ string, body []byte) reply.Reply {
	return f(ctx, typ, body)
}

// startIntake starts an intake with h and returns a client connection.
func startIntake(t *testing.T, h Handler, opts Options) *nats.Conn {
	t.Helper()
	ns := devtest.NATS(t)
	nc := devtest.Connect(t, ns)
	opts.Logger = slog.New(slog.DiscardHandler)
	in := New(devtest.Connect(t, ns), h, opts)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := in.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := in.Stop(ctx); err != nil {
			t.Error(err)
		}
	})
	return nc
}

func jsOf(t *testing.T, nc *nats.Conn) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// An infrastructure failure is nak'ed and retried; when deliveries run out the
// message goes to the DLQ with reason max_deliveries.
func TestInfrastructureFailureIsRetriedThenDeadLettered(t *testing.T) {
	var calls atomic.Int32
	h := handlerFunc(func(ctx context.Context, typ string, body []byte) reply.Reply {
		calls.Add(1)
		return reply.Reply{Status: domain.StatusError, Code: domain.CodeInternalError, Message: "store down"}
	})
	nc := startIntake(t, h, Options{Grace: -1, BackOff: []time.Duration{300 * time.Millisecond}, MaxDeliver: 3})
	js := jsOf(t, nc)
	ctx := context.Background()
	// A plain publish (no reply subject): only the consumer handles it.
	if err := nc.Publish(CommandSubject("deposit"), []byte(`{"idempotency_key":"k"}`)); err != nil {
		t.Fatal(err)
	}
	dlq, err := js.Stream(ctx, DLQStreamName)
	if err != nil {
		t.Fatal(err)
	}
	devtest.Eventually(t, 20*time.Second, "dead letter after 3 deliveries", func() bool {
		info, err := dlq.Info(ctx)
		return err == nil && info.State.Msgs == 1
	})
	m, err := dlq.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if m.Header.Get(HeaderDLQReason) != "max_deliveries" || m.Header.Get(HeaderDLQDeliveries) != "3" || m.Header.Get(HeaderDLQStreamSeq) != "1" {
		t.Fatalf("headers %v", m.Header)
	}
	if n := calls.Load(); n != 3 {
		t.Fatalf("handled %d times, want 3", n)
	}
}

// A command that outlives AckWait is kept by in-progress: it is not redelivered.
func TestLongCommandIsNotRedelivered(t *testing.T) {
	var calls atomic.Int32
	release := make(chan struct{})
	h := handlerFunc(func(ctx context.Context, typ string, body []byte) reply.Reply {
		calls.Add(1)
		<-release
		return reply.Reply{Status: domain.StatusApplied, Code: domain.CodeOK}
	})
	// AckWait 1.2 s: in-progress goes every 400 ms, so a loaded machine may stall
	// a beat by 800 ms before the message is redelivered.
	nc := startIntake(t, h, Options{Grace: -1, BackOff: []time.Duration{1200 * time.Millisecond}})
	js := jsOf(t, nc)
	ctx := context.Background()
	if err := nc.Publish(CommandSubject("deposit"), []byte(`{"idempotency_key":"slow"}`)); err != nil {
		t.Fatal(err)
	}
	devtest.Eventually(t, 10*time.Second, "handler called", func() bool { return calls.Load() == 1 })
	time.Sleep(3 * time.Second) // two and a half AckWaits: the time to be redelivered, not a synchronisation
	close(release)
	cons, err := js.Consumer(ctx, StreamName, DefaultDurable)
	if err != nil {
		t.Fatal(err)
	}
	devtest.Eventually(t, 10*time.Second, "acked", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending == 0 && info.AckFloor.Stream == 1
	})
	if n := calls.Load(); n != 1 {
		t.Fatalf("handled %d times: redelivered while in progress", n)
	}
}

// The request-reply path bounds the commands in flight.
func TestInFlightIsBounded(t *testing.T) {
	var cur, peak atomic.Int32
	h := handlerFunc(func(ctx context.Context, typ string, body []byte) reply.Reply {
		n := cur.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		time.Sleep(20 * time.Millisecond)
		cur.Add(-1)
		return reply.Reply{Status: domain.StatusApplied, Code: domain.CodeOK}
	})
	ns := devtest.NATS(t)
	in := New(devtest.Connect(t, ns), h, Options{MaxInFlight: 3, DisableJetStream: true, Logger: slog.New(slog.DiscardHandler)})
	if err := in.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer in.Stop(context.Background())
	nc := devtest.Connect(t, ns)
	var wg sync.WaitGroup
	for i := range 30 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if _, err := nc.RequestWithContext(ctx, CommandSubject("deposit"), []byte(`{"idempotency_key":"`+strconv.Itoa(i)+`"}`)); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if p := peak.Load(); p > 3 || p < 2 {
		t.Fatalf("peak in flight %d, want at most 3 (and some parallelism)", p)
	}
}

// A js.Publish reaches the request-reply path too; whichever answers first, the
// stream's PubAck or the ledger's reply, the publisher gets a valid ack.
func TestJetStreamPublisherAcceptsTheLedgerReplyAsItsAck(t *testing.T) {
	h := handlerFunc(func(ctx context.Context, typ string, body []byte) reply.Reply {
		if typ == "withdraw" {
			return reply.Reply{Status: domain.StatusInvalid, Code: domain.CodeInvalidRequest, Message: "amount: must be an integer"}
		}
		return reply.Reply{Status: domain.StatusApplied, Code: domain.CodeOK, IdempotencyKey: "fast"}
	})
	nc := startIntake(t, h, Options{})
	js := jsOf(t, nc)
	ctx := context.Background()
	for i := range 50 {
		ack, err := js.Publish(ctx, CommandSubject("deposit"), []byte(`{"idempotency_key":"fast"}`))
		if err != nil || ack.Stream != StreamName {
			t.Fatalf("publish %d: %+v %v", i, ack, err)
		}
	}
	// An invalid command may come back as a publish error naming the reason (when the
	// ledger answers first) or be acked by the stream (and dead-lettered later).
	if _, err := js.Publish(ctx, CommandSubject("withdraw"), []byte(`{}`)); err != nil && !strings.Contains(err.Error(), "invalid_request") {
		t.Fatalf("invalid command: %v", err)
	}
}

// A plain NATS request on a command subject, from any client, gets exactly one
// answer: the ledger's §3 reply (the stream stores the command but never answers).
// The command is stored all the same.
func TestPlainRequestGetsTheLedgerReplyOnly(t *testing.T) {
	h := handlerFunc(func(ctx context.Context, typ string, body []byte) reply.Reply {
		return reply.Reply{Status: domain.StatusApplied, Code: domain.CodeOK, IdempotencyKey: "plain"}
	})
	nc := startIntake(t, h, Options{})
	for i := range 20 {
		m, err := nc.Request(CommandSubject("deposit"), []byte(`{"idempotency_key":"plain"}`), 10*time.Second)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		var r reply.Reply
		if err := json.Unmarshal(m.Data, &r); err != nil || r.Code != domain.CodeOK || r.Status != domain.StatusApplied {
			t.Fatalf("request %d got %s, not the ledger's reply", i, m.Data)
		}
	}
	// The reply does not wait for the stream's write: poll for it.
	devtest.Eventually(t, 10*time.Second, "the 20 commands stored", func() bool {
		st, err := jsOf(t, nc).Stream(context.Background(), StreamName)
		if err != nil {
			return false
		}
		info, err := st.Info(context.Background())
		return err == nil && info.State.Msgs == 20
	})
}
