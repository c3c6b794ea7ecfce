package projections

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// The audit checkpoints' chain (migration 00030; docs/design.md, "The audit
// checkpoints' chain"). An incremental audit's checkpoint is a delta of the
// checkpoint it resumed from (its parent): it holds only the rows of the
// accounts its audit folded, and an account's trusted row is the newest of
// its chain (the delta, its parent, ... its root, which holds a row of every
// account: a full audit's checkpoint, a compaction's, or any stored before
// 00030). Checkpoint IDs grow along a chain (a child is inserted after its
// parent), so the newest row of an account is the one of the highest
// checkpoint ID.
//
// A delta's accounts_sha256 is auditChainDigest(its parent's, its own rows'
// digest): its anchor binds every row of its chain, and a load checks each
// link's rows against its own digest (checkAuditChain). A save stores a
// delta without reading its parent's rows; past AuditChainMax deltas, or
// once the chain's deltas hold as many rows as it has accounts, it compacts:
// it stores a root, copying the chain's newest rows of the accounts it did
// not fold (compactAudit).

// AuditChainMax bounds a chain's deltas: a save from a checkpoint this deep
// stores a root.
const AuditChainMax = 8

// auditChainDigest is a delta's accounts_sha256: sha256 of its parent's
// accounts_sha256 and its own rows' digest (hex, as auditRowsDigestSQL
// gives it), in hex.
func auditChainDigest(parent, own string) string {
	h := sha256.Sum256([]byte(parent + "|" + own))
	return hex.EncodeToString(h[:])
}

// auditParentsSQL is the one rule of every walk up a chain: the recursive
// step of a CTE named cte, selecting cols of the checkpoints p that are
// parents of its rows. A parent is followed only to a lower ID (a child is
// inserted after its parent), so an edited parent_id cannot make a walk
// loop (TestAuditChainWalkStopsAtAHigherParent).
func auditParentsSQL(cte, cols string) string {
	return `SELECT ` + cols + ` FROM readmodel.audit_checkpoints p JOIN ` + cte + ` ch ON p.id = ch.parent_id AND p.id < ch.id`
}

// auditChainIDsSQL selects the IDs of checkpoint id's chain (id an SQL
// expression): itself, its parent, ... its root.
func auditChainIDsSQL(id string) string {
	return `WITH RECURSIVE chain AS (SELECT id, parent_id FROM readmodel.audit_checkpoints WHERE id = ` + id + `
		UNION ALL ` + auditParentsSQL("chain", "p.id, p.parent_id") + `)
		SELECT id FROM chain`
}

// auditChainRowsSQL is a FROM clause (a subquery) of the newest row of each
// account in checkpoint id's chain, of the rows where (an SQL condition on
// audit_checkpoint_accounts' columns) selects.
func auditChainRowsSQL(id, where string) string {
	return `(SELECT DISTINCT ON (account_id) * FROM readmodel.audit_checkpoint_accounts
		WHERE checkpoint_id IN (` + auditChainIDsSQL(id) + `) AND ` + where + `
		ORDER BY account_id, checkpoint_id DESC) newest`
}

// auditAddedSQL counts the rows of checkpoint id whose account has no row in
// the checkpoints ancestors (an SQL bigint[]): the accounts its delta adds
// to its chain.
func auditAddedSQL(id, ancestors string) string {
	return `(SELECT count(*) FROM readmodel.audit_checkpoint_accounts r WHERE r.checkpoint_id = ` + id + `
		AND NOT EXISTS (SELECT 1 FROM readmodel.audit_checkpoint_accounts o WHERE o.checkpoint_id = ANY(` + ancestors + `) AND o.account_id = r.account_id))`
}

// auditParent is the checkpoint a save resumed from, locked (FOR SHARE) in
// the save's transaction: its chain's depth, accounts and digest, its chain's
// IDs, and whether the save compacts.
type auditParent struct {
	id       int64
	depth    int
	accounts int64
	sha      string
	chain    []int64
	compact  bool
}

// lockAuditParent locks checkpoint id and reads what a delta of it needs,
// refusing it when its own row no longer matches its digests (its state
// edited since the audit loaded it; its chain's rows are checked by every
// load of the delta, or by a compaction's recheckAudit).
// A root stored before 00030 has no accounts count: its rows are counted
// (once: its delta stores its own).
func lockAuditParent(ctx context.Context, tx pgx.Tx, id int64) (*auditParent, error) {
	p := &auditParent{id: id}
	var deltaRows int64
	var problem string
	err := tx.QueryRow(ctx, `SELECT `+auditStateCheckedSQL+`, c.depth, coalesce(c.accounts_sha256, ''),
			coalesce(c.accounts, (SELECT count(*) FROM readmodel.audit_checkpoint_accounts a WHERE a.checkpoint_id = c.id)),
			ARRAY(`+auditChainIDsSQL("c.id")+`),
			(SELECT count(*) FROM readmodel.audit_checkpoint_accounts a WHERE a.checkpoint_id IN (`+auditChainIDsSQL("c.id")+`)
				AND a.checkpoint_id IN (SELECT d.id FROM readmodel.audit_checkpoints d WHERE d.parent_id IS NOT NULL))
		FROM readmodel.audit_checkpoints c WHERE c.id = $1 AND c.kind = 'checkpoint' FOR SHARE OF c`, id).Scan(&problem, &p.depth, &p.sha, &p.accounts, &p.chain, &deltaRows)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("checkpoint %d carried from: %w", id, ErrNoAuditCheckpoint)
	}
	if err != nil {
		return nil, err
	}
	if problem != "" {
		return nil, fmt.Errorf("checkpoint %d carried from: %s", id, problem)
	}
	p.compact = p.depth+1 > AuditChainMax || deltaRows >= p.accounts
	return p, nil
}

// chains reports whether save s stores a delta of p (a save from no
// checkpoint, or one that compacts, or one that keeps no record of the
// snapshots its parent's rows carry, stores a root).
func (p *auditParent) chains(s *AuditSave) bool {
	return p != nil && !p.compact && !s.CarryNoSnapshots
}

// link is the parent and depth of the checkpoint s stores: p's ID and one
// more than its depth for a delta, nil and 0 for a root.
func (p *auditParent) link(s *AuditSave) (*int64, int) {
	if !p.chains(s) {
		return nil, 0
	}
	return &p.id, p.depth + 1
}

// saveAuditDelta ends the save of a delta of parent, its rows copied: its
// own rows' digest, its chain's (auditChainDigest) and how many accounts its
// chain holds, which must be s.Rows.
func saveAuditDelta(ctx context.Context, tx pgx.Tx, s *AuditSave, parent *auditParent) error {
	cp := &s.Checkpoint
	var (
		own   string
		added int64
	)
	err := tx.QueryRow(ctx, `SELECT d.digest, `+auditAddedSQL("$1", "$2::bigint[]")+` FROM (`+auditRowsDigestSQL("$1")+`) d`, cp.ID, parent.chain).Scan(&own, &added)
	if err != nil {
		return err
	}
	if n := parent.accounts + added; n != s.Rows {
		return fmt.Errorf("a chain of %d accounts written, %d expected (checkpoint %d carried from dropped meanwhile?)", n, s.Rows, s.CarryFrom)
	}
	return tx.QueryRow(ctx, `UPDATE readmodel.audit_checkpoints c SET rows_sha256 = $2, accounts_sha256 = $3, accounts = $4 WHERE c.id = $1 RETURNING `+auditAnchorSQL,
		cp.ID, own, auditChainDigest(parent.sha, own), parent.accounts+added).Scan(&cp.Digest)
}

// auditLink is a checkpoint of a chain as checkAuditChain reads it, with
// its own rows' count and digest and the accounts it adds to its chain.
type auditLink struct {
	id, parent      int64
	depth           int
	kind, rows, sha string
	accounts        *int64
	n, added        int64
	digest          string
}

// checkAuditChain checks the account rows of checkpoint id's chain against
// the digests stored with them: each checkpoint's own rows against its own
// digest, each delta's chain digest against its parent's, and the accounts
// each counts. It returns how many accounts the chain holds a row of, and
// why it is refused ("" when it is not).
func checkAuditChain(ctx context.Context, q RowsQuerier, id int64) (int64, string, error) {
	rows, err := q.Query(ctx, `WITH RECURSIVE chain AS (
			SELECT id, parent_id, depth, kind, rows_sha256, accounts_sha256, accounts FROM readmodel.audit_checkpoints WHERE id = $1
			UNION ALL `+auditParentsSQL("chain", "p.id, p.parent_id, p.depth, p.kind, p.rows_sha256, p.accounts_sha256, p.accounts")+`)
		SELECT ch.id, coalesce(ch.parent_id, 0), ch.depth, ch.kind, coalesce(ch.rows_sha256, ''), coalesce(ch.accounts_sha256, ''), ch.accounts, d.n, d.digest,
			CASE WHEN ch.parent_id IS NULL THEN d.n ELSE `+auditAddedSQL("ch.id", "ARRAY(SELECT a.id FROM chain a WHERE a.id < ch.id)")+` END
		FROM chain ch CROSS JOIN LATERAL (`+auditRowsDigestSQL("ch.id")+`) d ORDER BY ch.id`, id)
	if err != nil {
		return 0, "", err
	}
	var (
		links []auditLink
		l     auditLink
	)
	_, err = pgx.ForEachRow(rows, []any{&l.id, &l.parent, &l.depth, &l.kind, &l.rows, &l.sha, &l.accounts, &l.n, &l.digest, &l.added}, func() error {
		links = append(links, l)
		return nil
	})
	if err != nil {
		return 0, "", err
	}
	var accounts int64
	for i, l := range links {
		accounts += l.added
		if problem := l.check(i, links, accounts); problem != "" {
			return 0, problem, nil
		}
	}
	return accounts, "", nil
}

// check is why link i of a chain (root first) is refused, accounts being
// how many accounts the chain holds up to it ("" when it is not).
func (l auditLink) check(i int, links []auditLink, accounts int64) string {
	own := l.rows
	if i == 0 && own == "" {
		own = l.sha // a root stored before 00030
	}
	switch {
	case l.kind != "checkpoint":
		return fmt.Sprintf("its chain holds %d, a %s, not a checkpoint", l.id, l.kind)
	case i == 0 && l.parent != 0:
		return fmt.Sprintf("its chain's checkpoint %d names a parent %d that is not stored before it (dropped or edited since)", l.id, l.parent)
	case i > 0 && l.parent != links[i-1].id, l.depth != i:
		return fmt.Sprintf("its chain's checkpoint %d is not where its parent and depth say (edited since)", l.id)
	case l.digest != own, i == 0 && l.sha != own, i > 0 && l.sha != auditChainDigest(links[i-1].sha, own):
		return fmt.Sprintf("its chain's checkpoint %d: its %d account rows do not match the digest stored with them (edited since)", l.id, l.n)
	case l.accounts != nil && *l.accounts != accounts:
		return fmt.Sprintf("its chain's checkpoint %d counts %d accounts, its chain holds %d (edited since)", l.id, *l.accounts, accounts)
	}
	return ""
}
