-- Audit checkpoints' digests (issue 23, after review): what a checkpoint
-- carries that an incremental audit (`ledger audit --from`) cannot read again
-- is hashed with it, so that one edited since is refused, and what it does not
-- read again is compared as a whole (projections/checkpoints.go owns the SQL).
--
-- state_digest            md5 of the checkpoint's state (00008): the money
--                         flows, the open accounts' balances summed and what
--                         is in flight; a state edited since is refused
-- accounts_table_digest   the accounts read model's rows as the audit that
--                         stored the checkpoint found them equal to its fold
--                         (every live read model at its head: it stores no
--                         checkpoint otherwise), summed as 64-bit hashes of
--                         each row (internal/app/audit/tabledigest.go): an
--                         incremental audit compares the whole table with it,
--                         less the rows of the accounts its events touched
--                         (compared row by row), so that a row of an account
--                         it did not touch, edited, deleted or added since,
--                         is caught as a full audit catches it
--
-- A checkpoint without them (NULL: one of an earlier build) is refused.

-- +goose Up
ALTER TABLE readmodel.audit_checkpoints ADD COLUMN state_digest text;
ALTER TABLE readmodel.audit_checkpoints ADD COLUMN accounts_table_digest numeric;

-- +goose Down
-- An earlier build would read these checkpoints without their digests'
-- checks: they go (a full audit stores a new one).
DELETE FROM readmodel.audit_checkpoints WHERE state_digest IS NOT NULL;
ALTER TABLE readmodel.audit_checkpoints DROP COLUMN accounts_table_digest;
ALTER TABLE readmodel.audit_checkpoints DROP COLUMN state_digest;
