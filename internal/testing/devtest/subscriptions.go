package devtest

import (
	"testing"
	"time"

	"github.com/ledgerworks/ledger/eventstore"
)

// SubscriptionTimeout bounds Receive and WaitClosed.
const SubscriptionTimeout = 15 * time.Second

// Receive takes n events from sub, failing t if they do not come within
// SubscriptionTimeout or the subscription ends first.
func Receive(t testing.TB, sub eventstore.Subscription, n int) []eventstore.RecordedEvent {
	t.Helper()
	var out []eventstore.RecordedEvent
	timeout := time.After(SubscriptionTimeout)
	for len(out) < n {
		select {
		case e, ok := <-sub.Events():
			if !ok {
				t.Fatalf("subscription ended after %d of %d events: %v", len(out), n, sub.Err())
			}
			out = append(out, e)
		case <-timeout:
			t.Fatalf("received %d of %d events in %s", len(out), n, SubscriptionTimeout)
		}
	}
	return out
}

// WaitClosed drains sub until it ends (its channel closed), failing t if it
// has not ended within SubscriptionTimeout.
func WaitClosed(t testing.TB, sub eventstore.Subscription) {
	t.Helper()
	timeout := time.After(SubscriptionTimeout)
	for {
		select {
		case _, ok := <-sub.Events():
			if !ok {
				return
			}
		case <-timeout:
			t.Fatalf("subscription not ended within %s", SubscriptionTimeout)
		}
	}
}
