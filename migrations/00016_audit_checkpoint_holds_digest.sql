-- Audit checkpoints' digest of the holds table (issue 23, review of 6f2e30b):
-- the accounts read model is two tables, accounts and holds, and an
-- incremental audit (`ledger audit --from`) compares both whole.
--
-- holds_table_digest   the holds read model's rows as the audit that stored
--                      the checkpoint found them equal to its fold, summed as
--                      64-bit hashes of each row
--                      (internal/app/audit/holdsdigest.go): an incremental
--                      audit compares the rows of the holds no event after
--                      the checkpoint touched with it, less the touched
--                      holds' rows then, so that a hold edited, deleted or
--                      added since is caught as a full audit catches it
--
-- A checkpoint without it (NULL: one of an earlier build) is refused.

-- +goose Up
ALTER TABLE readmodel.audit_checkpoints ADD COLUMN holds_table_digest numeric;

-- +goose Down
-- An earlier build ignores the column: its checkpoints stay.
ALTER TABLE readmodel.audit_checkpoints DROP COLUMN holds_table_digest;
