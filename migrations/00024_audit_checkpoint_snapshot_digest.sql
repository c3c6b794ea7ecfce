-- Audit checkpoints record the sha256 of the snapshot their audit checked, not
-- its bytes (issue 23: a snapshot is bounded only by the ledger's
-- --recent-holds and --recent-refunds, up to some 300 KB, and each account
-- row of each kept checkpoint held one; no audit folds from a recorded
-- snapshot any more, so its bytes are never read back):
--
-- audit_checkpoint_accounts.snapshot_sha256
--                       sha256 of the stored bytes of the account's snapshot
--                       the audit checked (NULL with snapshot_revision NULL:
--                       none), in place of 00023's snapshot_data. The rows'
--                       digest (00017's accounts_sha256) took sha256 of
--                       snapshot_data, so it takes this column as it is: a
--                       checkpoint stored before 00024 keeps its digest and
--                       anchor, and an incremental audit from it trusts
--                       what it trusted before (internal/app/audit/snapshots.go).

-- +goose Up
-- ALTER TABLE takes ACCESS EXCLUSIVE on the checkpoints' rows, which an audit
-- reads in its long transaction: past lock_timeout the migration fails,
-- rolled back, rather than queueing every reader behind it (as 00018).
SET LOCAL lock_timeout = '10s';
-- +goose StatementBegin
DO $do$
BEGIN
    ALTER TABLE readmodel.audit_checkpoint_accounts ADD COLUMN snapshot_sha256 bytea;
    UPDATE readmodel.audit_checkpoint_accounts SET snapshot_sha256 = sha256(snapshot_data) WHERE snapshot_data IS NOT NULL;
    ALTER TABLE readmodel.audit_checkpoint_accounts DROP COLUMN snapshot_data,
        ADD CONSTRAINT audit_checkpoint_accounts_snapshot_sha256 CHECK (octet_length(snapshot_sha256) = 32 AND snapshot_revision IS NOT NULL OR snapshot_sha256 IS NULL AND snapshot_revision IS NULL);
EXCEPTION WHEN lock_not_available THEN
    RAISE EXCEPTION 'migration 00024 waited more than lock_timeout (%) for a lock on the audit checkpoints (%) and changed nothing: stop audits (ledger audit) and other long transactions on them, then migrate again (docs/operations.md, "Upgrading")',
        current_setting('lock_timeout'), SQLERRM USING ERRCODE = 'lock_not_available';
END
$do$;
-- +goose StatementEnd

-- +goose Down
SET LOCAL lock_timeout = '10s';
-- The bytes are gone: the build before would find the rows of a checkpoint
-- that records a snapshot changed (its digest takes sha256(snapshot_data))
-- and refuse it as edited; these go, the others keep their digest.
DELETE FROM readmodel.audit_checkpoints c WHERE EXISTS (
    SELECT 1 FROM readmodel.audit_checkpoint_accounts a WHERE a.checkpoint_id = c.id AND a.snapshot_sha256 IS NOT NULL);
ALTER TABLE readmodel.audit_checkpoint_accounts DROP COLUMN snapshot_sha256, ADD COLUMN snapshot_data bytea;
