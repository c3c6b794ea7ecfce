-- Audit checkpoints carry, per account, the sum of the refunds of its stream
-- up to the checkpoint (issue 23: a snapshot that says it forgot no refunded
-- original is checked against that sum, not by reading its stream):
--
-- audit_checkpoint_accounts.refunds_total
--                       the sum of the amounts of every refund (a credit or
--                       debit of reason refund) of the account's stream up
--                       to the row's revision; NULL when it is not known (a
--                       row stored before 00026, or one carried from such a
--                       row, or a stream with a refund of no positive amount
--                       or a sum beyond bigint): an audit then reads the
--                       account's stream, as before, to check such a
--                       snapshot (internal/app/audit/snapshotrefunds.go).
--                       It is in the row's digest (00017's accounts_sha256)
--                       when it is not NULL, so the digests of rows stored
--                       before 00026 stand, and a value edited, added or
--                       set to NULL since is a checkpoint refused.

-- +goose Up
-- ALTER TABLE takes ACCESS EXCLUSIVE on the checkpoints' rows, which an audit
-- reads in its long transaction: past lock_timeout the migration fails,
-- rolled back, rather than queueing every reader behind it (as 00018).
SET LOCAL lock_timeout = '10s';
-- +goose StatementBegin
DO $do$
BEGIN
    ALTER TABLE readmodel.audit_checkpoint_accounts ADD COLUMN refunds_total bigint
        CONSTRAINT audit_checkpoint_accounts_refunds_total CHECK (refunds_total >= 0);
EXCEPTION WHEN lock_not_available THEN
    RAISE EXCEPTION 'migration 00026 waited more than lock_timeout (%) for a lock on the audit checkpoints (%) and changed nothing: stop audits (ledger audit) and other long transactions on them, then migrate again (docs/operations.md, "Upgrading")',
        current_setting('lock_timeout'), SQLERRM USING ERRCODE = 'lock_not_available';
END
$do$;
-- +goose StatementEnd

-- +goose Down
SET LOCAL lock_timeout = '10s';
-- The build before digests a row without refunds_total: a checkpoint with a
-- row that carries one would be refused by it as edited; these go, the
-- others keep their digest.
DELETE FROM readmodel.audit_checkpoints c WHERE EXISTS (
    SELECT 1 FROM readmodel.audit_checkpoint_accounts a WHERE a.checkpoint_id = c.id AND a.refunds_total IS NOT NULL);
ALTER TABLE readmodel.audit_checkpoint_accounts DROP COLUMN refunds_total;
