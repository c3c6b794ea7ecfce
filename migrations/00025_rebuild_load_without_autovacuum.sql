-- A rebuild's load runs without autovacuum on the generation it loads, and
-- analyzes the generation's tables once, after the load and before its
-- indexes are built, its check compares it and its switch makes it live
-- (issue 23). The load only appends to tables that nothing else writes or
-- reads (one writer: its builder); autovacuum saw them grow by 10% again and
-- again and analyzed (and, past the insert threshold, vacuumed) them during
-- the load, in a CPU profile of PostgreSQL during a rebuild a large share of
-- its samples (BENCHMARKS.md). Statistics taken half-way are stale anyway by
-- the switch. One ANALYZE after the load gives the planner what a live table
-- has: a switch never makes live a table that was never analyzed, for it
-- runs only after create_secondary_indexes committed.
--
-- drop_secondary_indexes, which the rebuild calls when it creates a
-- generation, now also turns autovacuum off on the generation's tables (the
-- setting is stored with the table: a stopped rebuild's generation, resumed,
-- keeps it); create_secondary_indexes, which every rebuilt generation passes
-- through before its check and switch, analyzes them and turns it on again
-- (RESET: the cluster's setting), both before building the indexes, whose
-- ALTERs (00020) hold the tables exclusively to the commit. Both take SHARE
-- UPDATE EXCLUSIVE, which readers do not wait for.

-- +goose Up
ALTER FUNCTION readmodel.create_secondary_indexes(text, integer) RENAME TO create_secondary_indexes_before_00025;
ALTER FUNCTION readmodel.drop_secondary_indexes(text, integer) RENAME TO drop_secondary_indexes_before_00025;

-- +goose StatementBegin
CREATE FUNCTION readmodel.create_secondary_indexes(projection text, gen integer) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    t text;
BEGIN
    FOR t IN SELECT * FROM readmodel.generation_tables(projection, gen) LOOP
        EXECUTE format('ANALYZE readmodel.%I', t);
        EXECUTE format('ALTER TABLE readmodel.%I RESET (autovacuum_enabled, toast.autovacuum_enabled)', t);
    END LOOP;
    PERFORM readmodel.create_secondary_indexes_before_00025(projection, gen);
END
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION readmodel.drop_secondary_indexes(projection text, gen integer) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    t text;
BEGIN
    PERFORM readmodel.drop_secondary_indexes_before_00025(projection, gen);
    FOR t IN SELECT * FROM readmodel.generation_tables(projection, gen) LOOP
        EXECUTE format('ALTER TABLE readmodel.%I SET (autovacuum_enabled = false, toast.autovacuum_enabled = false)', t);
    END LOOP;
END
$fn$;
-- +goose StatementEnd

-- +goose Down
-- The earlier functions never turn autovacuum on again: it is turned on here
-- on every generation's tables, one being built included.
-- +goose StatementBegin
DO $do$
DECLARE
    c record;
    t text;
BEGIN
    FOR c IN SELECT name, generation FROM readmodel.checkpoints LOOP
        FOR t IN SELECT * FROM readmodel.generation_tables(c.name, c.generation) LOOP
            EXECUTE format('ALTER TABLE IF EXISTS readmodel.%I RESET (autovacuum_enabled, toast.autovacuum_enabled)', t);
        END LOOP;
    END LOOP;
END
$do$;
-- +goose StatementEnd
DROP FUNCTION readmodel.drop_secondary_indexes(text, integer);
DROP FUNCTION readmodel.create_secondary_indexes(text, integer);
ALTER FUNCTION readmodel.drop_secondary_indexes_before_00025(text, integer) RENAME TO drop_secondary_indexes;
ALTER FUNCTION readmodel.create_secondary_indexes_before_00025(text, integer) RENAME TO create_secondary_indexes;
