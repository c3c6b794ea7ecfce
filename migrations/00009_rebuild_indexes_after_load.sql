-- A rebuild loads a new generation's tables first and builds its secondary
-- indexes (those no write of the load needs: not the unique ones, which the
-- projections' conflict rules use) after the load, in one pass over sorted
-- rows instead of one insertion per row (issue 23). These two functions name
-- those indexes; the rebuild drops them when it creates a generation and
-- creates them before it checks and switches to it. From this migration on,
-- create_secondary_indexes is where a read model's secondary index is
-- declared (00004's create_generation still creates balance_history's, for a
-- generation made outside a rebuild).

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION readmodel.create_secondary_indexes(projection text, gen integer) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    IF projection = 'balances' THEN
        EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON readmodel.%I (account_id, at, revision)',
            'balance_history_g' || gen || '_at', 'balance_history_g' || gen);
    END IF;
END
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION readmodel.drop_secondary_indexes(projection text, gen integer) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    IF projection = 'balances' THEN
        EXECUTE format('DROP INDEX IF EXISTS readmodel.%I', 'balance_history_g' || gen || '_at');
    END IF;
END
$fn$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION readmodel.drop_secondary_indexes(text, integer);
DROP FUNCTION readmodel.create_secondary_indexes(text, integer);
