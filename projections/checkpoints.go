package projections

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/platform/pgerr"
)

// Checkpointer owns the SQL of the checkpoint tables (migrations 00002, 00003
// and 00008): readmodel.checkpoints, one row per generation of each projection
// ('live', or 'building' while a rebuild runs),
// readmodel.publisher_checkpoints, the events publisher's row and its lease,
// and readmodel.audit_checkpoints, the clean audits' results carried forward
// (and a stopped full audit's stop point, a kind of its own: 00028).
// Every reader and writer of them (the runner, the rebuild, the publisher,
// status, the queries, the audit) goes through Checkpoints; no statement on
// these tables is written anywhere else (STYLE: one owner per table, after
// Emmett's postgreSQLCheckpointer).
//
// The methods take what they run on (a pool, a connection or a transaction),
// so that a checkpoint is read or written in the caller's transaction: a
// projector's checkpoint commits with its rows (ARCHITECTURE decision 9).
type Checkpointer struct{}

// Checkpoints is the one Checkpointer.
var Checkpoints Checkpointer

// Querier is what reading the read models needs: a pool, a connection or a
// transaction (one snapshot for several reads).
type Querier interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}

// RowQuerier reads one row: a pool, a connection or a transaction.
type RowQuerier interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}

// execer writes: a pool, a connection or a transaction.
type execer interface {
	RowQuerier
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}

// Checkpoint states.
const (
	stateLive     = "live"
	stateBuilding = "building"
)

// publisherName is the events publisher's row of readmodel.publisher_checkpoints.
const publisherName = "events"

// LiveCheckpoint is the live generation of a projection and its checkpoint.
type LiveCheckpoint struct {
	Name       string
	Generation int
	Position   eventstore.Position
}

// Live returns the live generation of every projection and its checkpoint,
// ordered by name.
func (Checkpointer) Live(ctx context.Context, q Querier) ([]LiveCheckpoint, error) {
	rows, err := q.Query(ctx, `SELECT name, generation, commit_position, prepare_position FROM readmodel.checkpoints WHERE state = 'live' ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("projections: checkpoints: %w", err)
	}
	var (
		out  []LiveCheckpoint
		l    LiveCheckpoint
		c, p int64
	)
	_, err = pgx.ForEachRow(rows, []any{&l.Name, &l.Generation, &c, &p}, func() error {
		l.Position = position(c, p)
		out = append(out, l)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("projections: checkpoints: %w", err)
	}
	return out, nil
}

// LiveByName returns the live checkpoint of every projection, by name.
func (cp Checkpointer) LiveByName(ctx context.Context, q Querier) (map[string]eventstore.Position, error) {
	live, err := cp.Live(ctx, q)
	if err != nil {
		return nil, err
	}
	out := make(map[string]eventstore.Position, len(live))
	for _, l := range live {
		out[l.Name] = l.Position
	}
	return out, nil
}

// LiveOf returns the live checkpoint of one projection.
func (cp Checkpointer) LiveOf(ctx context.Context, q RowQuerier, projection string) (eventstore.Position, error) {
	return cp.LiveWith(ctx, q, projection, BesideCheckpoint{})
}

// BesideCheckpoint is a read of the caller's own tables made in the statement
// that reads a live checkpoint (LiveWith), and so in its snapshot: Cols is a
// select list (scanned into Dest, before the checkpoint), Join a clause after
// `FROM readmodel.checkpoints c` (a LEFT JOIN, or ""), and Args their
// parameters $1..$n. The zero value reads the checkpoint alone.
type BesideCheckpoint struct {
	Cols, Join string
	Args, Dest []any
}

// LiveWith reads the live checkpoint of projection together with the read
// beside it, in one statement and so one snapshot.
func (Checkpointer) LiveWith(ctx context.Context, q RowQuerier, projection string, beside BesideCheckpoint) (eventstore.Position, error) {
	cols, join, args, dest := beside.Cols, beside.Join, beside.Args, beside.Dest
	if cols != "" {
		cols += ", "
	}
	n := strconv.Itoa(len(args) + 1)
	sql := `SELECT ` + cols + `c.commit_position, c.prepare_position FROM readmodel.checkpoints c ` + join +
		` WHERE c.name = $` + n + ` AND c.state = 'live'`
	var c, p int64
	if err := q.QueryRow(ctx, sql, append(args[:len(args):len(args)], projection)...).Scan(append(dest[:len(dest):len(dest)], &c, &p)...); err != nil {
		return eventstore.Position{}, fmt.Errorf("projections: checkpoint of %s: %w", projection, err)
	}
	return position(c, p), nil
}

// load reads the checkpoint of proj in state (stateLive, or stateBuilding for
// generation gen) into a slot.
func (Checkpointer) load(ctx context.Context, q RowQuerier, proj Projection, state string, gen int) (*slot, error) {
	sql := `SELECT generation, commit_position, prepare_position, events FROM readmodel.checkpoints WHERE name = $1 AND state = $2`
	args := []any{proj.Name(), state}
	if state != stateLive {
		sql += ` AND generation = $3`
		args = append(args, gen)
	}
	s := &slot{proj: proj}
	var c, p int64
	if err := q.QueryRow(ctx, sql, args...).Scan(&s.gen, &c, &p, &s.events); err != nil {
		return nil, fmt.Errorf("projections: checkpoint of %s (%s): %w", proj.Name(), state, err)
	}
	s.pos = position(c, p)
	return s, nil
}

// advance moves the checkpoint of s from s.pos to end, counting n events,
// compare-and-set: ErrCheckpointMoved when it is no longer at s.pos. The row
// lock it takes makes a second runner wait, then find the checkpoint moved.
func (Checkpointer) advance(ctx context.Context, tx execer, s *slot, end eventstore.Position, n int) error {
	e, err := posArgs(end)
	if err != nil {
		return err
	}
	o, err := posArgs(s.pos)
	if err != nil {
		return err
	}
	ct, err := tx.Exec(ctx, `UPDATE readmodel.checkpoints
		SET commit_position = $3, prepare_position = $4, events = events + $7, updated_at = now()
		WHERE name = $1 AND generation = $2 AND commit_position = $5 AND prepare_position = $6`,
		s.proj.Name(), s.gen, e.commit, e.prepare, o.commit, o.prepare, int64(n))
	if err != nil {
		return fmt.Errorf("projections: %s: checkpoint: %w", s.proj.Name(), err)
	}
	if ct.RowsAffected() != 1 {
		return fmt.Errorf("%w: %s generation %d is no longer at %s", ErrCheckpointMoved, s.proj.Name(), s.gen, s.pos)
	}
	return nil
}

// createBuilding inserts the building checkpoint of a new generation, at the
// start of "all".
func (Checkpointer) createBuilding(ctx context.Context, tx execer, name string, gen int) error {
	_, err := tx.Exec(ctx, `INSERT INTO readmodel.checkpoints (name, generation, state) VALUES ($1, $2, 'building')`, name, gen)
	return err
}

// build is a generation being built.
type build struct {
	name string
	gen  int
}

// buildings lists the generations being built.
func (Checkpointer) buildings(ctx context.Context, q Querier) ([]build, error) {
	rows, err := q.Query(ctx, `SELECT name, generation FROM readmodel.checkpoints WHERE state = 'building'`)
	if err != nil {
		return nil, err
	}
	var builds []build
	var b build
	_, err = pgx.ForEachRow(rows, []any{&b.name, &b.gen}, func() error { builds = append(builds, b); return nil })
	return builds, err
}

// dropBuilding deletes the checkpoint of generation gen if it is being built
// (never a live one); it reports whether it did.
func (Checkpointer) dropBuilding(ctx context.Context, tx execer, name string, gen int) (bool, error) {
	ct, err := tx.Exec(ctx, `DELETE FROM readmodel.checkpoints WHERE name = $1 AND generation = $2 AND state = 'building'`, name, gen)
	return err == nil && ct.RowsAffected() > 0, err
}

// liveGeneration is a projection's live generation and its checkpoint.
type liveGeneration struct {
	gen int
	pos eventstore.Position
}

// lockForSwitch locks the live checkpoint of a projection (its row lock holds
// back the live runner's next batch) and the building one of generation gen,
// which must be at pos; it returns the live generation.
func (Checkpointer) lockForSwitch(ctx context.Context, tx execer, name string, gen int, pos eventstore.Position) (liveGeneration, error) {
	var live liveGeneration
	var lc, lp int64
	err := tx.QueryRow(ctx, `SELECT generation, commit_position, prepare_position FROM readmodel.checkpoints
		WHERE name = $1 AND state = 'live' FOR UPDATE`, name).Scan(&live.gen, &lc, &lp)
	if err != nil {
		return live, fmt.Errorf("live checkpoint: %w", err)
	}
	var bc, bp int64
	err = tx.QueryRow(ctx, `SELECT commit_position, prepare_position FROM readmodel.checkpoints
		WHERE name = $1 AND generation = $2 AND state = 'building' FOR UPDATE`, name, gen).Scan(&bc, &bp)
	if err != nil {
		return live, fmt.Errorf("building checkpoint: %w", err)
	}
	if got := position(bc, bp); got != pos {
		return live, fmt.Errorf("building checkpoint at %s, expected %s", got, pos)
	}
	live.pos = position(lc, lp)
	return live, nil
}

// liveSwitch is the switch of a projection from its live generation prev to
// the built generation gen, caught up to pos by applied more events.
type liveSwitch struct {
	name      string
	gen, prev int
	pos       eventstore.Position
	applied   int64
}

// switchLive drops the checkpoint of generation sw.prev and makes generation
// sw.gen's live at sw.pos, counting sw.applied more events.
func (Checkpointer) switchLive(ctx context.Context, tx execer, sw liveSwitch) error {
	pp, err := posArgs(sw.pos)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `DELETE FROM readmodel.checkpoints WHERE name = $1 AND generation = $2`, sw.name, sw.prev); err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `UPDATE readmodel.checkpoints SET state = 'live', commit_position = $3, prepare_position = $4,
		events = events + $5, updated_at = now() WHERE name = $1 AND generation = $2`, sw.name, sw.gen, pp.commit, pp.prepare, sw.applied)
	return err
}

// statusRows reads every checkpoint, the projections' generations live and
// building and the events publisher's (as "publisher:events"), without lag.
func (Checkpointer) statusRows(ctx context.Context, q Querier) ([]Status, error) {
	rows, err := q.Query(ctx, `SELECT name, generation, state, commit_position, prepare_position, events, updated_at
		FROM readmodel.checkpoints
		UNION ALL
		SELECT 'publisher:' || name, 0, 'live', commit_position, prepare_position, events, updated_at
		FROM readmodel.publisher_checkpoints
		ORDER BY 1, 3 DESC, 2`)
	if err != nil {
		return nil, fmt.Errorf("projections: status: %w", err)
	}
	var out []Status
	var (
		s    Status
		c, p int64
	)
	_, err = pgx.ForEachRow(rows, []any{&s.Projection, &s.Generation, &s.State, &c, &p, &s.Events, &s.UpdatedAt}, func() error {
		s.Checkpoint = position(c, p)
		s.Position = s.Checkpoint.String()
		out = append(out, s)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("projections: status: %w", err)
	}
	return out, nil
}

// Published is the events publisher's checkpoint: how far it has published,
// as of its last acknowledged round.
func (Checkpointer) Published(ctx context.Context, q RowQuerier) (eventstore.Position, error) {
	var c, p int64
	if err := q.QueryRow(ctx, `SELECT commit_position, prepare_position FROM readmodel.publisher_checkpoints WHERE name = $1`, publisherName).Scan(&c, &p); err != nil {
		return eventstore.Position{}, fmt.Errorf("publisher: checkpoint: %w", err)
	}
	return position(c, p), nil
}

// TryLease tries to take the publisher's lease, a session advisory lock
// whose key the publisher's row holds, on q's session (the publisher's, and a
// repair's of LEDGER_EVENTS, which must not add messages while a publisher's
// round is in flight); ending the session gives it up.
func (Checkpointer) TryLease(ctx context.Context, q RowQuerier) (bool, error) {
	var got bool
	err := q.QueryRow(ctx, `SELECT pg_try_advisory_lock(lease_key) FROM readmodel.publisher_checkpoints WHERE name = $1`, publisherName).Scan(&got)
	return got, err
}

// publish records that n more events are published, up to pos.
func (Checkpointer) publish(ctx context.Context, tx execer, pos eventstore.Position, n int) error {
	pp, err := posArgs(pos)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `UPDATE readmodel.publisher_checkpoints
		SET commit_position = $1, prepare_position = $2, events = events + $3, updated_at = now() WHERE name = $4`,
		pp.commit, pp.prepare, n, publisherName)
	return err
}

// AuditCheckpoint is a clean audit's result carried forward
// (readmodel.audit_checkpoints, migration 00008, and its accounts,
// readmodel.audit_checkpoint_accounts, 00013): the position of the last event
// it folded, how many it folded, its state as the audit encodes it (what is
// global or in flight), and, when loaded, how many account rows it holds.
type AuditCheckpoint struct {
	ID       int64
	Position eventstore.Position
	Events   int64
	State    []byte
	Accounts int64 // its account rows (LoadAudit)
	// Parent is the checkpoint a delta chains to (SaveAudit: 0 when it
	// stored a root, every account's row: a full audit's, a compaction's,
	// or one that keeps no record of snapshots).
	Parent int64
	// AccountsTable is the accounts read model's digest as the audit that
	// stored it found the table (migration 00014; the audit computes it:
	// internal/app/audit/tabledigest.go), a decimal integer.
	AccountsTable string
	// ActiveHolds is the holds read model's digest likewise, of its active
	// holds' rows (migration 00018; internal/app/audit/holdsdigest.go).
	ActiveHolds string
	// Digest anchors the checkpoint outside the database (LoadAudit, and
	// SaveAudit in its transaction): sha256 of its ID, position, events,
	// state, every digest stored with it and a delta's parent
	// (auditAnchorSQL). An operator who keeps it
	// can tell a checkpoint edited, digests and all, by someone who writes
	// the readmodel schema.
	Digest string
}

// AuditAccount is an account's row of an audit checkpoint (migration 00013):
// its stream's next revision, chain head and open command group, whether a
// capture saga is in flight on it (Guarded), its state (Snapshot, as
// domain.EncodeSnapshot writes it), and the record of its snapshot an audit
// checked (Checked, migrations 00023 and 00024).
type AuditAccount struct {
	AccountID             string
	Next                  uint64
	Chain, GroupKey       string
	GroupNext, GroupCount int
	Guarded               bool
	Snapshot              []byte
	Checked               CheckedSnapshot
	// RefundsTotal is the sum of the refunds of the account's stream up to
	// Next (migration 00026); nil when not known.
	RefundsTotal *int64
}

// CheckedSnapshot is an account's snapshot as an audit found it equal to the
// fold of its stream: its revision and the sha256 of its stored bytes (all
// zero: none), not the bytes (migration 00024).
type CheckedSnapshot struct {
	Revision uint64
	SHA256   [sha256.Size]byte
}

// Recorded reports whether c records a snapshot.
func (c CheckedSnapshot) Recorded() bool { return c.SHA256 != [sha256.Size]byte{} }

func (a *AuditAccount) values(checkpoint int64) []any {
	var (
		rev *int64
		sum []byte
	)
	if a.Checked.Recorded() {
		r := int64(a.Checked.Revision)
		rev, sum = &r, a.Checked.SHA256[:]
	}
	return []any{checkpoint, a.AccountID, int64(a.Next), a.Chain, a.GroupKey, a.GroupNext, a.GroupCount, a.Guarded, a.Snapshot, rev, sum, a.RefundsTotal}
}

var auditAccountColumns = []string{"checkpoint_id", "account_id", "next", "chain", "group_key", "group_next", "group_count", "guarded", "snapshot", "snapshot_revision", "snapshot_sha256", "refunds_total"}

// AuditCheckpointsKept bounds the audit checkpoints stored: SaveAudit drops
// the oldest beyond it, but never an ancestor of one it keeps (a delta's
// chain, auditchain.go). A root holds a row of every account (some 0.5 KB),
// a delta those its audit folded; the table holds at most
// AuditCheckpointsKept+1 roots' rows while a save runs (about 2 GB at
// 1,000,000 accounts, 200 MB at 100,000) beside their deltas (bounded by
// AuditChainMax and compaction): the last for the next --from, and two
// before it should the last be refused (checkpoints of one chain share its
// root and earlier deltas: a shared link refused refuses them all).
const AuditCheckpointsKept = 3

// AuditSave is what SaveAudit stores: the checkpoint, its accounts (Next
// hands them one at a time, false after the last), and, for an audit that
// resumed from an earlier checkpoint, that checkpoint's ID (CarryFrom): its
// rows of the accounts Next does not hand stay the new one's, the new one
// being a delta of it (auditchain.go), or, when its chain is long
// (compactAudit) or CarryNoSnapshots, a root they are copied into. Rows is
// how many accounts the new one must hold a row of in all: SaveAudit fails
// otherwise (CarryFrom dropped meanwhile, say). CarryNoSnapshots keeps those
// rows without the snapshot each records (revision and sha256 NULL): the
// records of a checkpoint whose audit did not check what this one's does.
type AuditSave struct {
	Checkpoint       AuditCheckpoint
	Next             func() (AuditAccount, bool, error)
	CarryFrom        int64
	CarryNoSnapshots bool
	Rows             int64
}

// Beginner starts a transaction: a pool or a connection.
type Beginner interface {
	BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error)
}

// SaveAudit stores an audit checkpoint and its accounts in one transaction
// (the accounts by COPY), then drops the oldest beyond AuditCheckpointsKept
// (their accounts with them) that no kept one chains to, and returns it with
// its ID and its Digest (as the save's transaction wrote it). The save is
// REPEATABLE READ: a compaction's recheck of the rows it carries and their
// copy read one snapshot, so a row edited after the recheck is carried as
// rechecked, not as edited (TestAuditSaveCarriesWhatItRechecked). The drop
// is a READ COMMITTED transaction of its own after the commit: inside the
// save it would fail (SQLSTATE 40001) on a checkpoint another save dropped
// since the snapshot (TestConcurrentAuditSavesBothLand). Should the drop
// fail, the checkpoint is stored all the same and comes with the error; the
// next save drops what this one left.
func (Checkpointer) SaveAudit(ctx context.Context, db Beginner, s AuditSave) (AuditCheckpoint, error) {
	opts := pgx.TxOptions{IsoLevel: pgx.RepeatableRead}
	if err := pgx.BeginTxFunc(ctx, db, opts, func(tx pgx.Tx) error { return saveAudit(ctx, tx, &s) }); err != nil {
		return AuditCheckpoint{}, fmt.Errorf("projections: audit checkpoint: %w", err)
	}
	err := pgx.BeginTxFunc(ctx, db, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, dropOldAuditSQL, AuditCheckpointsKept)
		return err
	})
	if err != nil {
		return s.Checkpoint, fmt.Errorf("projections: audit checkpoint %d stored, dropping the oldest: %w", s.Checkpoint.ID, err)
	}
	return s.Checkpoint, nil
}

// dropOldAuditSQL drops the checkpoints beyond the newest $1 that none of
// those chains to.
var dropOldAuditSQL = `WITH RECURSIVE kept AS (
		(SELECT id, parent_id FROM readmodel.audit_checkpoints WHERE kind = 'checkpoint' ORDER BY id DESC LIMIT $1)
		UNION ` + auditParentsSQL("kept", "p.id, p.parent_id") + `)
	DELETE FROM readmodel.audit_checkpoints WHERE kind = 'checkpoint' AND id NOT IN (SELECT id FROM kept)`

func saveAudit(ctx context.Context, tx pgx.Tx, s *AuditSave) error {
	cp := &s.Checkpoint
	if cp.AccountsTable == "" || cp.ActiveHolds == "" {
		return errors.New("no digest of the accounts read model: a checkpoint is stored only of read models compared at the audit's head")
	}
	pp, err := posArgs(cp.Position)
	if err != nil {
		return err
	}
	var parent *auditParent
	if s.CarryFrom > 0 {
		if parent, err = lockAuditParent(ctx, tx, s.CarryFrom); err != nil {
			return err
		}
		if parent.compact || s.CarryNoSnapshots {
			if err := recheckAudit(ctx, tx, s.CarryFrom); err != nil {
				return err
			}
		}
	}
	parentID, depth := parent.link(s)
	if parentID != nil {
		cp.Parent = *parentID
	}
	if err := tx.QueryRow(ctx, `INSERT INTO readmodel.audit_checkpoints (commit_position, prepare_position, events, state, state_digest, accounts_table_digest, active_holds_digest, snapshots_recorded, parent_id, depth)
		VALUES ($1, $2, $3, $4::bytea, md5($4::bytea), $5::numeric, $6::numeric, true, $7, $8) RETURNING id`, pp.commit, pp.prepare, cp.Events, cp.State, cp.AccountsTable, cp.ActiveHolds, parentID, depth).Scan(&cp.ID); err != nil {
		return err
	}
	rows, err := copyAuditAccounts(ctx, tx, cp.ID, s.Next)
	if err != nil {
		return err
	}
	if parent.chains(s) {
		return saveAuditDelta(ctx, tx, s, parent)
	}
	if s.CarryFrom > 0 {
		carried, err := carryAuditRows(ctx, tx, s)
		if err != nil {
			return err
		}
		rows += carried
	}
	if rows != s.Rows {
		return fmt.Errorf("%d account rows written, %d expected (checkpoint %d carried from dropped meanwhile?)", rows, s.Rows, s.CarryFrom)
	}
	return tx.QueryRow(ctx, `UPDATE readmodel.audit_checkpoints c SET accounts_sha256 = a.digest, rows_sha256 = a.digest, accounts = a.n
		FROM (`+auditRowsDigestSQL("$1")+`) a WHERE c.id = $1 RETURNING `+auditAnchorSQL, cp.ID).Scan(&cp.Digest)
}

// carryAuditRows copies into the root s stores the newest row of its
// chain (s.CarryFrom's) of each account s did not hand (s.CarryNoSnapshots:
// without their records) and returns how many it copied.
func carryAuditRows(ctx context.Context, tx pgx.Tx, s *AuditSave) (int64, error) {
	tag, err := tx.Exec(ctx, `INSERT INTO readmodel.audit_checkpoint_accounts (checkpoint_id, account_id, next, chain, group_key, group_next, group_count, guarded, snapshot, snapshot_revision, snapshot_sha256, refunds_total)
		SELECT $1, account_id, next, chain, group_key, group_next, group_count, guarded, snapshot,
			CASE WHEN $3 THEN NULL ELSE snapshot_revision END, CASE WHEN $3 THEN NULL ELSE snapshot_sha256 END, refunds_total
		FROM `+auditChainRowsSQL("$2", "true")+`
		ON CONFLICT (checkpoint_id, account_id) DO NOTHING`, s.Checkpoint.ID, s.CarryFrom, s.CarryNoSnapshots)
	return tag.RowsAffected(), err
}

// copyAuditAccounts copies the account rows next hands into checkpoint id
// (COPY) and returns how many it copied.
func copyAuditAccounts(ctx context.Context, tx pgx.Tx, id int64, next func() (AuditAccount, bool, error)) (int64, error) {
	src := pgx.CopyFromFunc(func() ([]any, error) {
		a, ok, err := next()
		if !ok || err != nil {
			return nil, err
		}
		return a.values(id), nil
	})
	return tx.CopyFrom(ctx, pgx.Identifier{"readmodel", "audit_checkpoint_accounts"}, auditAccountColumns, src)
}

// auditAnchorSQL is an audit checkpoint c's anchor (AuditCheckpoint.Digest).
// It hashes the state itself with sha256, not its md5 (state_digest), and a
// delta's parent (migration 00030; NULL for a root, which concat_ws skips,
// so a root's anchor is as an earlier build took it): a delta's
// accounts_sha256 binds its chain's rows (auditChainDigest).
const auditAnchorSQL = `encode(sha256(convert_to(concat_ws('|', c.id, c.commit_position, c.prepare_position, c.events, encode(sha256(c.state), 'hex'),
	c.accounts_sha256, c.accounts_table_digest, c.active_holds_digest, c.parent_id), 'UTF8')), 'hex')`

// ErrNoAuditCheckpoint means no audit checkpoint has the ID asked for (or,
// for the last, none was stored).
var ErrNoAuditCheckpoint = errors.New("projections: no such audit checkpoint")

// LoadAudit reads audit checkpoint id, or the last one stored when id is 0,
// and refuses it unless its state matches the digest stored with it and the
// account rows of its chain theirs (checkAuditChain): LoadAuditRow, then
// CheckAuditChain.
func (c Checkpointer) LoadAudit(ctx context.Context, q RowsQuerier, id int64) (AuditCheckpoint, error) {
	cp, err := c.LoadAuditRow(ctx, q, id)
	if err == nil {
		err = c.CheckAuditChain(ctx, q, &cp)
	}
	return cp, err
}

// LoadAuditRow reads audit checkpoint id, or the last one stored when id is
// 0, and refuses it unless its own row matches the digests stored with it;
// the account rows of its chain are not checked, nor counted (Accounts 0):
// CheckAuditChain does that, and must before anything read of them is
// trusted (an incremental audit runs it beside its fold).
func (Checkpointer) LoadAuditRow(ctx context.Context, q RowQuerier, id int64) (AuditCheckpoint, error) {
	var (
		cp      AuditCheckpoint
		c, p    int64
		problem string
		table   *string
		holds   *string
	)
	err := q.QueryRow(ctx, `SELECT c.id, c.commit_position, c.prepare_position, c.events, c.state, c.accounts_table_digest::text, c.active_holds_digest::text, `+auditAnchorSQL+`, `+auditStateCheckedSQL+`
		FROM readmodel.audit_checkpoints c WHERE kind = 'checkpoint' AND ($1::bigint = 0 OR id = $1) ORDER BY id DESC LIMIT 1`, id).Scan(&cp.ID, &c, &p, &cp.Events, &cp.State, &table, &holds, &cp.Digest, &problem)
	if errors.Is(err, pgx.ErrNoRows) {
		return cp, ErrNoAuditCheckpoint
	}
	if err != nil {
		return cp, fmt.Errorf("projections: audit checkpoint: %w", err)
	}
	cp.Position = position(c, p)
	if problem != "" {
		return cp, auditRefused(cp.ID, problem)
	}
	cp.AccountsTable, cp.ActiveHolds = *table, *holds
	return cp, nil
}

// CheckAuditChain checks the account rows of checkpoint cp's chain against
// the digests stored with them (checkAuditChain) and sets cp.Accounts to
// how many accounts they hold; it refuses the checkpoint when they do not
// match.
func (Checkpointer) CheckAuditChain(ctx context.Context, q RowsQuerier, cp *AuditCheckpoint) error {
	accounts, problem, err := checkAuditChain(ctx, q, cp.ID)
	if err != nil {
		return fmt.Errorf("projections: audit checkpoint %d: %w", cp.ID, err)
	}
	if problem != "" {
		return auditRefused(cp.ID, problem)
	}
	cp.Accounts = accounts
	return nil
}

// auditRefused is the error of checkpoint id refused for problem.
func auditRefused(id int64, problem string) error {
	return fmt.Errorf("projections: audit checkpoint %d: %s: run a full audit to store a new one", id, problem)
}

// RowsQuerier reads rows and one row: a pool, a connection or a transaction.
type RowsQuerier interface {
	Querier
	RowQuerier
}

// recheckAudit refuses, in a save's transaction, to carry the rows of
// checkpoint id's chain (a compaction's copy) unless they still match their
// digests: a row edited since it was loaded would be carried into a
// checkpoint whose digest is computed over it. The lock on the checkpoint's
// own row (lockAuditParent, which checks its state) keeps it from being
// dropped meanwhile, not its account rows from being edited: the save's
// snapshot (REPEATABLE READ, SaveAudit) is what makes the copy carry the
// rows as rechecked here.
func recheckAudit(ctx context.Context, tx pgx.Tx, id int64) error {
	_, problem, err := checkAuditChain(ctx, tx, id)
	if err == nil && problem != "" {
		err = fmt.Errorf("checkpoint %d carried from: %s", id, problem)
	}
	return err
}

// auditStateCheckedSQL checks an audit checkpoint c's own row against its
// digests: why it is refused (” when it is not); its account rows are
// checkAuditChain's.
const auditStateCheckedSQL = `CASE
		WHEN c.state_digest IS NULL OR c.accounts_table_digest IS NULL OR c.active_holds_digest IS NULL OR c.accounts_sha256 IS NULL
			THEN 'a checkpoint of an earlier build, without its digests'
		WHEN c.snapshots_recorded IS NULL
			THEN 'a checkpoint of an earlier build, without the record of the snapshots its audit checked (migration 00023)'
		WHEN c.state_digest <> md5(c.state) THEN 'its state does not match the digest stored with it (edited since)'
		ELSE '' END`

// auditRowsDigestSQL selects the count (n) and the digest (migration 00017)
// of the account rows of checkpoint id (an SQL expression): sha256 over the
// sha256 of each row's text form (a record's: every column quoted as
// needed, so no text moves from one column to the next unseen; the recorded
// snapshot's sha256 as 00023 took it of its bytes, so the digests of rows
// stored before 00024 stand; the refunds' total, 00026, only when it is not
// NULL, so the digests of rows stored before 00026 stand), sorted, so
// that any order of reading gives it. Two sets of rows with one digest are a
// sha256 collision.
func auditRowsDigestSQL(id string) string {
	return `SELECT count(*) AS n, encode(sha256(coalesce(string_agg(h, ''::bytea ORDER BY h), ''::bytea)), 'hex') AS digest
		FROM (SELECT sha256(convert_to(CASE WHEN refunds_total IS NULL
				THEN row(account_id, next, chain, group_key, group_next, group_count, guarded, sha256(snapshot), snapshot_revision, snapshot_sha256)::text
				ELSE row(account_id, next, chain, group_key, group_next, group_count, guarded, sha256(snapshot), snapshot_revision, snapshot_sha256, refunds_total)::text END, 'UTF8')) AS h
			FROM readmodel.audit_checkpoint_accounts WHERE checkpoint_id = ` + id + `) rows`
}

// AuditSnapshotNext is an account's row of an audit checkpoint as an
// incremental audit reads it to tell a snapshot: its stream's next revision
// and the record of its checked snapshot, its revision and the sha256 of its
// bytes (nil: none).
type AuditSnapshotNext struct {
	AccountID     string
	Next          uint64
	Checked       uint64
	CheckedSHA256 []byte
}

// AuditAccountNext reads, of audit checkpoint id, each named account's next
// revision and checked snapshot's record (AuditSnapshotNext; an account the
// checkpoint does not hold is not handed), without its state or the
// snapshot's bytes: what an incremental audit needs to tell a snapshot the
// checkpoint passed, and one it recorded.
func (Checkpointer) AuditAccountNext(ctx context.Context, q Querier, id int64, ids []string, each func(AuditSnapshotNext) error) error {
	rows, err := q.Query(ctx, `SELECT account_id, next, coalesce(snapshot_revision, -1), snapshot_sha256 FROM `+
		auditChainRowsSQL("$1", "account_id = ANY($2::text[])"), id, ids)
	if err != nil {
		return fmt.Errorf("projections: audit checkpoint %d: accounts: %w", id, err)
	}
	var (
		a         AuditSnapshotNext
		next, rev int64
	)
	_, err = pgx.ForEachRow(rows, []any{&a.AccountID, &next, &rev, &a.CheckedSHA256}, func() error {
		a.Next, a.Checked = uint64(next), uint64(max(rev, 0))
		return each(a)
	})
	if err != nil {
		return fmt.Errorf("projections: audit checkpoint %d: accounts: %w", id, err)
	}
	return nil
}

// LoadAuditAccounts reads the rows of audit checkpoint id (the newest of
// its chain's, auditChainRowsSQL) of the accounts named (an account the
// checkpoint does not hold is not handed), and, when guarded, of every
// account with a capture saga in flight, handing each to each.
func (Checkpointer) LoadAuditAccounts(ctx context.Context, q Querier, id int64, ids []string, guarded bool, each func(AuditAccount) error) error {
	// The guarded rows of the chain name the candidates; an account's
	// newest row says whether it is still guarded.
	from := auditChainRowsSQL("$1", `(account_id = ANY($2::text[]) OR $3 AND account_id IN (SELECT g.account_id FROM readmodel.audit_checkpoint_accounts g
		WHERE g.checkpoint_id IN (`+auditChainIDsSQL("$1")+`) AND g.guarded))`) + ` WHERE account_id = ANY($2::text[]) OR ($3 AND guarded)`
	return loadAuditAccounts(ctx, q, id, each, from, ids, guarded)
}

// loadAuditAccounts hands each to each of the account rows that from (a
// FROM clause on checkpoint $1 and its further arguments, $2 on) selects.
func loadAuditAccounts(ctx context.Context, q Querier, id int64, each func(AuditAccount) error, from string, args ...any) error {
	rows, err := q.Query(ctx, `SELECT account_id, next, chain, group_key, group_next, group_count, guarded, snapshot, coalesce(snapshot_revision, 0), snapshot_sha256, refunds_total
		FROM `+from, append([]any{id}, args...)...)
	if err != nil {
		return fmt.Errorf("projections: audit checkpoint %d: accounts: %w", id, err)
	}
	var (
		a         AuditAccount
		next, rev int64
		sum       []byte
		total     pgtype.Int8
	)
	_, err = pgx.ForEachRow(rows, []any{&a.AccountID, &next, &a.Chain, &a.GroupKey, &a.GroupNext, &a.GroupCount, &a.Guarded, &a.Snapshot, &rev, &sum, &total}, func() error {
		a.Next, a.Checked, a.RefundsTotal = uint64(next), CheckedSnapshot{Revision: uint64(rev)}, nil
		if total.Valid {
			v := total.Int64
			a.RefundsTotal = &v
		}
		copy(a.Checked.SHA256[:], sum) // nil: none; 32 bytes by 00024's check
		return each(a)
	})
	if err != nil {
		return fmt.Errorf("projections: audit checkpoint %d: accounts: %w", id, err)
	}
	return nil
}

// AuditStop is a stopped full audit's stop point (migration 00028): a row of
// audit_checkpoints of kind 'stop', never a checkpoint (LoadAudit never
// selects it), with its account rows. Sets is the schema of its sets that
// grow with history (UNLOGGED tables, named by its run).
type AuditStop struct {
	Checkpoint AuditCheckpoint // ID, Position, Events, State, Accounts, Digest (auditStopAnchorSQL); no digests of read models
	Sets       string
}

// ErrNoAuditStop means no stop point is stored.
var ErrNoAuditStop = errors.New("projections: no audit stop point")

// ErrAuditStopEdited means the stop point's state or account rows do not
// match the digests stored with them.
var ErrAuditStopEdited = errors.New("projections: audit stop point edited since it was stored")

// SaveAuditStop stores a stopped full audit's stop point in one transaction:
// s's position, events and state (md5'd as a checkpoint's) and its accounts
// (s.Next, s.Rows of them; digested as a checkpoint's), with sets, in place
// of the stop point stored before, if any: it returns that one's sets (""
// when none), which the caller drops. s.CarryFrom and the read models'
// digests are not used: a stop point is no verdict.
func (Checkpointer) SaveAuditStop(ctx context.Context, db Beginner, s AuditSave, sets string) (AuditStop, string, error) {
	stop := AuditStop{Checkpoint: s.Checkpoint, Sets: sets}
	var replaced string
	err := pgx.BeginTxFunc(ctx, db, pgx.TxOptions{}, func(tx pgx.Tx) error {
		var err error
		if replaced, err = dropAuditStop(ctx, tx); err != nil {
			return err
		}
		return saveAuditStop(ctx, tx, &stop, s)
	})
	if err != nil {
		return AuditStop{}, "", fmt.Errorf("projections: audit stop point: %w", err)
	}
	return stop, replaced, nil
}

func saveAuditStop(ctx context.Context, tx pgx.Tx, stop *AuditStop, s AuditSave) error {
	cp := &stop.Checkpoint
	pp, err := posArgs(cp.Position)
	if err != nil {
		return err
	}
	if err := tx.QueryRow(ctx, `INSERT INTO readmodel.audit_checkpoints (kind, sets, commit_position, prepare_position, events, state, state_digest, snapshots_recorded)
		VALUES ('stop', $1, $2, $3, $4, $5::bytea, md5($5::bytea), true) RETURNING id`, stop.Sets, pp.commit, pp.prepare, cp.Events, cp.State).Scan(&cp.ID); err != nil {
		return err
	}
	rows, err := copyAuditAccounts(ctx, tx, cp.ID, s.Next)
	if err != nil {
		return err
	}
	if rows != s.Rows {
		return fmt.Errorf("%d account rows written, %d expected", rows, s.Rows)
	}
	cp.Accounts = rows
	return tx.QueryRow(ctx, `UPDATE readmodel.audit_checkpoints c SET accounts_sha256 = (SELECT a.digest FROM (`+auditRowsDigestSQL("$1")+`) a)
		WHERE c.id = $1 RETURNING `+auditStopAnchorSQL, cp.ID).Scan(&cp.Digest)
}

// auditStopAnchorSQL is a stop point c's anchor (its Checkpoint.Digest): a
// checkpoint's (auditAnchorSQL, its read models' digests NULL) with its kind
// and sets, so that no stop point's digest is a checkpoint's.
const auditStopAnchorSQL = `encode(sha256(convert_to(concat_ws('|', c.kind, c.sets, ` + auditAnchorSQL + `), 'UTF8')), 'hex')`

// LoadAuditStop reads the stop point (ErrNoAuditStop: none), and refuses it
// (ErrAuditStopEdited, its Sets given all the same) unless its state and
// account rows match the digests stored with them.
func (Checkpointer) LoadAuditStop(ctx context.Context, q RowQuerier) (AuditStop, error) {
	var (
		stop AuditStop
		cp   = &stop.Checkpoint
		c, p int64
		ok   bool
	)
	err := q.QueryRow(ctx, `SELECT c.id, c.sets, c.commit_position, c.prepare_position, c.events, c.state, a.n,
			coalesce(c.state_digest = md5(c.state) AND c.accounts_sha256 = a.digest, false), `+auditStopAnchorSQL+`
		FROM readmodel.audit_checkpoints c CROSS JOIN LATERAL (`+auditRowsDigestSQL("c.id")+`) a WHERE c.kind = 'stop'`).Scan(&cp.ID, &stop.Sets, &c, &p, &cp.Events, &cp.State, &cp.Accounts, &ok, &cp.Digest)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return stop, ErrNoAuditStop
	case err != nil:
		return stop, fmt.Errorf("projections: audit stop point: %w", err)
	case !ok:
		return stop, fmt.Errorf("%w: its state or its %d account rows do not match the digests stored with them", ErrAuditStopEdited, cp.Accounts)
	}
	cp.Position = position(c, p)
	return stop, nil
}

// AllAuditAccounts hands each to each of the account rows of stop point id
// (its own: a stop point is never a delta), in no order.
func (Checkpointer) AllAuditAccounts(ctx context.Context, q Querier, id int64, each func(AuditAccount) error) error {
	return loadAuditAccounts(ctx, q, id, each, `readmodel.audit_checkpoint_accounts WHERE checkpoint_id = $1`)
}

// DropAuditStop drops stop point id, if it is still stored (not replaced
// since), with its account rows, and returns its sets ("" when not), which
// the caller drops.
func (Checkpointer) DropAuditStop(ctx context.Context, db execer, id int64) (string, error) {
	var sets string
	err := db.QueryRow(ctx, `DELETE FROM readmodel.audit_checkpoints WHERE kind = 'stop' AND id = $1 RETURNING sets`, id).Scan(&sets)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return "", nil
	case err != nil:
		return "", fmt.Errorf("projections: audit stop point %d: %w", id, err)
	}
	return sets, nil
}

// AuditStopOf reads the stop point's ID and sets: of stop point id, or of
// the one stored whatever its ID when id is 0 (ErrNoAuditStop: none such).
func (Checkpointer) AuditStopOf(ctx context.Context, q RowQuerier, id int64) (int64, string, error) {
	var sets string
	err := q.QueryRow(ctx, `SELECT id, sets FROM readmodel.audit_checkpoints WHERE kind = 'stop' AND ($1 = 0 OR id = $1)`, id).Scan(&id, &sets)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return 0, "", ErrNoAuditStop
	case err != nil:
		return 0, "", fmt.Errorf("projections: audit stop point: %w", err)
	}
	return id, sets, nil
}

// AuditStopNames reports whether the stop point names sets (a run's schema).
// A database without the checkpoints' table (not migrated) stores no stop
// point: false.
func (Checkpointer) AuditStopNames(ctx context.Context, q RowQuerier, sets string) (bool, error) {
	var named bool
	err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM readmodel.audit_checkpoints WHERE kind = 'stop' AND sets = $1)`, sets).Scan(&named)
	if pgerr.IsUndefinedTable(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("projections: audit stop point: %w", err)
	}
	return named, nil
}

func dropAuditStop(ctx context.Context, db execer) (string, error) {
	var sets string
	err := db.QueryRow(ctx, `DELETE FROM readmodel.audit_checkpoints WHERE kind = 'stop' RETURNING sets`).Scan(&sets)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	return sets, err
}
