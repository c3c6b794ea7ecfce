-- Audit checkpoints (issue 23): what a clean `ledger audit` carries forward, so
-- that `ledger audit --from <id|last>` checks only the events after it. Not a
-- read model: a rebuild never touches it. Written only by an audit that found
-- no violation; its rows are the trusted earlier results, never edited.
--
-- position  the last event the audit folded (commit, prepare)
-- events    how many events it had folded from the start of "all"
-- state     the fold's carried state (internal/app/audit/resume.go: every
--           account's balances, holds and chain head, the money flows per
--           currency, the sagas and transactions still in flight), gzip'd JSON

-- +goose Up
CREATE TABLE readmodel.audit_checkpoints (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    commit_position  bigint      NOT NULL CHECK (commit_position >= 0),
    prepare_position bigint      NOT NULL CHECK (prepare_position >= 0),
    events           bigint      NOT NULL CHECK (events >= 0),
    state            bytea       NOT NULL,
    taken_at         timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE readmodel.audit_checkpoints;
