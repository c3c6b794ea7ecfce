package natsapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/app/reply"
	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// A steady stream of commands, each younger than the grace when it arrives, flows
// through the consumer: the fetch loop never waits (the lanes wait out the
// grace), so the client drops no delivery ("slow consumer": a dropped delivery
// comes back only after AckWait, a dropped heartbeat fails the pull), each message
// is handled once and none is redelivered. (With the grace waited in the fetch
// loop and 1,024 acks pending at most, these 8,000 commands took 36 s to confirm
// here; now about 3 s. That figure is not asserted.)
func TestSteadyStreamWithinGraceIsConfirmedOnce(t *testing.T) {
	const n = 8000
	var (
		mu      sync.Mutex
		handled = map[string]int{}
		slow    atomic.Int32
	)
	h := handlerFunc(func(ctx context.Context, typ string, body []byte) reply.Reply {
		mu.Lock()
		handled[string(body)]++
		mu.Unlock()
		return reply.Reply{Status: domain.StatusApplied, Code: domain.CodeOK}
	})
	ns := devtest.NATS(t)
	inc := devtest.Connect(t, ns, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrSlowConsumer) {
			slow.Add(1)
		}
	}))
	in := New(inc, h, Options{Grace: time.Second, Lanes: 4, Logger: slog.New(slog.DiscardHandler)})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := in.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = in.Stop(context.Background()) })

	nc := devtest.Connect(t, ns)
	for i := range n {
		// A plain publish: only the stream takes it, and the consumer decides it.
		if i%100 == 99 { // a steady stream, about 4,000 commands/s
			time.Sleep(25 * time.Millisecond)
		}
		if err := nc.Publish(CommandSubject("deposit"), fmt.Appendf(nil, `{"idempotency_key":"k%d","account_id":"a%d"}`, i, i%50)); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	devtest.Eventually(t, 45*time.Second, "every message handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(handled) == n
	})
	cons, err := jsOf(t, nc).Consumer(ctx, StreamName, DefaultDurable)
	if err != nil {
		t.Fatal(err)
	}
	devtest.Eventually(t, 10*time.Second, "every message acked", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending == 0 && info.AckFloor.Stream == n
	})
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.NumRedelivered != 0 || slow.Load() != 0 {
		t.Errorf("redelivered %d, slow-consumer errors %d; want none", info.NumRedelivered, slow.Load())
	}
	mu.Lock()
	defer mu.Unlock()
	for k, c := range handled {
		if c != 1 {
			t.Errorf("%s handled %d times", k, c)
		}
	}
}
