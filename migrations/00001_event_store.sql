-- The event store: one table, one row per event (ARCHITECTURE decision 8).
--
-- position        global insertion order; NOT commit order (bigserial gaps and
--                 late commits), so "all" is read in (transaction_id, position)
--                 order, below pg_snapshot_xmin(pg_current_snapshot()).
-- transaction_id  the writing transaction's xid8. The event store takes the
--                 stream's advisory lock before its first write, so within a stream
--                 xid order equals revision order.
-- data, metadata  bytea: the exact bytes appended (jsonb would re-order keys and
--                 drop whitespace; hash chains are computed over exact bytes).

-- +goose Up
CREATE TABLE events (
    position       bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    stream         text        NOT NULL,
    revision       bigint      NOT NULL CHECK (revision >= 0),
    event_id       uuid        NOT NULL,
    type           text        NOT NULL,
    data           bytea       NOT NULL,
    metadata       bytea       NOT NULL,
    created        timestamptz NOT NULL DEFAULT now(),
    transaction_id xid8        NOT NULL DEFAULT pg_current_xact_id(),
    CONSTRAINT events_event_id_key UNIQUE (event_id),
    CONSTRAINT events_stream_revision_key UNIQUE (stream, revision)
);

-- The "all" reader: WHERE (transaction_id, position) > ($1, $2) AND transaction_id < xmin
-- ORDER BY transaction_id, position.
CREATE INDEX events_all_idx ON events (transaction_id, position);

-- +goose Down
DROP TABLE events;
