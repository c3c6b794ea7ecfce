-- Audit checkpoints' record of the snapshots their audit checked (issue 23,
-- the incremental audit's snapshot rule made exact), in place of 00022's
-- clock:
--
-- audit_checkpoint_accounts.snapshot_revision, snapshot_data
--                       the account's snapshot the audit that stored the
--                       checkpoint (or one it resumed from) checked against
--                       the fold: its revision and its stored bytes (NULL,
--                       NULL: none). They are in the row's digest (00017's
--                       accounts_sha256, so in the checkpoint's anchor). An
--                       incremental audit from the checkpoint trusts a
--                       snapshot of a revision the checkpoint passed only
--                       when its row records it with the same bytes; it
--                       checks any other one by folding its account's
--                       stream from the recorded snapshot below it
--                       (internal/app/audit/snapshots.go).
-- audit_checkpoints.snapshots_recorded
--                       true for a checkpoint whose rows carry that record.
--
-- snapshots_listed_at (00022) goes. A checkpoint without snapshots_recorded
-- (NULL: one of an earlier build, with no record) is refused: a full audit
-- stores a new one (docs/operations.md, "Upgrading").

-- +goose Up
-- ALTER TABLE takes ACCESS EXCLUSIVE on the checkpoints, which an audit reads
-- in its long transaction: past lock_timeout the migration fails, rolled
-- back, rather than queueing every reader of the tables behind it (as 00018).
SET LOCAL lock_timeout = '10s';
-- +goose StatementBegin
DO $do$
BEGIN
    ALTER TABLE readmodel.audit_checkpoints DROP COLUMN snapshots_listed_at, ADD COLUMN snapshots_recorded boolean;
    ALTER TABLE readmodel.audit_checkpoint_accounts ADD COLUMN snapshot_revision bigint, ADD COLUMN snapshot_data bytea;
EXCEPTION WHEN lock_not_available THEN
    RAISE EXCEPTION 'migration 00023 waited more than lock_timeout (%) for a lock on the audit checkpoints (%) and changed nothing: stop audits (ledger audit) and other long transactions on them, then migrate again (docs/operations.md, "Upgrading")',
        current_setting('lock_timeout'), SQLERRM USING ERRCODE = 'lock_not_available';
END
$do$;
-- +goose StatementEnd

-- +goose Down
SET LOCAL lock_timeout = '10s';
-- The build before 00023 refuses a checkpoint without snapshots_listed_at:
-- these go.
DELETE FROM readmodel.audit_checkpoints WHERE snapshots_recorded;
ALTER TABLE readmodel.audit_checkpoint_accounts DROP COLUMN snapshot_revision, DROP COLUMN snapshot_data;
ALTER TABLE readmodel.audit_checkpoints DROP COLUMN snapshots_recorded, ADD COLUMN snapshots_listed_at timestamptz;
