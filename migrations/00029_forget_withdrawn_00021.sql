-- Forget the withdrawn migration 00021. It ran on main for eleven minutes
-- (0d8b992, withdrawn by c1fd7f0: on a live store it deadlocks with the
-- appends), so a database migrated by a build of then has a goose version
-- row for 00021 whose file no build has any more; goose's down walks the
-- recorded versions, finds no migration 00021 and stops there, so no
-- rollback got past it (docs/operations.md, "Rolling back"). As goose's
-- users do for a migration deleted after it ran, the row goes. The number
-- 00021 stays unused.
--
-- The schema it left is kept: the events' primary key (transaction_id,
-- position) and no index on position alone, which every build reads as it
-- reads 00001's (no statement names either index; the "all" reader's order
-- is the key's). Rebuilding 00001's key would lock the events table for the
-- build of an index, which is what withdrew 00021. A database 00021 never
-- ran on is unchanged.

-- +goose Up
DELETE FROM goose_db_version WHERE version_id = 21;

-- +goose Down
-- Nothing: a row for 00021 put back would block the way down again.
