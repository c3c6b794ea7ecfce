-- Statement entries carry the client's metadata of the command that moved the
-- money (PROTOCOL.md v1.1 §2 and §4). The entries tables of the generations that
-- exist get the column (their rows predate v1.1: no metadata, '{}'), later
-- generations get it from create_generation, and the view is pointed at the
-- live table again so that it shows the column.

-- +goose Up
ALTER FUNCTION readmodel.create_generation(text, integer) RENAME TO create_generation_00004;

-- +goose StatementBegin
CREATE FUNCTION readmodel.create_generation(projection text, gen integer) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM readmodel.create_generation_00004(projection, gen);
    IF projection = 'entries' THEN
        EXECUTE format($ddl$ALTER TABLE readmodel.%I ADD COLUMN metadata jsonb NOT NULL DEFAULT '{}'$ddl$, 'entries_g' || gen);
    END IF;
END
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
DO $do$
DECLARE
    g integer;
BEGIN
    FOR g IN SELECT generation FROM readmodel.checkpoints WHERE name = 'entries' LOOP
        EXECUTE format($ddl$ALTER TABLE readmodel.%I ADD COLUMN IF NOT EXISTS metadata jsonb NOT NULL DEFAULT '{}'$ddl$, 'entries_g' || g);
    END LOOP;
    PERFORM readmodel.publish_generation('entries', generation) FROM readmodel.checkpoints WHERE name = 'entries' AND state = 'live';
END
$do$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION readmodel.create_generation(text, integer);
ALTER FUNCTION readmodel.create_generation_00004(text, integer) RENAME TO create_generation;
