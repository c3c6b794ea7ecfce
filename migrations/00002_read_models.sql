-- Read models (ARCHITECTURE decision 9), written by cmd/projector.
--
-- Each projection (accounts, entries, transfers, commands) owns tables that exist
-- in generations: readmodel.<table>_g<N>. Readers use the views readmodel.<table>,
-- which point at the live generation. A rebuild creates generation N+1 beside the
-- live one, fills it from the start of "all", checks it, and then, in one
-- transaction, points the views at it, makes its checkpoint live and drops
-- generation N: readers never see a half-built model.
--
-- readmodel.checkpoints holds one row per (projection, generation): the live one
-- and any being built. A batch's read-model rows and its checkpoint commit in one
-- transaction that compare-and-sets the checkpoint (generation and position), so a
-- second runner, or a runner racing a switch, can never apply a batch twice.
-- Positions are eventstore.Position (commit, prepare), compared as a row.
--
-- Tables updated in place (accounts, holds, transfers, the commands projection's
-- account fold) leave room in each page (fillfactor) so that updates stay HOT.
--
-- The layout of a generation is the body of readmodel.create_generation: a later
-- migration that changes a read model replaces that function (and the views), and
-- `projector rebuild` then builds the new layout beside the old one.

-- +goose Up
CREATE SCHEMA readmodel;

CREATE SEQUENCE readmodel.generation_seq START 2; -- generation 1 is created below

CREATE TABLE readmodel.checkpoints (
    name             text        NOT NULL,
    generation       integer     NOT NULL,
    state            text        NOT NULL CHECK (state IN ('live', 'building')),
    commit_position  bigint      NOT NULL DEFAULT 0 CHECK (commit_position >= 0),
    prepare_position bigint      NOT NULL DEFAULT 0 CHECK (prepare_position >= 0),
    events           bigint      NOT NULL DEFAULT 0, -- events this generation has consumed
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, generation)
);
CREATE UNIQUE INDEX checkpoints_one_live ON readmodel.checkpoints (name) WHERE state = 'live';

-- +goose StatementBegin
-- create_generation creates the empty tables of one projection's generation.
CREATE FUNCTION readmodel.create_generation(projection text, gen integer) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    g text := '_g' || gen;
BEGIN
    CASE projection
    WHEN 'accounts' THEN
        EXECUTE format($ddl$
            CREATE TABLE readmodel.%I (
                account_id      text        PRIMARY KEY,
                currency        text        NOT NULL,
                overdraft_limit bigint      NOT NULL,
                metadata        jsonb       NOT NULL DEFAULT '{}',
                status          text        NOT NULL CHECK (status IN ('open', 'closed')),
                balance         bigint      NOT NULL,
                held            bigint      NOT NULL,
                available       bigint      GENERATED ALWAYS AS (balance - held) STORED,
                revision        bigint      NOT NULL, -- the stream's last revision applied
                opened_at       timestamptz NOT NULL,
                updated_at      timestamptz NOT NULL
            ) WITH (fillfactor = 50)$ddl$, 'accounts' || g);
        EXECUTE format($ddl$
            CREATE TABLE readmodel.%I (
                account_id      text        NOT NULL,
                hold_id         text        NOT NULL,
                amount          bigint      NOT NULL,
                currency        text        NOT NULL,
                status          text        NOT NULL CHECK (status IN ('active', 'captured', 'released', 'expired')),
                captured        bigint      NOT NULL DEFAULT 0,
                expires_at      timestamptz,
                idempotency_key text        NOT NULL, -- the key that placed it
                revision        bigint      NOT NULL, -- revision of the hold's last change
                placed_at       timestamptz NOT NULL,
                updated_at      timestamptz NOT NULL,
                PRIMARY KEY (account_id, hold_id)
            ) WITH (fillfactor = 70)$ddl$, 'holds' || g);
    WHEN 'entries' THEN
        EXECUTE format($ddl$
            CREATE TABLE readmodel.%I (
                event_id        uuid        PRIMARY KEY,
                account_id      text        NOT NULL,
                revision        bigint      NOT NULL,
                type            text        NOT NULL,
                reason          text        NOT NULL,
                ref             text        NOT NULL DEFAULT '',
                amount          bigint      NOT NULL, -- signed: credits positive, debits negative
                currency        text        NOT NULL,
                balance_after   bigint      NOT NULL,
                idempotency_key text        NOT NULL,
                at              timestamptz NOT NULL,
                UNIQUE (account_id, revision)
            )$ddl$, 'entries' || g);
    WHEN 'transfers' THEN
        EXECUTE format($ddl$
            CREATE TABLE readmodel.%I (
                transfer_id     text        PRIMARY KEY,
                from_account    text        NOT NULL,
                to_account      text        NOT NULL,
                amount          bigint      NOT NULL,
                currency        text        NOT NULL,
                status          text        NOT NULL CHECK (status IN ('pending', 'completed', 'rejected', 'failed')),
                code            text        NOT NULL DEFAULT '',
                refunded        bigint      NOT NULL DEFAULT 0,
                idempotency_key text        NOT NULL,
                revision        bigint      NOT NULL,
                requested_at    timestamptz NOT NULL,
                updated_at      timestamptz NOT NULL
            ) WITH (fillfactor = 70)$ddl$, 'transfers' || g);
    WHEN 'commands' THEN
        EXECUTE format($ddl$
            CREATE TABLE readmodel.%I (
                idempotency_key text        PRIMARY KEY,
                stream          text        NOT NULL, -- the stream that decided it
                command         text        NOT NULL,
                status          text        NOT NULL,
                code            text        NOT NULL,
                first_revision  bigint      NOT NULL,
                last_revision   bigint      NOT NULL,
                reply           json        NOT NULL, -- the original reply, duplicate false, as the ledger encodes it
                at              timestamptz NOT NULL
            )$ddl$, 'commands' || g);
        -- The commands projection's own fold of each account (the reply shows the
        -- account right after the command); not a public read model.
        EXECUTE format($ddl$
            CREATE TABLE readmodel.%I (
                account_id text   PRIMARY KEY,
                currency   text   NOT NULL,
                balance    bigint NOT NULL,
                held       bigint NOT NULL,
                revision   bigint NOT NULL
            ) WITH (fillfactor = 50)$ddl$, 'command_accounts' || g);
        -- Sagas not yet decided: their transfer-stream events and the records of
        -- their steps in account streams, until the decision writes the reply.
        EXECUTE format($ddl$
            CREATE TABLE readmodel.%I (
                key      text   PRIMARY KEY, -- transfer/<id>, saga/<key> or step/<key>
                revision bigint NOT NULL,    -- stream revision of the last event applied
                data     json   NOT NULL
            )$ddl$, 'command_parts' || g);
    ELSE
        RAISE EXCEPTION 'readmodel: unknown projection %', projection;
    END CASE;
END
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
-- generation_tables lists the tables of a projection's generation.
CREATE FUNCTION readmodel.generation_tables(projection text, gen integer) RETURNS SETOF text
LANGUAGE sql IMMUTABLE AS $fn$
    SELECT t || '_g' || gen FROM unnest(CASE projection
        WHEN 'accounts'  THEN ARRAY['accounts', 'holds']
        WHEN 'entries'   THEN ARRAY['entries']
        WHEN 'transfers' THEN ARRAY['transfers']
        WHEN 'commands'  THEN ARRAY['commands', 'command_accounts', 'command_parts']
    END) AS t
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
-- publish_generation points the projection's views at generation gen.
CREATE FUNCTION readmodel.publish_generation(projection text, gen integer) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    t text;
BEGIN
    FOR t IN SELECT * FROM readmodel.generation_tables(projection, gen) LOOP
        EXECUTE format('CREATE OR REPLACE VIEW readmodel.%I AS SELECT * FROM readmodel.%I',
            regexp_replace(t, '_g[0-9]+$', ''), t);
    END LOOP;
END
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
-- drop_generation drops the tables of a projection's generation.
CREATE FUNCTION readmodel.drop_generation(projection text, gen integer) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    t text;
BEGIN
    FOR t IN SELECT * FROM readmodel.generation_tables(projection, gen) LOOP
        EXECUTE format('DROP TABLE IF EXISTS readmodel.%I', t);
    END LOOP;
END
$fn$;
-- +goose StatementEnd

SELECT readmodel.create_generation(p, 1), readmodel.publish_generation(p, 1)
FROM unnest(ARRAY['accounts', 'entries', 'transfers', 'commands']) AS p;
INSERT INTO readmodel.checkpoints (name, generation, state)
SELECT p, 1, 'live' FROM unnest(ARRAY['accounts', 'entries', 'transfers', 'commands']) AS p;

-- +goose Down
DROP SCHEMA readmodel CASCADE;
