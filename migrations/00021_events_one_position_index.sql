-- The events table keeps one index on its positions, not two (issue 24: the
-- batch phase's cost per command on PostgreSQL's side). 00001 made `position`
-- the primary key and indexed (transaction_id, position) for the "all"
-- reader; every event paid an entry in both. No query reads by position alone
-- (the store reads "all" and its head by (transaction_id, position), a stream
-- by (stream, revision), an event by event_id), and position is an identity
-- column written only by its sequence, unique by construction; so the primary
-- key becomes (transaction_id, position), the reader's index, and the index on
-- position alone goes. The duplicate checks are untouched: event_id and
-- (stream, revision) keep their unique constraints.
--
-- Building the new key scans the table while appends wait (ACCESS EXCLUSIVE):
-- on a large events table, build it by hand first,
--   CREATE UNIQUE INDEX CONCURRENTLY events_all_key ON events (transaction_id, position);
-- and the migration finds it there. Past lock_timeout (a long reader of the
-- table) the migration fails, rolled back, rather than queueing every append
-- behind it (docs/operations.md, "Upgrading").

-- +goose Up
SET LOCAL lock_timeout = '10s';
CREATE UNIQUE INDEX IF NOT EXISTS events_all_key ON events (transaction_id, position);
ALTER TABLE events DROP CONSTRAINT events_pkey,
    ADD CONSTRAINT events_pkey PRIMARY KEY USING INDEX events_all_key;
DROP INDEX events_all_idx;

-- +goose Down
SET LOCAL lock_timeout = '10s';
CREATE INDEX events_all_idx ON events (transaction_id, position);
ALTER TABLE events DROP CONSTRAINT events_pkey,
    ADD CONSTRAINT events_pkey PRIMARY KEY (position);
