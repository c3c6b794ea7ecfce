-- A fresh rebuild's commands builder holds its command_accounts rows and
-- writes them once, at the end of its load (projections/heldaccounts.go,
-- 4a55768), while the generation's checkpoint moves on: a commands generation
-- being built, past the start, with an empty command_accounts is one whose
-- rows were never written (cmdAccountsWritten), which this build builds
-- afresh. An earlier build knows no such mark: it would resume the generation
-- and fold its later commands' replies from accounts it does not have (no
-- currency, nothing held), and its check, which compares the replies but not
-- command_accounts, can pass it (review r492).
--
-- Up: nothing; the schema is unchanged.
-- Down (before an earlier build runs): drop every such generation, as this
-- build's resume would; the earlier build's next rebuild creates a new one.
-- A generation with its rows, or at the start, is left to resume.

-- +goose Up
SELECT 1;

-- +goose Down
-- +goose StatementBegin
DO $do$
DECLARE
    c     record;
    empty boolean;
BEGIN
    -- A rebuild holds projections.rebuildLockID (0x6c6564676572) from before it
    -- creates its generations to its end: refuse beside one, as 00031's down.
    IF NOT pg_try_advisory_xact_lock(x'6c6564676572'::bigint) THEN
        RAISE EXCEPTION 'migration 00032 down: a rebuild is running (projector status); roll back when it has ended'
            USING ERRCODE = 'lock_not_available';
    END IF;
    FOR c IN SELECT generation FROM readmodel.checkpoints
        WHERE name = 'commands' AND state = 'building' AND (commit_position, prepare_position) <> (0, 0) LOOP
        EXECUTE format('SELECT NOT EXISTS (SELECT FROM readmodel.%I)', 'command_accounts_g' || c.generation) INTO empty;
        IF empty THEN
            DELETE FROM readmodel.checkpoints WHERE name = 'commands' AND generation = c.generation AND state = 'building';
            PERFORM readmodel.drop_generation('commands', c.generation);
        END IF;
    END LOOP;
END
$do$;
-- +goose StatementEnd
