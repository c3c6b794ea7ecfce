-- Audit checkpoints' time of the snapshots' listing (issue 23, the
-- incremental audit's snapshot rule):
--
-- taken_at              when the checkpoint was saved (now() at the save, the
--                       end of the audit that stored it), as before; no
--                       audit decides anything on it.
-- snapshots_listed_at   when the audit that stored the checkpoint began
--                       listing the account snapshots, by the read models'
--                       PostgreSQL clock (clock_timestamp() in the audit's
--                       own transaction). An incremental audit from the
--                       checkpoint (`ledger audit --from`) checks each
--                       snapshot of a revision the checkpoint passed taken
--                       on or after it less 5 minutes, and trusts the older
--                       ones, which that audit checked
--                       (internal/app/audit/snapshots.go).
--
-- A checkpoint without snapshots_listed_at (NULL: one of an earlier build,
-- whose taken_at is its audit's end, or from 401026b its start by the audit
-- host's clock) is refused: a full audit stores a new one
-- (docs/operations.md, "Upgrading"). Trusting an earlier build's taken_at
-- would trust a snapshot written after its audit listed them and more than 5
-- minutes before its end, which no audit checked.

-- +goose Up
-- ADD COLUMN takes ACCESS EXCLUSIVE on the checkpoints, which an audit reads
-- in its long transaction: past lock_timeout the migration fails, rolled
-- back, rather than queueing every reader of the table behind it (as 00018).
SET LOCAL lock_timeout = '10s';
-- +goose StatementBegin
DO $do$
BEGIN
    ALTER TABLE readmodel.audit_checkpoints ADD COLUMN snapshots_listed_at timestamptz;
EXCEPTION WHEN lock_not_available THEN
    RAISE EXCEPTION 'migration 00022 waited more than lock_timeout (%) for a lock on readmodel.audit_checkpoints (%) and changed nothing: stop audits (ledger audit) and other long transactions on it, then migrate again (docs/operations.md, "Upgrading")',
        current_setting('lock_timeout'), SQLERRM USING ERRCODE = 'lock_not_available';
END
$do$;
-- +goose StatementEnd

-- +goose Down
SET LOCAL lock_timeout = '10s';
-- The build before 00022 reads taken_at as the listing's start: it gets it.
UPDATE readmodel.audit_checkpoints SET taken_at = snapshots_listed_at WHERE snapshots_listed_at IS NOT NULL;
ALTER TABLE readmodel.audit_checkpoints DROP COLUMN snapshots_listed_at;
