package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/app/reply"
)

// The baseline is the pattern of the seed documents (000, 002), implemented as a
// payment team would: a table of idempotency keys with a pending/completed/failed
// state machine, the key claimed with INSERT … ON CONFLICT DO NOTHING, an existing
// key read with SELECT … FOR UPDATE, the balance UPDATE, the entry INSERT and the
// stored response, all in one transaction per command, on PostgreSQL through pgx.
// Business refusals mark the key failed with their response (seed 000: "mark the
// key failed for non-transient errors"), so a retry gets the same refusal.
//
// It serves open_account, deposit and withdraw: the commands the benchmark sends.

// baselineSchema is the seeds' schema. The seed's extra index on key is left out:
// the primary key already is that index (keeping both would only slow writes).
const baselineSchema = `
DO $$ BEGIN
	CREATE TYPE idempotency_status AS ENUM ('pending', 'completed', 'failed');
EXCEPTION WHEN duplicate_object THEN NULL; END $$;

CREATE TABLE IF NOT EXISTS idempotency_keys (
	key           varchar(255) PRIMARY KEY,
	actor_id      varchar(255) NOT NULL,
	request_hash  text NOT NULL,
	status        idempotency_status NOT NULL DEFAULT 'pending',
	response      jsonb,
	response_code int,
	locked_at     timestamptz,
	created_at    timestamptz NOT NULL DEFAULT now(),
	updated_at    timestamptz NOT NULL DEFAULT now()
);
-- For the TTL clean-up job of the seeds (keys here never expire, like the ledger's).
CREATE INDEX IF NOT EXISTS idx_idempotency_keys_created_at ON idempotency_keys (created_at);

CREATE TABLE IF NOT EXISTS accounts (
	account_id      text PRIMARY KEY,
	currency        char(3) NOT NULL,
	balance         bigint NOT NULL DEFAULT 0,
	overdraft_limit bigint NOT NULL DEFAULT 0,
	created_at      timestamptz NOT NULL DEFAULT now(),
	updated_at      timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS entries (
	id              bigserial PRIMARY KEY,
	account_id      text NOT NULL REFERENCES accounts (account_id),
	idempotency_key varchar(255) NOT NULL,
	amount          bigint NOT NULL,
	balance_after   bigint NOT NULL,
	created_at      timestamptz NOT NULL DEFAULT now()
);
-- The statement of an account.
CREATE INDEX IF NOT EXISTS idx_entries_account ON entries (account_id, id);
`

// baselineActor is the actor_id of the keys (the seeds scope keys by actor).
const baselineActor = "ledger-baseline"

// Baseline handles commands with the seed pattern. It implements natsapi.Handler,
// so that it sits behind the very intake the ledger uses.
type Baseline struct {
	pool *pgxpool.Pool
	// plainRead reads an existing key with a plain SELECT instead of SELECT … FOR
	// UPDATE (seed 002's variant). The lock is not needed for correctness here:
	// INSERT … ON CONFLICT already waited for a concurrent writer of the key, and
	// every write of an attempt commits together; but FOR UPDATE writes a row lock,
	// so every duplicate's commit waits for a WAL flush.
	plainRead bool
}

// NewBaseline creates the baseline's tables in pool's database (idempotently).
// plainRead selects seed 002's unlocked read of an existing key.
func NewBaseline(ctx context.Context, pool *pgxpool.Pool, plainRead bool) (*Baseline, error) {
	if _, err := pool.Exec(ctx, baselineSchema); err != nil {
		return nil, fmt.Errorf("bench: baseline schema: %w", err)
	}
	return &Baseline{pool: pool, plainRead: plainRead}, nil
}

// HandleRaw decodes a command as the ledger does and handles it; a batch
// (ledger.v1.cmd.batch) goes to HandleBatch.
func (b *Baseline) HandleRaw(ctx context.Context, typ string, body []byte) reply.Reply {
	if typ == string(domain.CmdBatch) {
		return b.HandleBatch(ctx, body, 0)
	}
	cmd, ierr := domain.DecodeCommand(domain.CommandType(typ), body)
	if ierr != nil {
		return reply.Invalid("", ierr)
	}
	return b.handleCommand(ctx, cmd)
}

// HandleBatch is the bulk endpoint a team would add to the seed pattern: the
// batch decoded as the ledger decodes it, then each command in its own
// transaction, one after another, in order (not atomic: the baseline has no
// atomic batches).
func (b *Baseline) HandleBatch(ctx context.Context, body []byte, _ int) reply.Reply {
	batch, ierr := domain.DecodeBatch(body)
	if ierr != nil {
		return reply.Invalid("", ierr)
	}
	if batch.Atomic {
		return reply.Invalid(batch.Key, &domain.InvalidError{Field: "atomic", Message: "the baseline has no atomic batches"})
	}
	replies := make([]reply.Reply, len(batch.Commands))
	for i, c := range batch.Commands {
		if c.Invalid != nil {
			replies[i] = reply.Invalid("", c.Invalid)
			continue
		}
		replies[i] = b.handleCommand(ctx, c.Command)
	}
	return reply.Batch(replies)
}

// handleCommand handles a decoded command.
func (b *Baseline) handleCommand(ctx context.Context, cmd domain.Command) reply.Reply {
	switch cmd.Type {
	case domain.CmdOpenAccount, domain.CmdDeposit, domain.CmdWithdraw:
	default:
		return reply.Reply{Status: domain.StatusInvalid, Code: domain.CodeInvalidRequest, IdempotencyKey: cmd.IdempotencyKey,
			Message: "the baseline serves open_account, deposit and withdraw only", Events: []domain.EventRef{}}
	}
	r, err := b.handle(ctx, cmd)
	if err != nil {
		return reply.Reply{Status: domain.StatusError, Code: domain.CodeInternalError, IdempotencyKey: cmd.IdempotencyKey,
			Message: "infrastructure failure, retry with the same key: " + err.Error(), Events: []domain.EventRef{}}
	}
	return r
}

func (b *Baseline) handle(ctx context.Context, cmd domain.Command) (r reply.Reply, err error) {
	hash := cmd.Request().Hash()
	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		// 1. Claim the key: a new key is inserted pending; a key that exists (or
		//    is being inserted by a concurrent transaction, which this waits for)
		//    inserts nothing.
		var claimed string
		err := tx.QueryRow(ctx, `INSERT INTO idempotency_keys (key, actor_id, request_hash, status, locked_at)
			VALUES ($1, $2, $3, 'pending', now()) ON CONFLICT (key) DO NOTHING RETURNING key`,
			cmd.IdempotencyKey, baselineActor, hash).Scan(&claimed)
		if errors.Is(err, pgx.ErrNoRows) {
			// 2. The key exists: lock it and answer from it.
			var (
				storedHash string
				status     string
				response   []byte
			)
			q := `SELECT request_hash, status, response FROM idempotency_keys WHERE key = $1 FOR UPDATE`
			if b.plainRead {
				q = `SELECT request_hash, status, response FROM idempotency_keys WHERE key = $1`
			}
			if err := tx.QueryRow(ctx, q, cmd.IdempotencyKey).Scan(&storedHash, &status, &response); err != nil {
				return fmt.Errorf("select key: %w", err)
			}
			if storedHash != hash {
				r = reply.Reply{Status: domain.StatusInvalid, Code: domain.CodeIdempotencyKeyConflict, IdempotencyKey: cmd.IdempotencyKey,
					Fields: []string{"request"}, Message: "idempotency key was used with a different request", Events: []domain.EventRef{}}
				return nil
			}
			if status == "completed" || status == "failed" {
				if err := json.Unmarshal(response, &r); err != nil {
					return fmt.Errorf("stored response: %w", err)
				}
				r.Duplicate = true
				return nil
			}
			// pending: an attempt that never committed its outcome (every write
			// of an attempt commits together, so this is a crashed writer's
			// leftover): take it over.
			if _, err := tx.Exec(ctx, `UPDATE idempotency_keys SET locked_at = now(), updated_at = now() WHERE key = $1`, cmd.IdempotencyKey); err != nil {
				return fmt.Errorf("relock key: %w", err)
			}
		} else if err != nil {
			return fmt.Errorf("insert key: %w", err)
		}
		// 3. The business change.
		r, err = b.apply(ctx, tx, cmd)
		if err != nil {
			return err
		}
		// 4. Store the outcome with the key.
		status, code := "completed", 200
		if r.Status != domain.StatusApplied {
			status, code = "failed", 422
		}
		resp, err := json.Marshal(r)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE idempotency_keys SET status = $2, response = $3, response_code = $4, locked_at = NULL, updated_at = now()
			WHERE key = $1`, cmd.IdempotencyKey, status, resp, code)
		if err != nil {
			return fmt.Errorf("complete key: %w", err)
		}
		return nil
	})
	return r, err
}

func (b *Baseline) apply(ctx context.Context, tx pgx.Tx, cmd domain.Command) (reply.Reply, error) {
	r := reply.Reply{Status: domain.StatusApplied, Code: domain.CodeOK, IdempotencyKey: cmd.IdempotencyKey, Events: []domain.EventRef{}}
	reject := func(code domain.Code, format string, args ...any) (reply.Reply, error) {
		r.Status, r.Code, r.Message = domain.StatusRejected, code, fmt.Sprintf(format, args...)
		return r, nil
	}
	view := func(currency string, balance int64) *domain.AccountView {
		return &domain.AccountView{AccountID: cmd.AccountID, Currency: strings.TrimSpace(currency), Balance: balance, Available: balance}
	}
	switch cmd.Type {
	case domain.CmdOpenAccount:
		tag, err := tx.Exec(ctx, `INSERT INTO accounts (account_id, currency, overdraft_limit) VALUES ($1, $2, $3) ON CONFLICT (account_id) DO NOTHING`,
			cmd.AccountID, cmd.Currency, cmd.OverdraftLimit)
		if err != nil {
			return r, fmt.Errorf("insert account: %w", err)
		}
		if tag.RowsAffected() == 0 {
			return reject(domain.CodeAccountExists, "account %s already exists", cmd.AccountID)
		}
		r.Account = view(cmd.Currency, 0)
		return r, nil
	case domain.CmdDeposit, domain.CmdWithdraw:
		delta := cmd.Amount
		q := `UPDATE accounts SET balance = balance + $2, updated_at = now() WHERE account_id = $1 AND currency = $3 RETURNING balance`
		if cmd.Type == domain.CmdWithdraw {
			delta = -cmd.Amount
			q = `UPDATE accounts SET balance = balance + $2, updated_at = now()
				WHERE account_id = $1 AND currency = $3 AND balance + $2 >= -overdraft_limit RETURNING balance`
		}
		var balance int64
		err := tx.QueryRow(ctx, q, cmd.AccountID, delta, cmd.Currency).Scan(&balance)
		if errors.Is(err, pgx.ErrNoRows) {
			var currency string
			var current int64
			err := tx.QueryRow(ctx, `SELECT currency, balance FROM accounts WHERE account_id = $1`, cmd.AccountID).Scan(&currency, &current)
			switch {
			case errors.Is(err, pgx.ErrNoRows):
				return reject(domain.CodeAccountNotFound, "account %s does not exist", cmd.AccountID)
			case err != nil:
				return r, fmt.Errorf("read account: %w", err)
			case strings.TrimSpace(currency) != cmd.Currency:
				return reject(domain.CodeCurrencyMismatch, "account %s holds %s, not %s", cmd.AccountID, currency, cmd.Currency)
			}
			return reject(domain.CodeInsufficientFunds, "account %s has %d", cmd.AccountID, current)
		}
		if err != nil {
			return r, fmt.Errorf("update balance: %w", err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO entries (account_id, idempotency_key, amount, balance_after) VALUES ($1, $2, $3, $4)`,
			cmd.AccountID, cmd.IdempotencyKey, delta, balance); err != nil {
			return r, fmt.Errorf("insert entry: %w", err)
		}
		r.Account = view(cmd.Currency, balance)
		return r, nil
	}
	return r, fmt.Errorf("bench: baseline cannot apply %s", cmd.Type)
}
