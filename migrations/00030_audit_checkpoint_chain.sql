-- Audit checkpoints in chains (issue 23: an incremental audit's save costs
-- the accounts it touched, not every account; docs/design.md, "The audit
-- checkpoints' chain"):
--
-- audit_checkpoints.parent_id
--                       NULL: a root, which holds a row of every account
--                       (every checkpoint stored before 00030, and each a
--                       full audit or a compaction stores). Otherwise a
--                       delta: an incremental audit's checkpoint that holds
--                       only the rows of the accounts its audit folded, the
--                       others' trusted row being the newest of its chain
--                       (parent_id, its parent's, ... its root). A parent is
--                       never dropped before its children (no cascade; the
--                       save's drop of the oldest keeps every ancestor of
--                       the checkpoints it keeps).
-- audit_checkpoints.depth
--                       0 for a root, its parent's plus one for a delta: a
--                       save compacts (stores a root) past a bound on it.
-- audit_checkpoints.rows_sha256
--                       the checkpoint's own rows' digest (as 00017's
--                       accounts_sha256 takes it of every row); NULL on a
--                       root stored before 00030, whose accounts_sha256 is
--                       that digest. A delta's accounts_sha256 is
--                       sha256(parent's accounts_sha256 | rows_sha256), so
--                       its anchor (the digest an operator keeps) binds every
--                       row of its chain.
-- audit_checkpoints.accounts
--                       how many accounts the chain holds a row of (its
--                       state's account_rows); NULL on a root stored before
--                       00030: its own rows' count.
--
-- Nothing is rewritten: an old checkpoint keeps its digest and anchor and is
-- a chain's root as it is.

-- +goose Up
-- ALTER TABLE takes ACCESS EXCLUSIVE on the checkpoints, which an audit reads
-- in its long transaction: past lock_timeout the migration fails, rolled
-- back, rather than queueing every reader of the table behind it (as 00018).
SET LOCAL lock_timeout = '10s';
-- +goose StatementBegin
DO $do$
BEGIN
    ALTER TABLE readmodel.audit_checkpoints
        ADD COLUMN parent_id bigint REFERENCES readmodel.audit_checkpoints (id),
        ADD COLUMN depth integer NOT NULL DEFAULT 0 CONSTRAINT audit_checkpoints_depth CHECK (depth >= 0 AND (depth = 0) = (parent_id IS NULL)),
        ADD COLUMN rows_sha256 text,
        ADD COLUMN accounts bigint CONSTRAINT audit_checkpoints_accounts CHECK (accounts >= 0),
        ADD CONSTRAINT audit_checkpoints_delta CHECK (parent_id IS NULL OR kind = 'checkpoint');
    CREATE INDEX audit_checkpoints_parent ON readmodel.audit_checkpoints (parent_id) WHERE parent_id IS NOT NULL;
EXCEPTION WHEN lock_not_available THEN
    RAISE EXCEPTION 'migration 00030 waited more than lock_timeout (%) for a lock on the audit checkpoints (%) and changed nothing: stop audits (ledger audit) and other long transactions on them, then migrate again (docs/operations.md, "Upgrading")',
        current_setting('lock_timeout'), SQLERRM USING ERRCODE = 'lock_not_available';
END
$do$;
-- +goose StatementEnd

-- +goose Down
SET LOCAL lock_timeout = '10s';
-- The build before reads a delta as a checkpoint of its own rows alone (and
-- refuses it: its digest is the chain's): the deltas go, the roots stay as
-- they were stored.
DELETE FROM readmodel.audit_checkpoints WHERE parent_id IS NOT NULL;
DROP INDEX readmodel.audit_checkpoints_parent;
ALTER TABLE readmodel.audit_checkpoints DROP COLUMN accounts, DROP COLUMN rows_sha256, DROP COLUMN depth, DROP COLUMN parent_id;
