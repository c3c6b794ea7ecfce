package projections

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/internal/platform/pgcopy"
)

// TestCopyOrUpsertLeavesNoRowEncodedPastItsReturn: when the COPY's
// connection fails (a stop's cancel, a backend terminated), pgconn's
// CopyFrom returns without waiting for its reader goroutine; with
// pgcopy.Stream that goroutine runs row() and writes into the pooled Buf
// after copyOrUpsert has returned and put the Buf back in copyBufs (for the
// next slot's COPY to take), and r.Err() is read racing its write.
func TestCopyOrUpsertLeavesNoRowEncodedPastItsReturn(t *testing.T) {
	for _, how := range []string{"cancel", "terminate"} {
		t.Run(how, func(t *testing.T) {
			bg := context.Background()
			pool, gen := copyTestGeneration(t)
			tx, err := pool.Begin(bg)
			if err != nil {
				t.Fatal(err)
			}
			pid := tx.Conn().PgConn().PID()
			ctx, cancel := context.WithCancel(bg)
			defer cancel()
			var returned atomic.Bool
			returnedCh := make(chan struct{})
			var late atomic.Int64
			orphanDone := make(chan struct{})
			const n, k = 20000, 2000 // k in the 4th piece: the COPY is under way
			rows := testTransferRows(gen, n, func(c *pgcopy.Buf, i int) error {
				if i == k {
					if how == "cancel" {
						cancel()
					} else if _, err := pool.Exec(bg, `SELECT pg_terminate_backend($1)`, pid); err != nil {
						t.Error(err)
					}
					select { // copyOrUpsert returns meanwhile, or not (then 5 s pass)
					case <-returnedCh:
					case <-time.After(5 * time.Second):
					}
				}
				if returned.Load() {
					late.Add(1)
					if i == k+200 {
						close(orphanDone)
						return fmt.Errorf("late row %d", i) // written to r.err after copyOrUpsert read it
					}
				}
				testTransferRow(c, "t", i)
				return nil
			})
			err = copyOrUpsert(ctx, tx, rows, func() error { return nil })
			returned.Store(true)
			close(returnedCh)
			// The next slot's write takes a Buf from the pool, as applyBatch's
			// parallel slots do.
			for range 4 {
				c := copyBufs.Get().(*pgcopy.Buf)
				*c = c.Emptied()
				c.Tuple(1).Int8(1)
				copyBufs.Put(c)
			}
			select {
			case <-orphanDone:
			case <-time.After(3 * time.Second):
			}
			_ = tx.Rollback(bg)
			if l := late.Load(); l > 0 {
				t.Errorf("copyOrUpsert returned (%v) while its COPY's reader still encoded rows: %d rows written into the pooled Buf after it was put back", err, l)
			}
		})
	}
}
