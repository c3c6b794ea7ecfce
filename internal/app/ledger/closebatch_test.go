package ledger

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/internal/testing/devtest"
)

// TestCloseDuringBatches: Close while batches of one hot account's deposits
// are being decided returns, and so does every batch (its unfinished
// elements answered an error), within the test's deadline. Before enqueue
// and close agreed under a lock, a request could be queued after the
// committer drained its queue (the select between the send and the stop
// chooses at random when both are ready): its caller waited forever.
func TestCloseDuringBatches(t *testing.T) {
	for trial := range 20 {
		s := newService(devtest.Memory(t))
		mustApply(t, s, "open_account", `{"idempotency_key":"o","account_id":"hot","currency":"EUR"}`)
		var wg sync.WaitGroup
		for b := range 8 {
			var cmds []batchCmd
			for i := range 50 {
				cmds = append(cmds, batchCmd{"deposit", map[string]any{"idempotency_key": fmt.Sprintf("d%d-%d", b, i), "account_id": "hot", "amount": 1, "currency": "EUR"}})
			}
			wg.Go(func() { s.HandleBatch(context.Background(), batchBody(cmds), 0) })
		}
		time.Sleep(time.Duration(trial%5) * time.Millisecond)
		done := make(chan struct{})
		go func() { s.Close(); wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatalf("trial %d: Close or a batch did not return", trial)
		}
	}
}
