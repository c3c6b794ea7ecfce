package projections

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/internal/app/reply"
	"github.com/ledgerworks/ledger/internal/platform/pgcopy"
)

// commandsProjection maintains readmodel.commands: per client idempotency key, the
// reply the ledger gave when it decided the command (duplicate false), rebuilt
// from the events alone. It serves ledger.v1.query.command.
//
// An account command's reply shows the account right after it, so the projection
// keeps its own fold of every account (readmodel.command_accounts: currency,
// balance, held, revision); an event at or below that revision was applied
// already and is skipped, which makes a redelivered batch a no-op.
type commandsProjection struct{}

func (commandsProjection) Name() string { return Commands }

type cmdAccount struct {
	currency                string
	balance, held, revision int64
	dirty                   bool
}

type cmdRow struct {
	key, stream, command string
	reset                bool // the command's first event is in this batch
	reply                reply.Reply
	firstRev, lastRev    int64
	at                   time.Time
}

// clientCommand reports whether an event was written by a client's command under
// the client's own key (not by a saga step under a derived key).
func clientCommand(m domain.Metadata) bool {
	return m.Origin == "" && domain.CommandType(m.Command).IsClient()
}

func (p commandsProjection) Apply(ctx context.Context, tx pgx.Tx, gen int, events []*Event) error {
	return p.applyWith(ctx, tx, gen, events, nil)
}

// applyWith is Apply, the accounts' folds recalled from memo where it holds
// them and remembered in it.
func (commandsProjection) applyWith(ctx context.Context, tx pgx.Tx, gen int, events []*Event, memo *accountMemo) error {
	accounts, err := loadCmdAccounts(ctx, tx, gen, events, memo)
	if err != nil {
		return err
	}
	parts, err := loadParts(ctx, tx, gen, events)
	if err != nil {
		return err
	}
	b := &cmdBatch{accounts: accounts, parts: parts, rows: map[string]*cmdRow{}}
	for _, ev := range events {
		if err := b.apply(ev); err != nil {
			return err
		}
	}
	if err := writeCmdAccounts(ctx, tx, gen, accounts, memo); err != nil {
		return err
	}
	if err := parts.write(ctx, tx, gen); err != nil {
		return err
	}
	if len(b.order) == 0 {
		return nil
	}
	return writeCommands(ctx, tx, gen, b.rows, b.order)
}

// cmdBatch is what the commands projection gathers from one batch: the accounts'
// folds, the saga parts, and the reply rows by key in the order first seen.
type cmdBatch struct {
	accounts map[string]*cmdAccount
	parts    *cmdParts
	rows     map[string]*cmdRow
	order    []string
}

// apply applies one event: an account event to its account's fold and to its
// command's row or saga step, a transaction event as its decided row, a
// transfer-stream event to its saga's parts. Other streams are not commands'.
func (b *cmdBatch) apply(ev *Event) error {
	if id, ok := ev.AccountID(); ok {
		if ev.DecodeErr != nil {
			return cmdDecodeErr(ev)
		}
		b.applyAccountEvent(id, ev)
		return nil
	}
	if domain.IsTransactionStream(ev.Stream) {
		if ev.DecodeErr != nil {
			return cmdDecodeErr(ev)
		}
		return b.applyTransactionEvent(ev)
	}
	if strings.HasPrefix(ev.Stream, domain.TransferStreamPrefix) {
		if ev.DecodeErr != nil {
			return cmdDecodeErr(ev)
		}
		return b.parts.transferEvent(ev, b.decided)
	}
	if ev.Type == domain.EvBatchDecided && strings.HasPrefix(ev.Stream, domain.KeyStreamPrefix) {
		return b.applyBatchDecided(ev)
	}
	return nil
}

// applyBatchDecided records an atomic batch's decision as its key's row: the
// reply it records (reply.BatchDecided; an applied batch's elements are
// stubs, which the command query fills from their own rows).
func (b *cmdBatch) applyBatchDecided(ev *Event) error {
	var d domain.BatchDecided
	if err := json.Unmarshal(ev.Data, &d); err != nil {
		return fmt.Errorf("projections: commands: %s@%d: %w", ev.Stream, ev.Revision, err)
	}
	m, err := domain.DecodeMetadata(ev.Metadata)
	if err != nil {
		return fmt.Errorf("projections: commands: %s@%d: %w", ev.Stream, ev.Revision, err)
	}
	r, err := reply.BatchDecided(&d)
	if err != nil {
		return fmt.Errorf("projections: commands: %w", err)
	}
	b.decided(&cmdRow{key: d.Key, stream: ev.Stream, command: string(domain.CmdBatch), reset: true, reply: r, at: m.At})
	return nil
}

// cmdDecodeErr is the error of an event the commands projection cannot decode.
func cmdDecodeErr(ev *Event) error {
	return fmt.Errorf("projections: commands: %s@%d: %w", ev.Stream, ev.Revision, ev.DecodeErr)
}

// applyAccountEvent folds an event of account id, unless an earlier batch did,
// and records the account right after it in its saga step or in its client
// command's reply.
func (b *cmdBatch) applyAccountEvent(id string, ev *Event) {
	a := b.accounts[id]
	if a == nil {
		a = &cmdAccount{revision: -1}
		b.accounts[id] = a
	}
	if int64(ev.Revision) <= a.revision {
		return // applied by an earlier batch
	}
	evolveCmdAccount(a, ev)
	view := &domain.AccountView{
		AccountID: id, Currency: a.currency, Balance: a.balance, Held: a.held,
		Available: a.balance - a.held, Revision: uint64(a.revision),
	}
	if sagaStep(ev.Meta) {
		b.parts.step(ev, view)
		return
	}
	if !clientCommand(ev.Meta) {
		return
	}
	r := b.rowOf(ev)
	switch p := ev.Payload.(type) {
	case *domain.CommandRejected:
		r.reply.Status, r.reply.Code, r.reply.Message = domain.StatusRejected, p.Code, p.Message
	case *domain.Debited:
		if p.Requested != nil { // up_to (v1.2 §2.3): the reply says what moved
			r.reply.Moved = &p.Amount
		}
	}
	r.reply.Account = view
}

// applyTransactionEvent records a transaction's event, which decides its
// command in one write, as the command's row.
func (b *cmdBatch) applyTransactionEvent(ev *Event) error {
	if ev.Type != domain.EvTransactionPosted && ev.Type != domain.EvTransactionRejected {
		return nil // a reservation saga's request or marker: its outcome is the reply
	}
	key := domain.ClientKey(ev.Meta) // a saga's outcome is written under a derived key
	ref := domain.EventRef{ID: ev.ID, Stream: ev.Stream, Revision: ev.Revision, Type: ev.Type}
	r, err := reply.Transaction(key, ref, ev.Payload, ev.Position.String(), false)
	if err != nil {
		return fmt.Errorf("projections: commands: %w", err)
	}
	b.decided(&cmdRow{key: key, stream: ev.Stream, command: ev.Meta.Command, reset: true, reply: r,
		firstRev: int64(ev.Revision), lastRev: int64(ev.Revision), at: ev.Meta.At})
	return nil
}

// rowOf returns the row of the client command an account event belongs to (a
// new one at the command's first event) with the event added to its reply.
func (b *cmdBatch) rowOf(ev *Event) *cmdRow {
	m := ev.Meta
	r := b.rows[m.Key]
	if r == nil || m.Index == 0 {
		if r == nil {
			b.order = append(b.order, m.Key)
		}
		r = &cmdRow{key: m.Key, stream: ev.Stream, command: m.Command, reset: m.Index == 0, firstRev: int64(ev.Revision), at: m.At}
		r.reply = reply.Reply{Status: domain.StatusApplied, Code: domain.CodeOK, IdempotencyKey: m.Key, Events: []domain.EventRef{}}
		b.rows[m.Key] = r
	}
	r.lastRev = int64(ev.Revision)
	r.reply.Events = append(r.reply.Events, domain.EventRef{ID: ev.ID, Stream: ev.Stream, Revision: ev.Revision, Type: ev.Type})
	r.reply.Position = ev.Position.String()
	return r
}

// decided records the row of a command decided whole (a transaction, a saga).
func (b *cmdBatch) decided(r *cmdRow) {
	if b.rows[r.key] == nil {
		b.order = append(b.order, r.key)
	}
	b.rows[r.key] = r
}

// evolveCmdAccount folds what a reply shows of an account (NextBalance).
func evolveCmdAccount(a *cmdAccount, ev *Event) {
	if s, err := NextBalance(BalanceState{Currency: a.currency, Balance: a.balance, Held: a.held}, ev.Payload); err == nil {
		a.currency, a.balance, a.held = s.Currency, s.Balance, s.Held
	}
	a.revision = int64(ev.Revision)
	a.dirty = true
}

// loadCmdAccounts reads the folds of the events' accounts (those memo holds
// from it; an account with none is not in the map).
func loadCmdAccounts(ctx context.Context, tx pgx.Tx, gen int, events []*Event, memo *accountMemo) (map[string]*cmdAccount, error) {
	ids := accountIDs(events)
	out := make(map[string]*cmdAccount, len(ids))
	ids = memo.recall(ids, func(id string, a memoAccount) {
		if a.rev >= 0 {
			out[id] = &cmdAccount{currency: a.state.Currency, balance: a.state.Balance, held: a.state.Held, revision: a.rev}
		}
	})
	if len(ids) == 0 {
		return out, nil
	}
	rows, err := tx.Query(ctx, fmt.Sprintf(`SELECT account_id, currency, balance, held, revision FROM %s WHERE account_id = ANY($1)`, Table("command_accounts", gen)), ids)
	if err != nil {
		return nil, fmt.Errorf("projections: commands: %w", err)
	}
	var (
		id string
		a  cmdAccount
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &a.currency, &a.balance, &a.held, &a.revision}, func() error {
		c := a
		out[id] = &c
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("projections: commands: %w", err)
	}
	return out, nil
}

// cmdAccountColumns are a command_accounts row's columns, in the order its
// writes give them (the upsert's unnest, the held rows' COPY).
var cmdAccountColumns = []string{"account_id", "currency", "balance", "held", "revision"}

// writeCmdAccounts writes the folds the batch changed, and remembers them in
// memo; a memo that holds the generation's rows unwritten (holdCmdAccounts)
// keeps them, and writes them all once it passes its bound, with the batch's.
func writeCmdAccounts(ctx context.Context, tx pgx.Tx, gen int, accounts map[string]*cmdAccount, memo *accountMemo) error {
	var ids []string
	for id, a := range accounts {
		if a.dirty {
			ids = append(ids, id)
			memo.remember(id, memoAccount{state: BalanceState{Currency: a.currency, Balance: a.balance, Held: a.held}, rev: a.revision})
		}
	}
	if memo.holding() {
		if memo.complete {
			return nil
		}
		if err := writeMemoCmdAccounts(ctx, tx, gen, memo); err != nil {
			return err
		}
		memo.unwritten = false // the batch's failure fails the rebuild, and the memo with it
	}
	if len(ids) == 0 {
		return nil
	}
	sort.Strings(ids)
	n := len(ids)
	currency := make([]string, n)
	balance, held, rev := make([]int64, n), make([]int64, n), make([]int64, n)
	for i, id := range ids {
		a := accounts[id]
		currency[i], balance[i], held[i], rev[i] = a.currency, a.balance, a.held, a.revision
	}
	sql := fmt.Sprintf(`INSERT INTO %s AS a (%s)
SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::bigint[])
ON CONFLICT (account_id) DO UPDATE SET currency = excluded.currency, balance = excluded.balance, held = excluded.held, revision = excluded.revision
WHERE a.revision < excluded.revision`, Table("command_accounts", gen), strings.Join(cmdAccountColumns, ", "))
	if _, err := tx.Exec(ctx, sql, ids, currency, balance, held, rev); err != nil {
		return fmt.Errorf("projections: commands: %w", err)
	}
	return nil
}

// writeMemoCmdAccounts writes every fold memo holds to generation gen's
// command_accounts, which has none of them (holdCmdAccounts), by COPY.
func writeMemoCmdAccounts(ctx context.Context, tx pgx.Tx, gen int, memo *accountMemo) error {
	ids := make([]string, 0, len(memo.m))
	for id := range memo.m {
		ids = append(ids, id)
	}
	sort.Strings(ids) // the key's insertions in its order
	err := copyOrUpsert(ctx, tx, memoCmdAccountsCopy(gen, memo, ids), func() error {
		return fmt.Errorf("generation %d's command_accounts holds rows its held rows' write did not expect", gen)
	})
	if err != nil {
		return fmt.Errorf("projections: commands: %w", err)
	}
	return nil
}

// memoCmdAccountsCopy is the COPY of the folds memo holds to generation gen's
// command_accounts, in the order of ids.
func memoCmdAccountsCopy(gen int, memo *accountMemo, ids []string) genRows {
	return genRows{base: "command_accounts", gen: gen, columns: cmdAccountColumns, n: len(ids), row: func(c *pgcopy.Buf, i int) error {
		r := memo.m[ids[i]]
		c.Text(ids[i]).Text(memo.names[r.currency]).Int8(r.balance).Int8(r.held).Int8(r.rev)
		return nil
	}}
}

func writeCommands(ctx context.Context, tx pgx.Tx, gen int, rows map[string]*cmdRow, order []string) error {
	sort.Strings(order)
	if err := mergeContinuations(ctx, tx, gen, rows, order); err != nil {
		return err
	}
	// A command's row is new unless the batch, or its first part, was applied before.
	cols := []string{"idempotency_key", "stream", "command", "status", "code", "first_revision", "last_revision", "reply", "at"}
	n := len(order)
	var buf []byte // the row's reply: rendered into the COPY's buffer, not a string each
	err := copyOrUpsert(ctx, tx, genRows{base: "commands", gen: gen, columns: cols, n: n, row: func(c *pgcopy.Buf, i int) error {
		r := rows[order[i]]
		buf = reply.AppendJSON(buf[:0], r.reply)
		c.Text(r.key).Text(r.stream).Text(r.command).Text(string(r.reply.Status)).Text(string(r.reply.Code)).Int8(r.firstRev).Int8(r.lastRev).Bytes(buf).Timestamptz(r.at)
		return nil
	}}, func() error {
		replies := make([]string, n)
		for i, k := range order {
			buf = reply.AppendJSON(buf[:0], rows[k].reply)
			replies[i] = string(buf)
		}
		var (
			keys, streams, commands, statuses, codes = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
			first, last                              = make([]int64, n), make([]int64, n)
			ats                                      = make([]time.Time, n)
		)
		for i, k := range order {
			r := rows[k]
			keys[i], streams[i], commands[i], statuses[i], codes[i] = r.key, r.stream, r.command, string(r.reply.Status), string(r.reply.Code)
			first[i], last[i], ats[i] = r.firstRev, r.lastRev, r.at
		}
		sql := fmt.Sprintf(`INSERT INTO %s AS c (idempotency_key, stream, command, status, code, first_revision, last_revision, reply, at)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bigint[], $7::bigint[], $8::json[], $9::timestamptz[])
ON CONFLICT (idempotency_key) DO UPDATE SET status = excluded.status, code = excluded.code,
	first_revision = excluded.first_revision, last_revision = excluded.last_revision, reply = excluded.reply, at = excluded.at
WHERE c.stream = excluded.stream AND c.last_revision < excluded.last_revision`, Table("commands", gen))
		_, err := tx.Exec(ctx, sql, keys, streams, commands, statuses, codes, first, last, replies, ats)
		return err
	})
	if err != nil {
		return fmt.Errorf("projections: commands: %w", err)
	}
	return nil
}

// mergeContinuations completes the rows of commands whose events were split
// between batches (the first event in an earlier one): the reply written then
// gets this batch's events appended.
func mergeContinuations(ctx context.Context, tx pgx.Tx, gen int, rows map[string]*cmdRow, order []string) error {
	var keys []string
	for _, k := range order {
		if !rows[k].reset {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	q, err := tx.Query(ctx, fmt.Sprintf(`SELECT idempotency_key, stream, first_revision, last_revision, reply::text, at FROM %s WHERE idempotency_key = ANY($1)`, Table("commands", gen)), keys)
	if err != nil {
		return fmt.Errorf("projections: commands: %w", err)
	}
	var (
		key, stream, stored string
		first, last         int64
		at                  time.Time
	)
	_, err = pgx.ForEachRow(q, []any{&key, &stream, &first, &last, &stored, &at}, func() error {
		r := rows[key]
		if r == nil || r.stream != stream || last >= r.firstRev {
			return nil // another stream's key, or applied already: the upsert's guard skips it
		}
		var prev reply.Reply
		if err := json.Unmarshal([]byte(stored), &prev); err != nil {
			return fmt.Errorf("projections: commands: reply of %q: %w", key, err)
		}
		prev.Events = append(prev.Events, r.reply.Events...)
		prev.Account, prev.Transfer, prev.Position = r.reply.Account, r.reply.Transfer, r.reply.Position
		if r.reply.Moved != nil {
			prev.Moved = r.reply.Moved
		}
		if r.reply.Status != domain.StatusApplied {
			prev.Status, prev.Code, prev.Message = r.reply.Status, r.reply.Code, r.reply.Message
		}
		r.reply, r.firstRev, r.at, r.reset = prev, first, at, true
		return nil
	})
	if err != nil {
		return fmt.Errorf("projections: commands: %w", err)
	}
	return nil
}
