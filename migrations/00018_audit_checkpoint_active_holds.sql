-- Audit checkpoints' digest of the active holds (issue 23, the incremental
-- audit's whole-table checks): 00016's holds_table_digest summed a hash of
-- every row of the holds table, which keeps every hold ever placed, so that
-- each incremental audit (`ledger audit --from`) hashed the whole history of
-- holds, whatever its window (20.7 s at 1,000,000 accounts with four holds
-- each, BENCHMARKS.md).
--
-- active_holds_digest   the holds read model's rows of active holds as the
--                       audit that stored the checkpoint found them equal to
--                       its fold, summed as 64-bit hashes of each row
--                       (internal/app/audit/holdsdigest.go): an incremental
--                       audit compares the active holds no event after the
--                       checkpoint touched with it, less the touched holds'
--                       rows then (those active then). A hold closed
--                       (captured, released, expired) before the checkpoint
--                       takes no event after it, and its row is trusted as
--                       the history rows before the checkpoint are; one
--                       closed since is touched, and compared row by row.
--
-- holds_table_digest is no longer written. A checkpoint without
-- active_holds_digest (NULL: one of an earlier build) is refused: a full
-- audit stores a new one.

-- +goose Up
-- ADD COLUMN takes ACCESS EXCLUSIVE on the checkpoints, which an audit reads
-- in its long transaction: past lock_timeout the migration fails, rolled
-- back, rather than queueing every reader of the table behind it
-- (docs/operations.md, "Upgrading"; as 00015 does).
SET LOCAL lock_timeout = '10s';
-- +goose StatementBegin
DO $do$
BEGIN
    ALTER TABLE readmodel.audit_checkpoints ADD COLUMN active_holds_digest numeric;
EXCEPTION WHEN lock_not_available THEN
    RAISE EXCEPTION 'migration 00018 waited more than lock_timeout (%) for a lock on readmodel.audit_checkpoints (%) and changed nothing: stop audits (ledger audit) and other long transactions on it, then migrate again (docs/operations.md, "Upgrading")',
        current_setting('lock_timeout'), SQLERRM USING ERRCODE = 'lock_not_available';
END
$do$;
-- +goose StatementEnd

-- +goose Down
SET LOCAL lock_timeout = '10s';
-- An earlier build would refuse these checkpoints (no holds_table_digest):
-- they go.
DELETE FROM readmodel.audit_checkpoints WHERE active_holds_digest IS NOT NULL;
ALTER TABLE readmodel.audit_checkpoints DROP COLUMN active_holds_digest;
