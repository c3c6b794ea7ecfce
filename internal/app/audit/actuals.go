package audit

import (
	"context"
	"fmt"
)

// A full audit reads each hashed read-model table (notedTables) once for its
// digest, as of the read models' snapshot, and compares it with the digest
// of the rows the fold expected (pgSets.compare). What it reads of a table
// does not depend on the fold, so it reads it while the fold runs, on the
// other core: after the fold only the expected side is left to sum. It reads
// in a transaction of its own on a connection of its own, which imports the
// snapshot's (pg_export_snapshot) and ends once the tables are read: its
// transaction holds a share lock on each table it has read until it has
// read them all (about as long as the comparisons after the fold took), and
// none after that, so a rebuild's switch waits for that reading at most, not
// for the whole fold (liveSwitched then names the switch). An incremental audit
// reads the rows of the keys its events noted, known only after its fold,
// and a rebuild's check reads a generation the build has just written: both
// read after the fold, as before.

// actuals are the digests read while the fold runs, by projection and table.
type actuals struct {
	done chan struct{}
	sums map[[2]string]digester
	err  error
}

// readActuals starts reading the digests of the live read models' hashed
// tables (a full audit with its sets in PostgreSQL; otherwise it reads
// nothing); the function it returns stops the reading and waits for it.
func (r *auditRun) readActuals(ctx context.Context) (stop func(), err error) {
	if _, ok := r.f.sets.(*pgSets); !ok || r.tx == nil || r.f.from != nil {
		return func() {}, nil
	}
	var snapshot string
	if err := r.tx.QueryRow(ctx, `SELECT pg_export_snapshot()`).Scan(&snapshot); err != nil {
		return nil, fmt.Errorf("audit: read models: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	a := &actuals{done: make(chan struct{}), sums: map[[2]string]digester{}}
	r.actuals = a
	go func() {
		defer close(a.done)
		a.err = a.read(ctx, r, snapshot)
	}()
	return func() { cancel(); <-a.done }, nil
}

// read reads the tables' digests in a transaction of the snapshot's, on a
// connection it closes (ending the transaction and its locks) when done.
func (a *actuals) read(ctx context.Context, r *auditRun, snapshot string) error {
	tx, closeConn, err := snapshotTx(ctx, r, snapshot)
	if err != nil {
		return err
	}
	defer closeConn()
	for _, l := range r.lives {
		for _, table := range ProjectionTables[l.name] {
			if !notedTables[table] {
				continue
			}
			if a.sums[[2]string{l.name, table}], err = digestOfTable(ctx, tableRead{q: tx, table: table, account: r.opts.Account}, nil); err != nil {
				return err
			}
		}
	}
	return nil
}

// digestOfTable reads a table's rows (only those of keys, when set) and
// returns their digest.
func digestOfTable(ctx context.Context, tr tableRead, keys []string) (digester, error) {
	t, err := openTable(ctx, tr, keys)
	if err != nil {
		return digester{}, err
	}
	defer t.Close()
	var sum digester
	for t.Next() {
		sum.add(t.key, t.row)
	}
	return sum, t.Err()
}

// of waits for the reading and returns the digest read of a projection's
// table (nil: not read, the comparison reads it).
func (a *actuals) of(projection, table string) (*digester, error) {
	if a == nil {
		return nil, nil
	}
	<-a.done
	if a.err != nil {
		return nil, a.err
	}
	if sum, ok := a.sums[[2]string{projection, table}]; ok {
		return &sum, nil
	}
	return nil, nil
}
