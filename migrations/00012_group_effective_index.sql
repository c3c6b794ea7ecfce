-- Group balances by effective time (PROTOCOL.md v1.2 §2.3, ledger.v1.query.balances
-- with effective_at). The sum is a fold of every balance-history row of the
-- group's accounts in (account, revision) order (projections.EffectiveBalancesSQL).
-- The primary key has that order under the database's collation, but a group
-- is a range of IDs under collation "C" (00011), so through it each account
-- was folded in a lateral subquery of its own: 6-7 s over 100,000 accounts
-- (BENCHMARKS.md). This index gives the group's rows in the fold's order under
-- "C", with every column the fold reads, so that the whole group is one
-- index-only range scan, the window and the sums streaming over it, no sort:
--
-- - balance_history_g<N>_effective on readmodel.balance_history
--   (account_id COLLATE "C", revision) INCLUDE (currency, status, balance,
--   held, effective_at).
--
-- Its price: each projected balance row writes one more index entry (the
-- table's fourth; about half the row's size). Like 00011's, it is a secondary
-- index in the sense of 00009: a rebuild creates it after its load; the
-- generations that exist get it here (create_effective_index is its one
-- declaration).

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION readmodel.create_effective_index(gen integer) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON readmodel.%I (account_id COLLATE "C", revision) INCLUDE (currency, status, balance, held, effective_at)',
        'balance_history_g' || gen || '_effective', 'balance_history_g' || gen);
END
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION readmodel.drop_effective_index(gen integer) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    EXECUTE format('DROP INDEX IF EXISTS readmodel.%I', 'balance_history_g' || gen || '_effective');
END
$fn$;
-- +goose StatementEnd

ALTER FUNCTION readmodel.create_secondary_indexes(text, integer) RENAME TO create_secondary_indexes_before_00012;
ALTER FUNCTION readmodel.drop_secondary_indexes(text, integer) RENAME TO drop_secondary_indexes_before_00012;

-- +goose StatementBegin
CREATE FUNCTION readmodel.create_secondary_indexes(projection text, gen integer) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM readmodel.create_secondary_indexes_before_00012(projection, gen);
    IF projection = 'balances' THEN
        PERFORM readmodel.create_effective_index(gen);
    END IF;
END
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION readmodel.drop_secondary_indexes(projection text, gen integer) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM readmodel.drop_secondary_indexes_before_00012(projection, gen);
    IF projection = 'balances' THEN
        PERFORM readmodel.drop_effective_index(gen);
    END IF;
END
$fn$;
-- +goose StatementEnd

SELECT readmodel.create_effective_index(generation) FROM readmodel.checkpoints WHERE name = 'balances';

-- +goose Down
SELECT readmodel.drop_effective_index(generation) FROM readmodel.checkpoints WHERE name = 'balances';
DROP FUNCTION readmodel.drop_secondary_indexes(text, integer);
DROP FUNCTION readmodel.create_secondary_indexes(text, integer);
ALTER FUNCTION readmodel.drop_secondary_indexes_before_00012(text, integer) RENAME TO drop_secondary_indexes;
ALTER FUNCTION readmodel.create_secondary_indexes_before_00012(text, integer) RENAME TO create_secondary_indexes;
DROP FUNCTION readmodel.drop_effective_index(integer);
DROP FUNCTION readmodel.create_effective_index(integer);
