package projections

import (
	"fmt"
	"io"
	"sort"
	"testing"
	"time"

	"github.com/ledgerworks/ledger/internal/platform/pgcopy"
)

// BenchmarkHeldRowsCopy: the COPY data of the held rows a rebuild writes at
// the end of its load, 100,000 accounts as in the lead's runs (the accounts'
// rows, heldAccountsCopy; the commands' command_accounts rows,
// memoCmdAccountsCopy), read to the end as COPY reads them: the process's
// cost per held row, without PostgreSQL's.
func BenchmarkHeldRowsCopy(b *testing.B) {
	const n = 100_000
	rows, memo := map[string]*accountRow{}, newAccountMemo(true)
	ids := make([]string, n)
	at := time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)
	for i := range ids {
		id := fmt.Sprintf("acc-%06d", i)
		ids[i] = id
		rows[id] = &accountRow{id: id, opened: true, currency: "EUR", overdraft: 0, metadata: "{}", balance: int64(i), held: 7,
			revision: int64(i % 97), openedAt: at, updatedAt: at.Add(time.Duration(i))}
		memo.remember(id, memoAccount{state: BalanceState{Currency: "EUR", Balance: int64(i), Held: 7}, rev: int64(i % 97)})
	}
	sort.Strings(ids)
	for _, c := range []struct {
		name string
		rows genRows
	}{{"accounts", heldAccountsCopy(1, rows, ids)}, {"command_accounts", memoCmdAccountsCopy(1, memo, ids)}} {
		b.Run(c.name, func(b *testing.B) {
			buf := new(pgcopy.Buf)
			for b.Loop() {
				r := pgcopy.Stream(buf, int16(len(c.rows.columns)), c.rows.n, c.rows.row)
				if _, err := io.Copy(io.Discard, r); err != nil {
					b.Fatal(err)
				}
				r.Close()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/row")
		})
	}
}
