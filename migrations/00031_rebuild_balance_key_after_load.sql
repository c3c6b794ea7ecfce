-- A rebuild's load also leaves out balance_history's primary key (account_id,
-- revision) while its builder needs it for nothing (issue 23). The load
-- writes balance_history with COPY; the key was kept (00019) because the
-- balances builder reads an account's last row back through it
-- (projections' lastBalances: one descent per account). A builder of a
-- generation it created empty remembers every account's last row in its memo
-- (projections' accountMemo) until the memo reaches its bound, and reads
-- nothing back while it does: the B-tree's insertion of every row (about
-- 2.8 us a row, BENCHMARKS.md) served nothing. Now:
--
-- - load_unique_constraints names the key too, so that
--   drop_secondary_indexes leaves it out of a generation a rebuild creates
--   and create_secondary_indexes builds it after the load (one sort) with the
--   unique ones 00019 and 00020 build, under the name and definition
--   create_generation (00004) gives it: a rebuilt generation's schema is the
--   one a migration makes.
-- - read_back_keys names the keys a builder reads back by (this one), and
--   create_read_back_keys builds those a generation lacks, before a builder's
--   first read-back: a resumed build (its memo starts empty) or one whose
--   memo reached its bound. It runs in the builder's batch transaction and
--   does nothing when the key is there (a generation created before this
--   migration, or one whose builder built it already).
--
-- Should a row be there twice all the same, building the key fails, and so
-- does the rebuild, as 00019's.
--
-- Down: the functions before, and the key built on every generation that
-- lacks it (one being built: the earlier builder reads back by it).

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION readmodel.read_back_keys(projection text, gen integer)
RETURNS TABLE (tbl text, name text, kind text, cols text)
LANGUAGE sql IMMUTABLE AS $fn$
    SELECT 'balance_history_g' || gen, 'balance_history_g' || gen || '_pkey', 'PRIMARY KEY', 'account_id, revision'
    WHERE projection = 'balances'
$fn$;
-- +goose StatementEnd

-- 00019's rows and read_back_keys'. (Its function stays as it was in name:
-- a SQL function's body names its parameters by the function's name.)
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION readmodel.load_unique_constraints(projection text, gen integer)
RETURNS TABLE (tbl text, name text, kind text, cols text)
LANGUAGE sql IMMUTABLE AS $fn$
    SELECT c.tbl, c.name, c.kind, c.cols FROM (VALUES
        ('entries', 'entries_g' || gen, 'entries_g' || gen || '_pkey', 'PRIMARY KEY', 'event_id'),
        ('entries', 'entries_g' || gen, 'entries_g' || gen || '_account_id_revision_key', 'UNIQUE', 'account_id, revision'),
        ('balances', 'balance_history_g' || gen, 'balance_history_g' || gen || '_event_id_key', 'UNIQUE', 'event_id')
    ) c(projection, tbl, name, kind, cols)
    WHERE c.projection = load_unique_constraints.projection
    UNION ALL
    SELECT * FROM readmodel.read_back_keys(projection, gen)
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION readmodel.create_read_back_keys(projection text, gen integer) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    c record;
BEGIN
    FOR c IN SELECT * FROM readmodel.read_back_keys(projection, gen) LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = c.name AND connamespace = 'readmodel'::regnamespace) THEN
            EXECUTE format('CREATE UNIQUE INDEX IF NOT EXISTS %I ON readmodel.%I (%s)', c.name, c.tbl, c.cols);
            EXECUTE format('ALTER TABLE readmodel.%I ADD CONSTRAINT %I %s USING INDEX %I', c.tbl, c.name, c.kind, c.name);
        END IF;
    END LOOP;
END
$fn$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DO $do$
DECLARE
    c record;
BEGIN
    -- A rebuild holds projections.rebuildLockID (0x6c6564676572) from before it
    -- creates its generations to its end. Rolled back beside it, a generation
    -- created in a transaction this one cannot see would be left without the
    -- key, and the rebuild's later read-back would call the function dropped
    -- below: refuse instead, holding the lock to the commit.
    IF NOT pg_try_advisory_xact_lock(x'6c6564676572'::bigint) THEN
        RAISE EXCEPTION 'migration 00031 down: a rebuild is running (projector status); roll back when it has ended'
            USING ERRCODE = 'lock_not_available';
    END IF;
    FOR c IN SELECT p.name, p.generation FROM readmodel.checkpoints p
        WHERE EXISTS (SELECT 1 FROM readmodel.read_back_keys(p.name, p.generation) k
            WHERE to_regclass(format('readmodel.%I', k.tbl)) IS NOT NULL) LOOP
        PERFORM readmodel.create_read_back_keys(c.name, c.generation);
    END LOOP;
END
$do$;
-- +goose StatementEnd
DROP FUNCTION readmodel.create_read_back_keys(text, integer);
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION readmodel.load_unique_constraints(projection text, gen integer)
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
DROP FUNCTION readmodel.read_back_keys(text, integer);
