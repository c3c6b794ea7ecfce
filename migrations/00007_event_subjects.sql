-- Subjects of events (ARCHITECTURE: hot accounts and long histories): what an
-- event is about within its stream, for the events that have one (the ledger's
-- hold events: "hold:<id>"). An account's aggregate keeps its active holds and
-- its most recently closed ones; a hold it no longer keeps is found by its
-- subject in one read of the partial index, however long the account's history.
--
-- The column is nullable without a default, so adding it rewrites nothing. The
-- partial index is built in the migration's transaction, which blocks appends
-- while it scans the table: on a large events table, build it by hand first,
--   CREATE INDEX CONCURRENTLY events_stream_subject ON events (stream, subject) WHERE subject IS NOT NULL;
-- and the migration finds it there. (Not CONCURRENTLY here: it would wait for
-- the other processes' migration sessions queued on the migrations' lock.)

-- +goose Up
ALTER TABLE events ADD COLUMN IF NOT EXISTS subject text;
CREATE INDEX IF NOT EXISTS events_stream_subject ON events (stream, subject) WHERE subject IS NOT NULL;

-- +goose Down
DROP INDEX IF EXISTS events_stream_subject;
ALTER TABLE events DROP COLUMN IF EXISTS subject;
