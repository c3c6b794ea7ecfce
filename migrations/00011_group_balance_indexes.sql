-- Group balances (PROTOCOL.md v1.2 ledger.v1.query.balances): the sums over
-- every account whose ID starts with a prefix. A prefix is a range of IDs
-- under the byte order of collation "C" (prefix <= account_id < the prefix with
-- its last byte incremented: IDs are ASCII), whatever the database's default
-- collation, whose order ignores ':' and '.' in most locales. These indexes
-- serve that range:
--
-- - accounts_g<N>_prefix on readmodel.accounts (account_id COLLATE "C"): the
--   current sums. account_id never changes, so updates of an account's row stay
--   HOT; no balance column is in the index for the same reason (a covering
--   index would make every balance update write both indexes).
-- - balance_history_g<N>_prefix on readmodel.balance_history (account_id
--   COLLATE "C") WHERE revision = 0: one entry per account (its opening event),
--   the set of accounts of a prefix as the balances projection knows them; the
--   sum as of a time takes each one's last row at or before it through the
--   (account_id, at, revision) index of 00004.
--
-- They are secondary indexes in the sense of 00009: a rebuild creates them
-- after its load. create_prefix_index is their one declaration; the generations
-- that exist get them here (a plain CREATE INDEX: it holds off the projector's
-- writes to that table, not its readers, while it scans the table once).

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION readmodel.create_prefix_index(projection text, gen integer) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    CASE projection
    WHEN 'accounts' THEN
        EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON readmodel.%I (account_id COLLATE "C")',
            'accounts_g' || gen || '_prefix', 'accounts_g' || gen);
    WHEN 'balances' THEN
        EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON readmodel.%I (account_id COLLATE "C") WHERE revision = 0',
            'balance_history_g' || gen || '_prefix', 'balance_history_g' || gen);
    ELSE
    END CASE;
END
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION readmodel.drop_prefix_index(projection text, gen integer) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    CASE projection
    WHEN 'accounts' THEN
        EXECUTE format('DROP INDEX IF EXISTS readmodel.%I', 'accounts_g' || gen || '_prefix');
    WHEN 'balances' THEN
        EXECUTE format('DROP INDEX IF EXISTS readmodel.%I', 'balance_history_g' || gen || '_prefix');
    ELSE
    END CASE;
END
$fn$;
-- +goose StatementEnd

ALTER FUNCTION readmodel.create_secondary_indexes(text, integer) RENAME TO create_secondary_indexes_before_00011;
ALTER FUNCTION readmodel.drop_secondary_indexes(text, integer) RENAME TO drop_secondary_indexes_before_00011;

-- +goose StatementBegin
CREATE FUNCTION readmodel.create_secondary_indexes(projection text, gen integer) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM readmodel.create_secondary_indexes_before_00011(projection, gen);
    PERFORM readmodel.create_prefix_index(projection, gen);
END
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION readmodel.drop_secondary_indexes(projection text, gen integer) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM readmodel.drop_secondary_indexes_before_00011(projection, gen);
    PERFORM readmodel.drop_prefix_index(projection, gen);
END
$fn$;
-- +goose StatementEnd

SELECT readmodel.create_prefix_index(name, generation) FROM readmodel.checkpoints WHERE name IN ('accounts', 'balances');

-- +goose Down
SELECT readmodel.drop_prefix_index(name, generation) FROM readmodel.checkpoints WHERE name IN ('accounts', 'balances');
DROP FUNCTION readmodel.drop_secondary_indexes(text, integer);
DROP FUNCTION readmodel.create_secondary_indexes(text, integer);
ALTER FUNCTION readmodel.drop_secondary_indexes_before_00011(text, integer) RENAME TO drop_secondary_indexes;
ALTER FUNCTION readmodel.create_secondary_indexes_before_00011(text, integer) RENAME TO create_secondary_indexes;
DROP FUNCTION readmodel.drop_prefix_index(text, integer);
DROP FUNCTION readmodel.create_prefix_index(text, integer);
