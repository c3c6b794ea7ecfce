-- Two times (PROTOCOL.md v1.2 §2.3, ARCHITECTURE decision 15): every statement
-- entry and every row of the balance history carries its event's effective
-- time beside its record time `at`: the command's effective_at, or `at` when
-- none was given. The entries and balance_history tables of the generations
-- that exist get the column, filled with `at` (their events predate
-- effective_at, so that is their effective time), later generations get it
-- from create_generation, and the views are pointed at the live tables again.
-- The index on entries (account_id, effective_at, revision) answers the
-- statement by effective time and the sums of an account's money effective by
-- an instant; like every secondary index it is declared in
-- create_secondary_indexes, so that a rebuild builds it after its load.

-- +goose Up
ALTER FUNCTION readmodel.create_generation(text, integer) RENAME TO create_generation_00005;
ALTER FUNCTION readmodel.create_secondary_indexes(text, integer) RENAME TO create_secondary_indexes_00009;
ALTER FUNCTION readmodel.drop_secondary_indexes(text, integer) RENAME TO drop_secondary_indexes_00009;

-- +goose StatementBegin
CREATE FUNCTION readmodel.effective_table_00010(projection text, gen integer) RETURNS text
LANGUAGE sql IMMUTABLE AS $fn$
    SELECT CASE projection WHEN 'entries' THEN 'entries_g' || gen WHEN 'balances' THEN 'balance_history_g' || gen END
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION readmodel.create_generation(projection text, gen integer) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    t text := readmodel.effective_table_00010(projection, gen);
BEGIN
    PERFORM readmodel.create_generation_00005(projection, gen);
    IF t IS NOT NULL THEN
        EXECUTE format('ALTER TABLE readmodel.%I ADD COLUMN effective_at timestamptz NOT NULL', t);
    END IF;
    IF projection = 'entries' THEN -- a rebuild drops it, and builds it after its load
        PERFORM readmodel.create_secondary_indexes(projection, gen);
    END IF;
END
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION readmodel.create_secondary_indexes(projection text, gen integer) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM readmodel.create_secondary_indexes_00009(projection, gen);
    IF projection = 'entries' THEN
        EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON readmodel.%I (account_id, effective_at, revision)',
            'entries_g' || gen || '_effective', 'entries_g' || gen);
    END IF;
END
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION readmodel.drop_secondary_indexes(projection text, gen integer) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM readmodel.drop_secondary_indexes_00009(projection, gen);
    IF projection = 'entries' THEN
        EXECUTE format('DROP INDEX IF EXISTS readmodel.%I', 'entries_g' || gen || '_effective');
    END IF;
END
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
DO $do$
DECLARE
    c record;
    t text;
BEGIN
    FOR c IN SELECT name, generation, state FROM readmodel.checkpoints WHERE name IN ('entries', 'balances') LOOP
        t := readmodel.effective_table_00010(c.name, c.generation);
        EXECUTE format('ALTER TABLE readmodel.%I ADD COLUMN IF NOT EXISTS effective_at timestamptz', t);
        EXECUTE format('UPDATE readmodel.%I SET effective_at = at WHERE effective_at IS NULL', t);
        EXECUTE format('ALTER TABLE readmodel.%I ALTER COLUMN effective_at SET NOT NULL', t);
        IF c.name = 'entries' THEN
            PERFORM readmodel.create_secondary_indexes('entries', c.generation);
        END IF;
        IF c.state = 'live' THEN
            PERFORM readmodel.publish_generation(c.name, c.generation);
        END IF;
    END LOOP;
END
$do$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION readmodel.create_generation(text, integer);
DROP FUNCTION readmodel.create_secondary_indexes(text, integer);
DROP FUNCTION readmodel.drop_secondary_indexes(text, integer);
DROP FUNCTION readmodel.effective_table_00010(text, integer);
ALTER FUNCTION readmodel.create_generation_00005(text, integer) RENAME TO create_generation;
ALTER FUNCTION readmodel.create_secondary_indexes_00009(text, integer) RENAME TO create_secondary_indexes;
ALTER FUNCTION readmodel.drop_secondary_indexes_00009(text, integer) RENAME TO drop_secondary_indexes;
