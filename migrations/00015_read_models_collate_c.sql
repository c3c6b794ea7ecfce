-- Every text column of the read models compares in byte order (collation
-- "C"), whatever the database's default collation. The read models' keys are
-- IDs (account, transfer, idempotency key, a saga part's key), never words:
-- under a linguistic collation (en_US.UTF-8, even C.UTF-8 on PostgreSQL 15)
-- each comparison goes through strcoll, and a B-tree descent, an index entry
-- inserted by a projector's batch, a `key = ANY($1)` lookup (whose array is
-- sorted first) and a sort or an index build do many of them. Measured on
-- PostgreSQL 15 (BENCHMARKS.md, "Read models in collation C"): a sort of
-- 200,000 account IDs 6.4x slower under en_US.UTF-8 than under C, 500-key
-- lookups of command_parts 5-8x.
--
-- A database whose default collation is already byte order (C or POSIX, as
-- `ledger dev` and the tests make theirs) needs nothing: this migration then
-- changes nothing. Otherwise:
--
-- - every generation created from now on (a rebuild's) gets its text columns
--   in "C" (create_generation);
-- - the generations that exist are converted here: the live one's views are
--   dropped, each text column altered (PostgreSQL rebuilds the indexes on it,
--   holding the table's readers and writers meanwhile: on a large ledger this
--   migration takes as long as building those indexes), and the views made
--   again, in this migration's transaction. So every view and generation
--   agree, and a rebuild's switch (CREATE OR REPLACE VIEW, which cannot change
--   a column's collation) keeps working.
--
-- The indexes of 00011 and 00012, written `account_id COLLATE "C"`, are then
-- on the column's own collation; they stay as they are.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION readmodel.byte_ordered_00015(coll oid) RETURNS boolean
LANGUAGE sql STABLE AS $fn$
    SELECT CASE WHEN coll = 100 -- the database's default collation
        THEN (SELECT datcollate IN ('C', 'POSIX') FROM pg_database WHERE datname = current_database())
        ELSE (SELECT collname IN ('C', 'POSIX') FROM pg_collation WHERE oid = coll)
    END
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
-- unordered_00015 lists the text columns of readmodel.tbl not in byte order.
CREATE FUNCTION readmodel.unordered_00015(tbl text) RETURNS SETOF name
LANGUAGE sql STABLE AS $fn$
    SELECT a.attname FROM pg_attribute a
    WHERE a.attrelid = format('readmodel.%I', tbl)::regclass AND a.attnum > 0 AND NOT a.attisdropped
      AND a.atttypid = 'text'::regtype AND NOT readmodel.byte_ordered_00015(a.attcollation)
    ORDER BY a.attnum
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
-- collate_c_00015 alters those columns to collation "C" (a view on the table
-- must be dropped first).
CREATE FUNCTION readmodel.collate_c_00015(tbl text) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    col name;
BEGIN
    FOR col IN SELECT * FROM readmodel.unordered_00015(tbl) LOOP
        EXECUTE format('ALTER TABLE readmodel.%I ALTER COLUMN %I TYPE text COLLATE "C"', tbl, col);
    END LOOP;
END
$fn$;
-- +goose StatementEnd

ALTER FUNCTION readmodel.create_generation(text, integer) RENAME TO create_generation_00010;

-- +goose StatementBegin
CREATE FUNCTION readmodel.create_generation(projection text, gen integer) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    t text;
BEGIN
    PERFORM readmodel.create_generation_00010(projection, gen);
    FOR t IN SELECT * FROM readmodel.generation_tables(projection, gen) LOOP
        PERFORM readmodel.collate_c_00015(t);
    END LOOP;
END
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
DO $do$
DECLARE
    c record;
    t text;
    dropped boolean;
BEGIN
    FOR c IN SELECT name, generation, state FROM readmodel.checkpoints ORDER BY name, generation LOOP
        dropped := false;
        FOR t IN SELECT * FROM readmodel.generation_tables(c.name, c.generation) LOOP
            CONTINUE WHEN to_regclass(format('readmodel.%I', t)) IS NULL
                OR NOT EXISTS (SELECT FROM readmodel.unordered_00015(t));
            IF c.state = 'live' THEN
                EXECUTE format('DROP VIEW IF EXISTS readmodel.%I', regexp_replace(t, '_g[0-9]+$', ''));
                dropped := true;
            END IF;
            PERFORM readmodel.collate_c_00015(t);
        END LOOP;
        IF dropped THEN
            PERFORM readmodel.publish_generation(c.name, c.generation);
        END IF;
    END LOOP;
END
$do$;
-- +goose StatementEnd

-- +goose Down
-- The columns stay in "C" (byte order answers every query the same).
DROP FUNCTION readmodel.create_generation(text, integer);
ALTER FUNCTION readmodel.create_generation_00010(text, integer) RENAME TO create_generation;
DROP FUNCTION readmodel.collate_c_00015(text);
DROP FUNCTION readmodel.unordered_00015(text);
DROP FUNCTION readmodel.byte_ordered_00015(oid);
