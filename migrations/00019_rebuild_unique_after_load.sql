-- A rebuild's load also leaves out the unique indexes no write of the load
-- needs (issue 23): entries' primary key (event_id) and its unique
-- (account_id, revision), and balance_history's unique event_id. The load
-- writes those tables with COPY, and nothing of it looks a row up by them
-- (the balances projection finds an account's last row through the primary
-- key (account_id, revision), which stays); a batch is never applied twice to
-- a generation being built (its checkpoint commits with its rows, compared
-- and set), so their conflict rules have nothing to catch there. A CPU
-- profile of PostgreSQL during a rebuild had one insertion into a B-tree for
-- each of them per row (BENCHMARKS.md); built after the load, each is one
-- sort. Should a row be there twice all the same, building the index fails
-- and so does the rebuild, before its check and its switch.
--
-- They are built as unique indexes first (which readers of the table do not
-- wait for) and then made the constraints a generation made by
-- create_generation has, under the same names (ADD CONSTRAINT ... USING INDEX):
-- a rebuilt generation's schema is the one a migration makes.
-- load_unique_constraints is where they are named; create_secondary_indexes
-- and drop_secondary_indexes (00009) build and drop them with the others.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION readmodel.load_unique_constraints(projection text, gen integer)
RETURNS TABLE (tbl text, name text, kind text, cols text)
LANGUAGE sql IMMUTABLE AS $fn$
    SELECT c.tbl, c.name, c.kind, c.cols FROM (VALUES
        ('entries', 'entries_g' || gen, 'entries_g' || gen || '_pkey', 'PRIMARY KEY', 'event_id'),
        ('entries', 'entries_g' || gen, 'entries_g' || gen || '_account_id_revision_key', 'UNIQUE', 'account_id, revision'),
        ('balances', 'balance_history_g' || gen, 'balance_history_g' || gen || '_event_id_key', 'UNIQUE', 'event_id')
    ) c(projection, tbl, name, kind, cols)
    WHERE c.projection = load_unique_constraints.projection
$fn$;
-- +goose StatementEnd

ALTER FUNCTION readmodel.create_secondary_indexes(text, integer) RENAME TO create_secondary_indexes_before_00019;
ALTER FUNCTION readmodel.drop_secondary_indexes(text, integer) RENAME TO drop_secondary_indexes_before_00019;

-- +goose StatementBegin
CREATE FUNCTION readmodel.create_secondary_indexes(projection text, gen integer) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    c record;
BEGIN
    PERFORM readmodel.create_secondary_indexes_before_00019(projection, gen);
    FOR c IN SELECT * FROM readmodel.load_unique_constraints(projection, gen) LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = c.name AND connamespace = 'readmodel'::regnamespace) THEN
            EXECUTE format('CREATE UNIQUE INDEX IF NOT EXISTS %I ON readmodel.%I (%s)', c.name, c.tbl, c.cols);
            EXECUTE format('ALTER TABLE readmodel.%I ADD CONSTRAINT %I %s USING INDEX %I', c.tbl, c.name, c.kind, c.name);
        END IF;
    END LOOP;
END
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION readmodel.drop_secondary_indexes(projection text, gen integer) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    c record;
BEGIN
    PERFORM readmodel.drop_secondary_indexes_before_00019(projection, gen);
    FOR c IN SELECT * FROM readmodel.load_unique_constraints(projection, gen) LOOP
        EXECUTE format('ALTER TABLE readmodel.%I DROP CONSTRAINT IF EXISTS %I', c.tbl, c.name);
        EXECUTE format('DROP INDEX IF EXISTS readmodel.%I', c.name);
    END LOOP;
END
$fn$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION readmodel.drop_secondary_indexes(text, integer);
DROP FUNCTION readmodel.create_secondary_indexes(text, integer);
ALTER FUNCTION readmodel.drop_secondary_indexes_before_00019(text, integer) RENAME TO drop_secondary_indexes;
ALTER FUNCTION readmodel.create_secondary_indexes_before_00019(text, integer) RENAME TO create_secondary_indexes;
DROP FUNCTION readmodel.load_unique_constraints(text, integer);
