-- Snapshots of account aggregates (ARCHITECTURE: hot accounts and long
-- histories): the latest per stream, beside the events. An optimisation, never a
-- source of truth: the ledger checks each against its stream (version, hash and
-- the chain hash of the event at its revision) and ignores one that does not
-- match; `ledger audit` checks every one against a fold of its stream; a
-- rebuild of the read models never reads them. Dropping the table's rows is
-- always safe: cold loads read whole streams until new snapshots are taken.
--
-- data      the exact bytes domain.EncodeSnapshot wrote (its version, stream,
--           revision, chain hash, state and the state's SHA-256)

-- +goose Up
CREATE TABLE snapshots (
    stream   text        PRIMARY KEY,
    revision bigint      NOT NULL CHECK (revision >= 0),
    data     bytea       NOT NULL,
    taken    timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE snapshots;
