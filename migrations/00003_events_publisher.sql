-- The events publisher (PROTOCOL.md §4.1, projections/publisher.go) keeps its
-- checkpoint here: the position of "all" up to which every event is in the
-- JetStream stream LEDGER_EVENTS. It is not a read model: a rebuild never
-- touches it (a rebuild never republishes), and the stream itself is the source
-- of truth (the publisher resumes after the last event the stream holds when that
-- is further than this row). One publisher publishes at a time: it holds the
-- session advisory lock named by lease_key while it runs.

-- +goose Up
CREATE TABLE readmodel.publisher_checkpoints (
    name             text        PRIMARY KEY,
    commit_position  bigint      NOT NULL DEFAULT 0 CHECK (commit_position >= 0),
    prepare_position bigint      NOT NULL DEFAULT 0 CHECK (prepare_position >= 0),
    events           bigint      NOT NULL DEFAULT 0, -- events published since the row was made
    lease_key        bigint      NOT NULL,           -- pg_advisory_lock key of the publisher's lease
    updated_at       timestamptz NOT NULL DEFAULT now()
);
INSERT INTO readmodel.publisher_checkpoints (name, lease_key) VALUES ('events', hashtextextended('ledger events publisher', 0));

-- +goose Down
DROP TABLE readmodel.publisher_checkpoints;
