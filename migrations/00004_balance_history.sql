-- The balances projection (PROTOCOL.md v1.1 ledger.v1.query.balance): one row per
-- event of every account stream with the account as it stood after the event, so
-- that "the balance as of a revision or a time" is one index lookup.
-- readmodel.balance_history_g<N> is keyed by (account_id, revision); the index on
-- (account_id, at) answers "as of a time". The projection starts at position 0
-- like any new one: the runner fills it from the start of "all".
--
-- The generation functions of 00002 keep the other projections: they are renamed
-- and the new functions hand every other projection to them.

-- +goose Up
ALTER FUNCTION readmodel.create_generation(text, integer) RENAME TO create_generation_00002;
ALTER FUNCTION readmodel.generation_tables(text, integer) RENAME TO generation_tables_00002;

-- +goose StatementBegin
CREATE FUNCTION readmodel.create_generation(projection text, gen integer) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    IF projection <> 'balances' THEN
        PERFORM readmodel.create_generation_00002(projection, gen);
        RETURN;
    END IF;
    EXECUTE format($ddl$
        CREATE TABLE readmodel.%I (
            account_id text        NOT NULL,
            revision   bigint      NOT NULL,
            event_id   uuid        NOT NULL UNIQUE,
            type       text        NOT NULL,
            currency   text        NOT NULL,
            balance    bigint      NOT NULL,
            held       bigint      NOT NULL,
            status     text        NOT NULL CHECK (status IN ('open', 'closed')),
            at         timestamptz NOT NULL,
            PRIMARY KEY (account_id, revision)
        )$ddl$, 'balance_history_g' || gen);
    EXECUTE format('CREATE INDEX %I ON readmodel.%I (account_id, at, revision)',
        'balance_history_g' || gen || '_at', 'balance_history_g' || gen);
END
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION readmodel.generation_tables(projection text, gen integer) RETURNS SETOF text
LANGUAGE sql IMMUTABLE AS $fn$
    SELECT CASE WHEN projection = 'balances' THEN 'balance_history_g' || gen END
    WHERE projection = 'balances'
    UNION ALL
    SELECT readmodel.generation_tables_00002(projection, gen) WHERE projection <> 'balances'
$fn$;
-- +goose StatementEnd

SELECT readmodel.create_generation('balances', 1), readmodel.publish_generation('balances', 1);
INSERT INTO readmodel.checkpoints (name, generation, state) VALUES ('balances', 1, 'live');

-- +goose Down
-- The view first: it reads the generation's table, which DROP TABLE (no
-- CASCADE) would not drop under it.
DROP VIEW IF EXISTS readmodel.balance_history;
SELECT readmodel.drop_generation(name, generation) FROM readmodel.checkpoints WHERE name = 'balances';
DELETE FROM readmodel.checkpoints WHERE name = 'balances';
DROP FUNCTION readmodel.create_generation(text, integer);
DROP FUNCTION readmodel.generation_tables(text, integer);
ALTER FUNCTION readmodel.create_generation_00002(text, integer) RENAME TO create_generation;
ALTER FUNCTION readmodel.generation_tables_00002(text, integer) RENAME TO generation_tables;
