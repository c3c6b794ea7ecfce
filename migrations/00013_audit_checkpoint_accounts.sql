-- Audit checkpoints' accounts (issue 23): each account's state as a clean
-- audit left it, one row per account and checkpoint, beside the checkpoint's
-- own row (00008), whose state then carries only what is global or in flight
-- (the money flows, the open accounts' balances summed per currency, the
-- sagas and transactions not settled). An incremental audit
-- (`ledger audit --from`) reads only the rows of the accounts its events
-- touch, a page at a time, instead of decoding every account's state; the
-- audit writes them with COPY at its end (projections.Checkpoints owns the
-- SQL: projections/checkpoints.go).
--
-- account_id    the account
-- next          the revision its stream's next event must have
-- chain         the stream's chain head (the last event's chain hash)
-- group_*       the command group open at its last event (its key, the
--               events of the group read, the group's size): a command cut
--               short across the checkpoint is still found
-- guarded       it holds an active capture-guard hold (a capture saga in
--               flight): such accounts are read whole at the start, since the
--               end of the audit counts them wherever the events are
-- snapshot      the account's state, domain.EncodeSnapshot (versioned and
--               hashed: a row edited since is refused)
--
-- readmodel.audit_checkpoints.accounts_digest sums a hash of each of the
-- checkpoint's account rows (projections/checkpoints.go, auditDigestSQL; in
-- any order, so that PostgreSQL computes it in one pass without a sort): a
-- checkpoint whose rows were edited, deleted or added since is refused.
-- NULL: a checkpoint of an earlier build (its accounts inside its state).

-- +goose Up
CREATE TABLE readmodel.audit_checkpoint_accounts (
    checkpoint_id bigint  NOT NULL REFERENCES readmodel.audit_checkpoints (id) ON DELETE CASCADE,
    account_id    text    NOT NULL,
    next          bigint  NOT NULL CHECK (next >= 0),
    chain         text    NOT NULL,
    group_key     text    NOT NULL,
    group_next    integer NOT NULL CHECK (group_next >= 0),
    group_count   integer NOT NULL CHECK (group_count >= 0),
    guarded       boolean NOT NULL,
    snapshot      bytea   NOT NULL,
    PRIMARY KEY (checkpoint_id, account_id)
);

-- The accounts an incremental audit reads first: few (captures in flight).
CREATE INDEX audit_checkpoint_accounts_guarded ON readmodel.audit_checkpoint_accounts (checkpoint_id) WHERE guarded;

ALTER TABLE readmodel.audit_checkpoints ADD COLUMN accounts_digest numeric;

-- +goose Down
-- A checkpoint of this format keeps its accounts in the rows dropped here, not
-- in its state: an earlier build would read it as a ledger without accounts.
-- It goes (a full audit of the earlier build stores one of its own).
DELETE FROM readmodel.audit_checkpoints WHERE accounts_digest IS NOT NULL;
ALTER TABLE readmodel.audit_checkpoints DROP COLUMN accounts_digest;
DROP TABLE readmodel.audit_checkpoint_accounts;
