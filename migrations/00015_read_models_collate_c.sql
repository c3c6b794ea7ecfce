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
--   dropped, each table's text columns altered in one ALTER TABLE
--   (PostgreSQL rebuilds the indexes on them once, holding the table's readers
--   and writers meanwhile: on a large ledger this migration takes as long as
--   building those indexes), and the views made again with their owners,
--   privileges (column privileges too), options and comments, in this
--   migration's transaction. So every view and generation
--   agree, and a rebuild's switch (CREATE OR REPLACE VIEW, which cannot change
--   a column's collation) keeps working.
--
-- The indexes of 00011 and 00012, written `account_id COLLATE "C"`, are then
-- on the column's own collation; they stay as they are.

-- +goose Up
-- A lock the migration waits for longer than lock_timeout (a long reader of
-- the read models: an audit's REPEATABLE READ transaction, say) fails it,
-- rolled back, rather than queueing every projector write and API read behind
-- its ACCESS EXCLUSIVE request meanwhile (docs/operations.md, "Upgrading").
SET LOCAL lock_timeout = '10s';
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
-- uncollated_00015 lists the text columns of readmodel.tbl to alter to coll:
-- for "C", those not in byte order; for "default" (the down step), those in
-- "C".
CREATE FUNCTION readmodel.uncollated_00015(tbl text, coll text) RETURNS SETOF name
LANGUAGE sql STABLE AS $fn$
    SELECT a.attname FROM pg_attribute a
    WHERE a.attrelid = format('readmodel.%I', tbl)::regclass AND a.attnum > 0 AND NOT a.attisdropped
      AND a.atttypid = 'text'::regtype
      AND CASE coll WHEN 'C' THEN NOT readmodel.byte_ordered_00015(a.attcollation)
          ELSE a.attcollation = 'pg_catalog."C"'::regcollation END
    ORDER BY a.attnum
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
-- collate_00015 alters those columns to collation coll in one ALTER TABLE, so
-- that each index on them is rebuilt once, not once per column (the table's
-- rows are not rewritten: text to text is binary coercible). A view on the
-- table must be dropped first.
CREATE FUNCTION readmodel.collate_00015(tbl text, coll text) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    clauses text;
BEGIN
    SELECT string_agg(format('ALTER COLUMN %I TYPE text COLLATE %I', col, coll), ', ')
    INTO clauses FROM readmodel.uncollated_00015(tbl, coll) AS col;
    IF clauses IS NOT NULL THEN
        EXECUTE format('ALTER TABLE readmodel.%I ', tbl) || clauses;
    END IF;
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
        PERFORM readmodel.collate_00015(t, 'C');
    END LOOP;
END
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
-- view_state_00015 is what a DROP VIEW of readmodel.view would lose and
-- restore_view_00015 gives back: its owner, privileges, options
-- (security_barrier, security_invoker, check_option), comment, and its
-- columns' privileges and comments; NULL when there is no such view. A view
-- with a trigger or a rule of its own (which restore_view_00015 cannot make
-- again) stops the migration.
CREATE FUNCTION readmodel.view_state_00015(view text) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $fn$
DECLARE
    v oid := to_regclass(format('readmodel.%I', view));
BEGIN
    IF v IS NULL THEN
        RETURN NULL;
    END IF;
    IF EXISTS (SELECT FROM pg_trigger WHERE tgrelid = v) OR EXISTS (SELECT FROM pg_rewrite WHERE ev_class = v AND rulename <> '_RETURN') THEN
        RAISE EXCEPTION 'readmodel.% has a trigger or a rule of its own, which migration 00015 would drop with the view: drop it first, and make it again after', view;
    END IF;
    RETURN (SELECT jsonb_build_object('owner', pg_get_userbyid(c.relowner), 'acl', c.relacl::text, 'options', c.reloptions,
            'comment', obj_description(v, 'pg_class'),
            'columns', (SELECT coalesce(jsonb_object_agg(a.attname, jsonb_build_object('acl', a.attacl::text, 'comment', col_description(v, a.attnum))), '{}')
                FROM pg_attribute a WHERE a.attrelid = v AND a.attnum > 0 AND NOT a.attisdropped
                    AND (a.attacl IS NOT NULL OR col_description(v, a.attnum) IS NOT NULL)))
        FROM pg_class c WHERE c.oid = v);
END
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
-- grant_00015 makes again on readmodel.view the privileges of acl, on column
-- col when given (a GRANT made through a grant option is made again by the
-- owner).
CREATE FUNCTION readmodel.grant_00015(view text, col name, acl aclitem[]) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT * FROM aclexplode(acl) LOOP
        EXECUTE format('GRANT %s%s ON readmodel.%I TO %s%s', g.privilege_type,
            CASE WHEN col IS NULL THEN '' ELSE format(' (%I)', col) END, view,
            CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(g.grantee)) END,
            CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
-- restore_view_00015 gives a view made again what view_state_00015 saved of
-- it before it was dropped.
CREATE FUNCTION readmodel.restore_view_00015(view text, saved jsonb) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    owner name := saved->>'owner';
    col record;
BEGIN
    IF owner <> current_user THEN
        EXECUTE format('ALTER VIEW readmodel.%I OWNER TO %I', view, owner);
    END IF;
    IF jsonb_typeof(saved->'options') = 'array' THEN
        EXECUTE format('ALTER VIEW readmodel.%I SET (%s)', view,
            (SELECT string_agg(format('%I = %L', split_part(o, '=', 1), substr(o, strpos(o, '=') + 1)), ', ')
             FROM jsonb_array_elements_text(saved->'options') AS o));
    END IF;
    EXECUTE format('COMMENT ON VIEW readmodel.%I IS %L', view, saved->>'comment');
    IF saved->>'acl' IS NOT NULL THEN -- else the default privileges, as a view made again has
        EXECUTE format('REVOKE ALL ON readmodel.%I FROM %I', view, owner);
        PERFORM readmodel.grant_00015(view, NULL, (saved->>'acl')::aclitem[]);
    END IF;
    FOR col IN SELECT key, value FROM jsonb_each(saved->'columns') LOOP
        EXECUTE format('COMMENT ON COLUMN readmodel.%I.%I IS %L', view, col.key, col.value->>'comment');
        PERFORM readmodel.grant_00015(view, col.key::name, (col.value->>'acl')::aclitem[]);
    END LOOP;
END
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
-- collate_generations_00015 alters the text columns of every generation to
-- coll. A column under a view cannot change its collation ("cannot alter type
-- of a column used by a view or rule"), so the live generation's views are
-- dropped and made again, with what view_state_00015 saves. A user's object
-- that depends on one of them makes the DROP VIEW fail ("cannot drop view ...
-- because other objects depend on it"), and the whole migration with it.
CREATE FUNCTION readmodel.collate_generations_00015(coll text) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    c record;
    t text;
    v text;
    dropped boolean;
    saved jsonb; -- by view: its view_state_00015 before the DROP
BEGIN
    FOR c IN SELECT name, generation, state FROM readmodel.checkpoints ORDER BY name, generation LOOP
        dropped := false;
        saved := '{}';
        FOR t IN SELECT * FROM readmodel.generation_tables(c.name, c.generation) LOOP
            CONTINUE WHEN to_regclass(format('readmodel.%I', t)) IS NULL
                OR NOT EXISTS (SELECT FROM readmodel.uncollated_00015(t, coll));
            IF c.state = 'live' THEN
                v := regexp_replace(t, '_g[0-9]+$', '');
                saved := saved || jsonb_build_object(v, readmodel.view_state_00015(v));
                EXECUTE format('DROP VIEW IF EXISTS readmodel.%I', v);
                dropped := true;
            END IF;
            PERFORM readmodel.collate_00015(t, coll);
        END LOOP;
        IF dropped THEN
            PERFORM readmodel.publish_generation(c.name, c.generation);
            PERFORM readmodel.restore_view_00015(key, value) FROM jsonb_each(saved) WHERE value <> 'null';
        END IF;
    END LOOP;
EXCEPTION WHEN lock_not_available THEN
    RAISE EXCEPTION 'migration 00015 waited more than lock_timeout (%) for a lock on the read models (%) and changed nothing: stop audits (ledger audit) and other long transactions on them, then migrate again (docs/operations.md, "Upgrading")',
        current_setting('lock_timeout'), SQLERRM USING ERRCODE = 'lock_not_available';
END
$fn$;
-- +goose StatementEnd

SELECT readmodel.collate_generations_00015('C');

-- +goose Down
SET LOCAL lock_timeout = '10s';
-- Every generation back in the database's collation, as an earlier build
-- makes its generations: else its rebuild's CREATE OR REPLACE VIEW would fail
-- ("cannot change collation of view column ... from "C" to "default"). It
-- holds the read models as long as the up step does (docs/operations.md).
DROP FUNCTION readmodel.create_generation(text, integer);
ALTER FUNCTION readmodel.create_generation_00010(text, integer) RENAME TO create_generation;
SELECT readmodel.collate_generations_00015('default');
DROP FUNCTION readmodel.collate_generations_00015(text);
DROP FUNCTION readmodel.restore_view_00015(text, jsonb);
DROP FUNCTION readmodel.grant_00015(text, name, aclitem[]);
DROP FUNCTION readmodel.view_state_00015(text);
DROP FUNCTION readmodel.collate_00015(text, text);
DROP FUNCTION readmodel.uncollated_00015(text, text);
DROP FUNCTION readmodel.byte_ordered_00015(oid);
