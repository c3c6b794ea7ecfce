-- A rebuild's create_secondary_indexes (00019) built each unique index a
-- load leaves out and made it its constraint at once (ALTER TABLE ... ADD
-- CONSTRAINT ... USING INDEX), one after the other. The ALTER takes ACCESS
-- EXCLUSIVE on the table until the whole call commits, so entries' second
-- unique index, (account_id, revision), was sorted under it, and the
-- rebuild's check, reading entries beside the index builds, waited behind
-- that sort (a reviewer's finding on a0a1e33, issue 23). Here every unique
-- index is built first (CREATE INDEX takes SHARE, which readers do not wait
-- for) and the ALTERs run last, when nothing is left to build: the table is
-- then held ACCESS EXCLUSIVE only from the ALTERs, which change the catalog
-- and read no row, to the commit. What is built and its names are 00019's
-- (readmodel.load_unique_constraints).

-- +goose Up
-- 00019's function stays, renamed, for the down step to put back.
ALTER FUNCTION readmodel.create_secondary_indexes(text, integer) RENAME TO create_secondary_indexes_before_00020;

-- +goose StatementBegin
CREATE FUNCTION readmodel.create_secondary_indexes(projection text, gen integer) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    c record;
    todo text[] := '{}';
BEGIN
    PERFORM readmodel.create_secondary_indexes_before_00019(projection, gen);
    FOR c IN SELECT * FROM readmodel.load_unique_constraints(projection, gen) LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = c.name AND connamespace = 'readmodel'::regnamespace) THEN
            EXECUTE format('CREATE UNIQUE INDEX IF NOT EXISTS %I ON readmodel.%I (%s)', c.name, c.tbl, c.cols);
            todo := todo || c.name;
        END IF;
    END LOOP;
    FOR c IN SELECT * FROM readmodel.load_unique_constraints(projection, gen) u WHERE u.name = ANY (todo) LOOP
        EXECUTE format('ALTER TABLE readmodel.%I ADD CONSTRAINT %I %s USING INDEX %I', c.tbl, c.name, c.kind, c.name);
    END LOOP;
END
$fn$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION readmodel.create_secondary_indexes(text, integer);
ALTER FUNCTION readmodel.create_secondary_indexes_before_00020(text, integer) RENAME TO create_secondary_indexes;
