package audit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/platform/pgcopy"
)

// pgSets are historySets in temporary tables of one PostgreSQL session: each
// page of events adds its rows with COPY, and the checks are set queries that
// PostgreSQL answers by sorting or hashing, on disk beyond work_mem. Memory is
// two pages' rows: the COPY of one page runs behind the fold of the next (flush).
// seq orders the rows as the fold met them (its event count).
type pgSets struct {
	conn *pgxpool.Conn
	pgRows
	// begun is the group begun by the event last noted, held until that
	// event's home makes it one row with the home's hash (pgHomes) or
	// another row ends it (endGroup).
	begun   begunGroup
	spare   pgRows     // the buffers of the page being copied, reused after it
	pending chan error // the COPY running behind the fold; nil when none
	// storeIDs, when set, is the duplicate-ID check the event store answers
	// (idsFromStore): no ID is copied into audit_ids.
	storeIDs *storeIDs
	// run, when set, is the schema of a full audit's run that holds the
	// history tables (runsets.go); keep leaves it to a stop point.
	run  string
	keep bool
	// pool and log, with run: where run's schema is dropped from when the
	// session broke (dropRun), and what is told of it.
	pool *pgxpool.Pool
	log  *slog.Logger
	// copied counts the rows copied into each history table (historyTables'
	// order), this run's and a resumed one's: a resume checks that its run's
	// tables still hold rows (an UNLOGGED table is emptied by a crash).
	copied [5]int64
	// held: the rows of idKeyed's tables kept out of audit_rows until a
	// statement reads them (heldrows.go).
	held heldRows
	// rowsOnly: the sets keep the read models' rows alone (newRowSets): no
	// event ID, group, home or claim is copied, and finish and keys refuse.
	rowsOnly bool
	// sums add up the rows of the tables keyed by event ID as they are
	// noted (rowsums.go); idsUnique: finish found no event ID twice.
	sums      rowSums
	idsUnique bool
}

// begunGroup is a group's row of audit_groups not written yet (set).
type begunGroup struct {
	stream, key   string
	revision, seq int64
	id            [16]byte
	set           bool
}

// pgRows are a page's rows of each table, in COPY's binary format
// (pgcopy.Buf); held are audit_rows' rows kept out of it (heldrows.go).
type pgRows struct {
	ids, groups, homes, claims, rows, held pgcopy.Buf
}

// emptied returns the buffers emptied, their arrays kept for another page.
func (r pgRows) emptied() pgRows {
	return pgRows{r.ids.Emptied(), r.groups.Emptied(), r.homes.Emptied(), r.claims.Emptied(), r.rows.Emptied(), r.held.Emptied()}
}

// historyTables are the sets that grow with history (a CREATE TABLE's name
// and columns): a session's TEMP tables (newPGSets) or a full audit's run's
// UNLOGGED ones (runsets.go).
var historyTables = []string{
	`audit_ids (event_id uuid NOT NULL, seq bigint NOT NULL)`,
	`audit_groups (stream text NOT NULL, key text NOT NULL, revision bigint NOT NULL, event_id uuid NOT NULL, seq bigint NOT NULL, hash text)`,
	`audit_homes (key text NOT NULL, stream text NOT NULL, hash text NOT NULL, revision bigint NOT NULL, event_id uuid NOT NULL, seq bigint NOT NULL)`,
	`audit_claims (key text NOT NULL, stream text NOT NULL, hash text NOT NULL, revision bigint NOT NULL, event_id uuid NOT NULL, seq bigint NOT NULL)`,
	`audit_rows (tbl text NOT NULL, key text NOT NULL, account text NOT NULL, digest bytea NOT NULL, seq bigint NOT NULL)`,
}

// rowsTable is audit_rows' place in historyTables (and copied); rowsColumns
// the columns its COPYs write, as row notes them.
const (
	rowsTable   = 4
	rowsColumns = "tbl, key, account, digest, seq"
)

// setsLayout names historyTables' definitions (a hash of them): a stop
// point stores it, and its resume refuses sets of another (checkStopIdentity),
// which buildID alone does not refuse between builds with no VCS stamp, all
// "(devel)" (review r493: the home's hash moved into audit_groups, 5c4c748).
var setsLayout = func() string {
	sum := sha256.Sum256([]byte(strings.Join(historyTables, "\n")))
	return hex.EncodeToString(sum[:8])
}()

// scratchTables are compare's, always the session's TEMP tables (pg_temp is
// searched before any schema), with the session's work_mem.
const scratchTables = `
CREATE TEMP TABLE audit_actual (tbl text NOT NULL, key text NOT NULL, digest bytea NOT NULL);
CREATE TEMP TABLE audit_noted (key text NOT NULL, n bigint NOT NULL);
CREATE INDEX ON audit_noted (n);
SET work_mem = '64MB'`

// historySchema creates the history tables, each as "CREATE " + create +
// its name: "TEMP TABLE " or "UNLOGGED TABLE <schema>.". Autovacuum leaves
// them alone: they are only inserted into, and read whole once the fold
// ends, after finish has analyzed them (analyze); before, a full audit's run's
// tables had autovacuum's workers VACUUM ANALYZE them again and again as
// they grew (TEMP tables it never touches).
func historySchema(create string) string {
	var b strings.Builder
	for _, t := range historyTables {
		b.WriteString("CREATE " + create + t + " WITH (autovacuum_enabled = false);\n")
	}
	return b.String()
}

// analyze gives the planner the history tables' statistics before the set
// queries read them: autovacuum takes none (historySchema). A sample of
// 3,000 rows a table (statistics target 10, not the default 100: a tenth of
// its CPU) gives the set queries the plans the default's 30,000 give (on the
// 1,000,000-event history of BENCHMARKS.md, "where PostgreSQL's CPU goes in
// an audit"): they read the tables whole, and need their sizes and their
// keys' number, not their values' distribution.
func (s *pgSets) analyze(ctx context.Context) error {
	return s.analyzeTables(ctx, "audit_ids, audit_groups, audit_homes, audit_claims, audit_rows")
}

// analyzeTables is analyze's of the history tables named (held rows copied
// into audit_rows after it: loadHeld).
func (s *pgSets) analyzeTables(ctx context.Context, tables string) error {
	sql := `SET default_statistics_target = 10; ANALYZE ` + tables + `; RESET default_statistics_target`
	if _, err := s.conn.Exec(ctx, sql); err != nil {
		return fmt.Errorf("audit: sets: analyze: %w", err)
	}
	return nil
}

// newPGSets takes a session of pool for the audit's sets, in its TEMP tables
// (dropped with the session); close releases it.
func newPGSets(ctx context.Context, pool *pgxpool.Pool) (*pgSets, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("audit: sets: %w", err)
	}
	s := &pgSets{conn: conn, sums: rowSums{whole: true}}
	if err := s.tempTables(ctx); err != nil {
		conn.Release()
		return nil, err
	}
	return s, nil
}

// newRowSets is newPGSets for a fold that only compares read models (the
// rebuild's check, VerifyGeneration): it never runs finish's set queries
// (invariants 1 and 5), so it copies only the rows of row, not the event
// IDs, groups, homes and claims those queries read (BENCHMARKS.md: more
// than twice the rows it compares, that nothing read).
func newRowSets(ctx context.Context, pool *pgxpool.Pool) (*pgSets, error) {
	s, err := newPGSets(ctx, pool)
	if err == nil {
		s.rowsOnly = true
	}
	return s, err
}

// errRowsOnly is finish's and keys' error on sets that keep the rows alone.
var errRowsOnly = errors.New("audit: sets: the sets keep the read models' rows alone (newRowSets): no key or event ID check runs on them")

// tempTables creates the session's TEMP tables, the history's and compare's.
func (s *pgSets) tempTables(ctx context.Context) error {
	if _, err := s.conn.Exec(ctx, historySchema("TEMP TABLE ")+scratchTables); err != nil {
		return fmt.Errorf("audit: sets: %w", err)
	}
	return nil
}

// close drops the session (and its tables with it): a session that held
// temporary tables is not handed out again. A run's sets (runsets.go) are
// dropped first, unless a stop point keeps them.
func (s *pgSets) close() {
	_ = s.wait()
	s.dropHeld()
	s.storeIDs.stop()
	s.dropRun()
	_ = s.conn.Conn().Close(context.Background())
	s.conn.Release()
}

func (s *pgSets) eventID(f *Fold, re eventstore.RecordedEvent) {
	if s.storeIDs == nil && !s.rowsOnly {
		s.ids.Tuple(2).UUID(re.ID).Int8(f.Events)
	}
}

// group holds the group's row until the event's home or the next row
// (begun): a client's command's first event in a stream is both, one row.
func (s *pgSets) group(f *Fold, re eventstore.RecordedEvent, key string) {
	if s.rowsOnly {
		return
	}
	s.endGroup()
	s.begun = begunGroup{re.Stream, key, int64(re.Revision), f.Events, re.ID, true}
}

// home is the group's row of the same event, with its hash, or else a row of
// audit_homes (an event of a client's command after its first in the stream).
func (s *pgSets) home(f *Fold, re eventstore.RecordedEvent, key, hash string) {
	if s.rowsOnly {
		return
	}
	if g := s.begun; g.set && g.seq == f.Events && g.id == re.ID && g.stream == re.Stream && g.key == key {
		s.writeGroup(hash, true)
		return
	}
	s.endGroup()
	s.homes.Tuple(6).Text(key).Text(re.Stream).Text(hash).Int8(int64(re.Revision)).UUID(re.ID).Int8(f.Events)
}

// endGroup writes the group begun, if any, as no client's home (hash NULL).
func (s *pgSets) endGroup() {
	if s.begun.set {
		s.writeGroup("", false)
	}
}

// writeGroup writes the group begun, with a home's hash when home is set.
func (s *pgSets) writeGroup(hash string, home bool) {
	g := s.begun
	s.begun = begunGroup{}
	s.groups.Tuple(6).Text(g.stream).Text(g.key).Int8(g.revision).UUID(g.id).Int8(g.seq)
	if home {
		s.groups.Text(hash)
	} else {
		s.groups.Null()
	}
}

func (s *pgSets) claim(f *Fold, re eventstore.RecordedEvent, key string, c claim) {
	if s.rowsOnly {
		return
	}
	s.claims.Tuple(6).Text(key).Text(c.stream).Text(c.hash).Int8(int64(re.Revision)).UUID(re.ID).Int8(f.Events)
}

// row keeps the row's hash (rowHash), not the row: 32 bytes to copy, store
// and sort instead of the whole rendered row, and what the table's digest sums.
func (s *pgSets) row(f *Fold, table, key, account string, n rowNote) {
	var h [sha256.Size]byte
	if n.hashed {
		h = rowHash(key, n.digest[:])
	} else {
		h = rowHash(key, n.text)
	}
	if idKeyed[table] {
		s.sums.add(table, f.Events, h[:])
	}
	s.rowBuf(table).Tuple(5).Text(table).Text(key).Text(account).Bytes(h[:]).Int8(f.Events)
}

// flush starts copying the rows noted so far into the session and returns:
// the COPY runs behind the fold, which notes the next page meanwhile, and the
// next flush, or any other use of the session (sync), waits for it first.
func (s *pgSets) flush(ctx context.Context) error {
	if err := s.wait(); err != nil {
		return err
	}
	s.endGroup()
	page := s.pgRows
	s.pgRows, s.spare = s.spare.emptied(), page
	done := make(chan error, 1)
	s.pending = done
	// Not cancelled with the fold: a stopped full audit's stop point holds
	// the page's rows, so its sets must too (stop.go).
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), copyTimeout)
	go func() { defer cancel(); done <- s.copyPage(cctx, page) }()
	return nil
}

// copyTimeout bounds a page's COPY into the sets.
const copyTimeout = 10 * time.Minute

// wait waits for the COPY running behind the fold, if any, and returns its error.
func (s *pgSets) wait() error {
	if s.pending == nil {
		return nil
	}
	err := <-s.pending
	s.pending = nil
	return err
}

// sync stores every row noted: flush, and wait for it.
func (s *pgSets) sync(ctx context.Context) error {
	if err := s.flush(ctx); err != nil {
		return err
	}
	return s.wait()
}

// copyPage copies a page's rows into the session's tables, counting them
// (copied, by historyTables' order).
func (s *pgSets) copyPage(ctx context.Context, page pgRows) error {
	for i, t := range []struct {
		table, cols string
		rows        *pgcopy.Buf
	}{
		{"audit_ids", "event_id, seq", &page.ids},
		{"audit_groups", "stream, key, revision, event_id, seq, hash", &page.groups},
		{"audit_homes", "key, stream, hash, revision, event_id, seq", &page.homes},
		{"audit_claims", "key, stream, hash, revision, event_id, seq", &page.claims},
		{"audit_rows", rowsColumns, &page.rows},
	} {
		if t.rows.Tuples() == 0 {
			continue
		}
		sql := "COPY " + t.table + " (" + t.cols + ") FROM STDIN (FORMAT binary)"
		if _, err := s.conn.Conn().PgConn().CopyFrom(ctx, t.rows.Reader(), sql); err != nil {
			return fmt.Errorf("audit: sets: %s: %w", t.table, err)
		}
		s.copied[i] += int64(t.rows.Tuples())
	}
	return s.writeHeld(&page.held)
}

func (s *pgSets) keys(ctx context.Context) (int, error) {
	if s.rowsOnly {
		return 0, errRowsOnly
	}
	if err := s.sync(ctx); err != nil {
		return 0, err
	}
	var n int
	err := s.conn.QueryRow(ctx, `SELECT count(DISTINCT key) FROM `+pgHomes+` h`).Scan(&n)
	return n, err
}

// pgCheck is a set query whose every row is a violation. probe, when set,
// is a cheaper query that answers whether sql returns any row at all: sql
// runs only when it does.
type pgCheck struct {
	invariant        int
	kind, sql, probe string
	message          func(vals []any) string
	// homes: the check names every key decided in a second stream (finish
	// reads the claims by the one home left when it names none).
	homes bool
}

// pgIDCheck is invariant 5's set query over audit_ids (a store that answers it
// itself takes no copy of the IDs: idsFromStore).
var pgIDCheck = pgCheck{InvStreams, "duplicate_event_id",
	`SELECT event_id::text, count(*) FROM audit_ids GROUP BY event_id HAVING count(*) > 1 ORDER BY min(seq)`, "",
	func(v []any) string { return fmt.Sprintf("event ID %s is stored %d times", v[0], v[1]) }, false}

// pgKeyChecks are the set queries of invariant 1, each row a violation. The
// groups' is probed first: a hash of the (stream, key) pairs that finds none
// begun twice costs about half the sort of every group its window needs (the
// pairs are long: BENCHMARKS.md); the homes' and claims' sort by the key
// alone, which costs what a hash of it does, and have no probe.
var pgKeyChecks = []pgCheck{
	{InvKeyOnce, "key_decided_twice",
		`SELECT key, stream, revision, event_id::text FROM (SELECT *, row_number() OVER (PARTITION BY stream, key ORDER BY seq) AS n FROM audit_groups) g WHERE n > 1 ORDER BY seq`,
		`SELECT EXISTS (SELECT FROM audit_groups GROUP BY stream, key HAVING count(*) > 1)`,
		func(v []any) string { return fmt.Sprintf("key %q decided a second time in %s", v[0], v[1]) }, false},
	{InvKeyOnce, "key_decided_twice",
		`SELECT key, stream, revision, event_id::text, home FROM (SELECT *, first_value(stream) OVER (PARTITION BY key ORDER BY seq) AS home FROM ` + pgHomes + ` h0) h WHERE stream <> home ORDER BY seq`, "",
		func(v []any) string { return fmt.Sprintf("key %q decided in %s and again in %s", v[0], v[4], v[1]) }, true},
	{InvKeyOnce, "key_claimed_twice",
		`SELECT key, 'key-' || key, revision, event_id::text FROM (SELECT *, row_number() OVER (PARTITION BY key ORDER BY seq) AS n FROM audit_claims) c WHERE n > 1 ORDER BY seq`, "",
		func(v []any) string { return fmt.Sprintf("key %q is claimed a second time", v[0]) }, false},
}

// pgHomes are the events of clients' commands (home): the groups' rows
// that carry a hash, a command's first event in a stream (one row of
// audit_groups: no second copy of it in audit_homes), and audit_homes,
// its events after the first.
const pgHomes = `(SELECT key, stream, hash, revision, event_id, seq FROM audit_groups WHERE hash IS NOT NULL
	UNION ALL SELECT key, stream, hash, revision, event_id, seq FROM audit_homes)`

// pgClaims lists every decided key whose claim is missing or differs: its home
// (the first stream that decided it), the request hash of its last event
// there, and its claim (the last one). The homes are sorted once, by key and
// seq descending: the home is the last value of that order (the first
// stream), and the last event there the first row left of the key. (A join
// of the homes with their first rows had each of PostgreSQL's parallel
// workers sort the homes again for its hash: twice the CPU, BENCHMARKS.md.)
const pgClaims = `
WITH home AS (SELECT DISTINCT ON (key) key, home, hash FROM (SELECT key, stream, hash, seq, last_value(stream) OVER (PARTITION BY key ORDER BY seq DESC
			ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) AS home FROM ` + pgHomes + ` h0) h WHERE stream = home ORDER BY key, seq DESC),` + pgClaimsJoin

// pgClaimsOneHome is pgClaims where every key's homes are in one stream (the
// homes' check named none): the home's last event is the key's last, read
// without the window that finds the first stream (a fifth less CPU than pgClaims',
// BENCHMARKS.md, "`auditpg2`").
const pgClaimsOneHome = `
WITH home AS (SELECT DISTINCT ON (key) key, stream AS home, hash FROM ` + pgHomes + ` h ORDER BY key, seq DESC),` + pgClaimsJoin

// pgClaimsJoin is pgClaims' claims and their join with the homes.
const pgClaimsJoin = `
     claim AS (SELECT DISTINCT ON (key) key, stream, hash FROM audit_claims ORDER BY key, seq DESC)
SELECT h.key, h.home, h.hash, c.key IS NOT NULL, coalesce(c.stream, ''), coalesce(c.hash, '')
FROM home h LEFT JOIN claim c ON c.key = h.key
WHERE c.key IS NULL OR c.stream <> h.home OR c.hash <> h.hash
ORDER BY h.key`

func (s *pgSets) finish(ctx context.Context, f *Fold) error {
	if s.rowsOnly {
		return errRowsOnly
	}
	if err := s.sync(ctx); err != nil {
		return err
	}
	if err := s.analyze(ctx); err != nil {
		return err
	}
	if err := s.checkIDs(ctx, f); err != nil {
		return err
	}
	oneHome := true
	for _, c := range pgKeyChecks {
		before := f.violations
		if err := s.check(ctx, f, c); err != nil {
			return err
		}
		oneHome = oneHome && !(c.homes && f.violations > before)
	}
	claims := pgClaims
	if oneHome {
		claims = pgClaimsOneHome
	}
	rows, err := s.conn.Query(ctx, claims)
	if err != nil {
		return fmt.Errorf("audit: claims: %w", err)
	}
	var key, home, hash string
	var c claim
	var claimed bool
	_, err = pgx.ForEachRow(rows, []any{&key, &home, &hash, &claimed, &c.stream, &c.hash}, func() error {
		return f.checkClaim(key, home, hash, c, claimed) // a lookup reads the store, not this session
	})
	if err != nil {
		return fmt.Errorf("audit: claims: %w", err)
	}
	return nil
}

// checkIDs reports the duplicate event IDs: the store's answer (storeIDs) or
// pgIDCheck's.
func (s *pgSets) checkIDs(ctx context.Context, f *Fold) error {
	before := f.violations
	var err error
	if s.storeIDs != nil {
		err = s.storeIDs.report(f)
	} else {
		err = s.check(ctx, f, pgIDCheck)
	}
	s.idsUnique = err == nil && f.violations == before
	return err
}

// check runs one set query; each row it returns is a violation: its first
// values name the key, stream, revision and event ID, message says the rest.
func (s *pgSets) check(ctx context.Context, f *Fold, c pgCheck) error {
	invariant, kind, message := c.invariant, c.kind, c.message
	if c.probe != "" {
		var found bool
		if err := s.conn.QueryRow(ctx, c.probe).Scan(&found); err != nil {
			return fmt.Errorf("audit: %s: %w", kind, err)
		}
		if !found {
			return nil
		}
	}
	rows, err := s.conn.Query(ctx, c.sql)
	if err != nil {
		return fmt.Errorf("audit: %s: %w", kind, err)
	}
	defer rows.Close()
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			return fmt.Errorf("audit: %s: %w", kind, err)
		}
		v := Violation{Invariant: invariant, Kind: kind, Message: message(vals)}
		if len(vals) >= 4 {
			v.Stream, v.Revision, v.EventID = fmt.Sprint(vals[1]), vals[2].(int64), fmt.Sprint(vals[3])
		}
		f.violate(v)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("audit: %s: %w", kind, err)
	}
	return nil
}

// compare compares a hashed read-model table, read through q (as of its
// snapshot: gen 0 the live view, else generation gen), with the rows the fold
// noted up to seq (only the account's, when set). The table is read once for
// its digest; only when that differs from the expected one is it read again
// (the same snapshot), its rows copied into the session as they are read, and
// a join names the differences: a table that matches costs one read, no copy.
// actual, when set, is that first read's digest, read before (readActuals).
//
// noted (an incremental audit) compares only the rows noted, those the events
// after its checkpoint touched: the table is read by their keys, a page of
// keys at a time, and a row the fold did not note is not looked at.
func (s *pgSets) compare(ctx context.Context, tr tableRead, seq int64, noted bool, read *digester) (TableDiff, error) {
	table, account := tr.table, tr.account
	if err := s.sync(ctx); err != nil {
		return TableDiff{}, err
	}
	d := TableDiff{Table: table}
	actual, err := s.firstRead(ctx, tr, seq, noted, read)
	if err != nil {
		return d, err
	}
	d.Rows, d.Digest = actual.n, actual.String()
	if err := s.expectedDigest(ctx, &d, table, account, seq, noted); err != nil {
		return d, err
	}
	if d.Digest == d.ExpectedDigest && d.Rows == d.Expected {
		return d, nil
	}
	if _, err := s.conn.Exec(ctx, `TRUNCATE audit_actual`); err != nil {
		return d, fmt.Errorf("audit: %s: %w", table, err)
	}
	if _, err := s.readActual(ctx, tr, seq, noted, true); err != nil {
		return d, err
	}
	return d, s.differences(ctx, &d, table, account, seq)
}

// firstRead is the digest compare reads first: read, when set, or the table's.
func (s *pgSets) firstRead(ctx context.Context, tr tableRead, seq int64, noted bool, read *digester) (digester, error) {
	if read != nil {
		return *read, nil
	}
	return s.readActual(ctx, tr, seq, noted, false)
}

// readActual reads a read-model table's rows (noted: those of the keys noted
// up to seq) and returns their digest; with keep it also copies them into
// audit_actual.
func (s *pgSets) readActual(ctx context.Context, tr tableRead, seq int64, noted, keep bool) (digester, error) {
	if noted {
		return s.copyNoted(ctx, tr, seq, keep)
	}
	return s.copyTable(ctx, tr, nil, keep)
}

// copyTable reads a read-model table's rows (only those of keys, when set),
// copying them into audit_actual as they are read when keep is set, and
// returns their digest.
func (s *pgSets) copyTable(ctx context.Context, tr tableRead, keys []string, keep bool) (digester, error) {
	if !keep {
		return digestOfTable(ctx, tr, keys)
	}
	t, err := openTable(ctx, tr, keys)
	if err != nil {
		return digester{}, err
	}
	defer t.Close()
	src := &copyRows{t: t}
	if _, err := s.conn.CopyFrom(ctx, pgx.Identifier{"audit_actual"}, []string{"tbl", "key", "digest"}, src); err != nil {
		return digester{}, fmt.Errorf("audit: %s: %w", tr.table, err)
	}
	return src.sum, nil
}

// notedPage bounds the keys read from a read-model table per query.
const notedPage = 5000

// copyNoted reads the rows of the keys noted for a table up to seq (copying
// them into audit_actual when keep is set), a page of keys at a time (the
// keys listed once, numbered, in a temporary table), and returns their digest.
func (s *pgSets) copyNoted(ctx context.Context, tr tableRead, seq int64, keep bool) (digester, error) {
	table, account := tr.table, tr.account
	var sum digester
	if err := s.rowsOf(ctx, table); err != nil {
		return sum, err
	}
	if _, err := s.conn.Exec(ctx, `TRUNCATE audit_noted`); err != nil {
		return sum, fmt.Errorf("audit: %s: %w", table, err)
	}
	_, err := s.conn.Exec(ctx, `INSERT INTO audit_noted SELECT key, row_number() OVER (ORDER BY key) FROM (SELECT DISTINCT key FROM audit_rows
		WHERE tbl = $1 AND seq <= $2 AND ($3 = '' OR strpos(account, '|' || $3 || '|') > 0)) k`, table, seq, account)
	if err != nil {
		return sum, fmt.Errorf("audit: %s: %w", table, err)
	}
	for from := int64(0); ; from += notedPage {
		rows, err := s.conn.Query(ctx, `SELECT key FROM audit_noted WHERE n > $1 AND n <= $2 ORDER BY n`, from, from+notedPage)
		if err != nil {
			return sum, fmt.Errorf("audit: %s: %w", table, err)
		}
		keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return sum, fmt.Errorf("audit: %s: %w", table, err)
		}
		if len(keys) == 0 {
			return sum, nil
		}
		page, err := s.copyTable(ctx, tr, keys, keep)
		if err != nil {
			return sum, err
		}
		sum.lanes, sum.n = addAllLanes(sum.lanes, page.lanes), sum.n+page.n
	}
}

// notedKeys lists the keys of the rows the fold noted for a table up to seq.
func (s *pgSets) notedKeys(ctx context.Context, table string, seq int64) ([]string, error) {
	if err := s.rowsOf(ctx, table); err != nil {
		return nil, err
	}
	rows, err := s.conn.Query(ctx, `SELECT DISTINCT key FROM audit_rows WHERE tbl = $1 AND seq <= $2`, table, seq)
	if err != nil {
		return nil, fmt.Errorf("audit: %s: %w", table, err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("audit: %s: %w", table, err)
	}
	return keys, nil
}

func addAllLanes(a, b [4]uint64) [4]uint64 {
	for i := range a {
		a[i] += b[i]
	}
	return a
}

// expectedRows selects the rows the fold noted for a table up to a seq: the
// last noted for each key.
const expectedRows = `SELECT DISTINCT ON (key) key, digest FROM audit_rows
	WHERE tbl = $1 AND seq <= $2 AND ($3 = '' OR strpos(account, '|' || $3 || '|') > 0) ORDER BY key, seq DESC`

// expectedDigest is the digest and count of the rows the fold noted for a
// table up to seq (expectedRows), from the sets' sums when they answer it
// (expectedSum).
func (s *pgSets) expectedDigest(ctx context.Context, d *TableDiff, table, account string, seq int64, noted bool) error {
	if sum, ok := s.expectedSum(table, account, seq, noted); ok {
		d.Expected, d.ExpectedDigest = sum.n, sum.String()
		return nil
	}
	if err := s.rowsOf(ctx, table); err != nil {
		return err
	}
	rows, err := s.conn.Query(ctx, expectedRows, table, seq, account)
	if err != nil {
		return fmt.Errorf("audit: %s: %w", table, err)
	}
	var exp digester
	var key string
	var digest []byte
	if _, err := pgx.ForEachRow(rows, []any{&key, &digest}, func() error { exp.addHash(digest); return nil }); err != nil {
		return fmt.Errorf("audit: %s: %w", table, err)
	}
	d.Expected, d.ExpectedDigest = exp.n, exp.String()
	return nil
}

// maxNamed bounds the differing rows a TableDiff names per kind.
const maxNamed = 1000

func (s *pgSets) differences(ctx context.Context, d *TableDiff, table, account string, seq int64) error {
	if err := s.rowsOf(ctx, table); err != nil {
		return err
	}
	// A key read twice is named extra (its second row), as compareRows does.
	rows, err := s.conn.Query(ctx, `WITH e AS (`+expectedRows+`),
		a AS (SELECT key, digest, row_number() OVER (PARTITION BY key) AS n FROM audit_actual)
		SELECT * FROM (SELECT coalesce(e.key, a.key), e.key IS NULL, a.key IS NULL FROM e FULL JOIN (SELECT * FROM a WHERE n = 1) a ON a.key = e.key
			WHERE e.digest IS DISTINCT FROM a.digest
		UNION ALL SELECT key, true, false FROM a WHERE n > 1) d ORDER BY 1`, table, seq, account)
	if err != nil {
		return fmt.Errorf("audit: %s: %w", table, err)
	}
	var key string
	var extra, missing bool
	_, err = pgx.ForEachRow(rows, []any{&key, &extra, &missing}, func() error {
		l := &d.Differ
		if extra {
			l = &d.Extra
		} else if missing {
			l = &d.Missing
		}
		if len(*l) < maxNamed {
			*l = append(*l, key)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("audit: %s: %w", table, err)
	}
	return nil
}

// copyRows feeds COPY with a table's rows as they are read, summing their digest.
type copyRows struct {
	t   *tableRows
	sum digester
}

func (c *copyRows) Next() bool { return c.t.Next() }
func (c *copyRows) Err() error { return c.t.Err() }
func (c *copyRows) Values() ([]any, error) {
	h := rowHash(c.t.key, c.t.row)
	c.sum.addHash(h[:])
	return []any{c.t.table, string(c.t.key), h[:]}, nil
}

// digester sums Digest's lanes row by row.
type digester struct {
	lanes [4]uint64
	n     int
}

func (g *digester) add(key, row []byte) {
	h := rowHash(key, row)
	g.addHash(h[:])
}

// addHash adds a row by its hash (rowHash).
func (g *digester) addHash(sum []byte) {
	g.lanes = addHash(g.lanes, sum)
	g.n++
}

func (g *digester) String() string { return lanesString(g.lanes) }
