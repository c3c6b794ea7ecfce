-- A full audit stopped (SIGINT, SIGTERM) stores a stop point (issue 23: a
-- full audit stopped and resumed, docs/design.md): the fold's bounded state
-- as a checkpoint carries it (its state and a row per account), beside the
-- violations found so far, in a row of audit_checkpoints of a kind of its
-- own. A stop point is no verdict: `ledger audit --from <id|last>` never
-- selects one and `--expect-digest` never anchors one.
--
-- audit_checkpoints.kind
--                       'checkpoint' (a clean audit's result, every row
--                       stored before 00028) or 'stop' (a stopped full
--                       audit's stop point; at most one: a new one replaces
--                       it). A stop point has no read models' digests
--                       (accounts_table_digest, active_holds_digest NULL),
--                       so a build before 00028, which reads every row as a
--                       checkpoint, refuses it ("without its digests")
--                       rather than trusting it.
-- audit_checkpoints.sets
--                       a stop point's sets that grow with history: the
--                       schema of its UNLOGGED tables (event IDs, command
--                       groups, key homes and claims, read-model rows noted),
--                       named by its run; NULL for a checkpoint.

-- +goose Up
-- ALTER TABLE takes ACCESS EXCLUSIVE on the checkpoints, which an audit reads
-- in its long transaction: past lock_timeout the migration fails, rolled
-- back, rather than queueing every reader of the table behind it (as 00018).
SET LOCAL lock_timeout = '10s';
-- +goose StatementBegin
DO $do$
BEGIN
    ALTER TABLE readmodel.audit_checkpoints
        ADD COLUMN kind text NOT NULL DEFAULT 'checkpoint' CONSTRAINT audit_checkpoints_kind CHECK (kind IN ('checkpoint', 'stop')),
        ADD COLUMN sets text,
        ADD CONSTRAINT audit_checkpoints_stop_sets CHECK ((kind = 'stop') = (sets IS NOT NULL) AND sets ~ '^audit_sets_[0-9a-f]{16}$');
    CREATE UNIQUE INDEX audit_checkpoints_one_stop ON readmodel.audit_checkpoints ((true)) WHERE kind = 'stop';
EXCEPTION WHEN lock_not_available THEN
    RAISE EXCEPTION 'migration 00028 waited more than lock_timeout (%) for a lock on the audit checkpoints (%) and changed nothing: stop audits (ledger audit) and other long transactions on them, then migrate again (docs/operations.md, "Upgrading")',
        current_setting('lock_timeout'), SQLERRM USING ERRCODE = 'lock_not_available';
END
$do$;
-- +goose StatementEnd

-- +goose Down
SET LOCAL lock_timeout = '10s';
-- The build before reads every row as a checkpoint: the stop points go, and
-- their sets with them.
-- +goose StatementBegin
DO $do$
DECLARE s text;
BEGIN
    FOR s IN SELECT sets FROM readmodel.audit_checkpoints WHERE kind = 'stop' LOOP
        EXECUTE format('DROP SCHEMA IF EXISTS %I CASCADE', s);
    END LOOP;
END
$do$;
-- +goose StatementEnd
DELETE FROM readmodel.audit_checkpoints WHERE kind = 'stop';
DROP INDEX readmodel.audit_checkpoints_one_stop;
ALTER TABLE readmodel.audit_checkpoints DROP COLUMN sets, DROP COLUMN kind;
