package query

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/app/reply"
	"github.com/ledgerworks/ledger/projections"
)

// Names of the queries (the last token of their subjects).
const (
	QueryAccount  = "account"
	QueryEntries  = "entries"
	QueryTransfer = "transfer"
	QueryCommand  = "command"
	QueryBalance  = "balance"
	QueryBalances = "balances" // v1.2
)

// Queries lists every query.
var Queries = []string{QueryAccount, QueryEntries, QueryTransfer, QueryCommand, QueryBalance, QueryBalances}

// ReadModelQueries are the queries a read side serves beside a ledger, whose
// own intake answers QueryCommand from the event store.
var ReadModelQueries = []string{QueryAccount, QueryEntries, QueryTransfer, QueryBalance, QueryBalances}

// Limits of the entries query.
const (
	DefaultEntriesLimit = 100
	MaxEntriesLimit     = 1000
)

// CodeProjectionBehind is the code of a query whose min_position the read
// model had not reached in time.
const CodeProjectionBehind = reply.CodeProjectionBehind

// Options configure a Service. Zero values take the defaults.
type Options struct {
	// MaxWait bounds how long a query waits for its min_position (default 5s).
	MaxWait time.Duration
	// PollInterval is how often a waiting query looks at the checkpoint (default 10ms).
	PollInterval time.Duration
	Logger       *slog.Logger
	Metrics      *Metrics
}

// Service answers queries from the read models in pool.
type Service struct {
	pool *pgxpool.Pool
	opts Options
	log  *slog.Logger
}

// New returns a Service over the read-model database.
func New(pool *pgxpool.Pool, opts Options) *Service {
	if opts.MaxWait <= 0 {
		opts.MaxWait = 5 * time.Second
	}
	if opts.PollInterval <= 0 {
		opts.PollInterval = 10 * time.Millisecond
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Service{pool: pool, opts: opts, log: opts.Logger}
}

// AccountRequest is the body of ledger.v1.query.account.
type AccountRequest struct {
	AccountID   string `json:"account_id"`
	MinPosition string `json:"min_position,omitempty"`
}

// EntriesRequest is the body of ledger.v1.query.entries.
type EntriesRequest struct {
	AccountID     string `json:"account_id"`
	AfterRevision *int64 `json:"after_revision,omitempty"` // default: from the first
	Limit         *int   `json:"limit,omitempty"`          // default 100, at most 1000
	// From and To (RFC 3339, v1.1) keep the entries with From <= at < To,
	// or From <= effective_at < To when By is "effective" (v1.2 §2.3).
	From        string `json:"from,omitempty"`
	To          string `json:"to,omitempty"`
	By          string `json:"by,omitempty"` // "" or "record": at; "effective": effective_at
	MinPosition string `json:"min_position,omitempty"`
}

// The times From and To of an entries query may filter by (EntriesRequest.By).
const (
	ByRecord    = "record"
	ByEffective = "effective"
)

// BalanceRequest is the body of ledger.v1.query.balance (v1.1): the account as
// of a time (At, RFC 3339) or a revision, or (v1.2 §2.3) with everything
// effective at or before EffectiveAt; the current one when none is given.
type BalanceRequest struct {
	AccountID   string `json:"account_id"`
	At          string `json:"at,omitempty"`
	Revision    *int64 `json:"revision,omitempty"`
	EffectiveAt string `json:"effective_at,omitempty"`
	MinPosition string `json:"min_position,omitempty"`
}

// Balance is the reply of the balance query: the account object as it stood
// after the event at AsOfRevision, which happened at AsOf; or, asked with
// effective_at, with everything effective by AsOfEffective (the instant asked
// to the microsecond, the one used; and then neither of the other two).
type Balance struct {
	Account
	AsOfRevision  *uint64 `json:"as_of_revision,omitempty"`
	AsOf          string  `json:"as_of,omitempty"` // RFC 3339, UTC
	AsOfEffective string  `json:"as_of_effective,omitempty"`
}

// TransferRequest is the body of ledger.v1.query.transfer.
type TransferRequest struct {
	TransferID  string `json:"transfer_id"`
	MinPosition string `json:"min_position,omitempty"`
}

// CommandRequest is the body of ledger.v1.query.command.
type CommandRequest struct {
	IdempotencyKey string `json:"idempotency_key"`
	MinPosition    string `json:"min_position,omitempty"`
}

// The answers of the queries are reply's (internal/app/reply/query.go),
// which the client's are too.
type (
	Account  = reply.AccountState
	Entry    = reply.Entry
	Entries  = reply.Entries
	Transfer = reply.TransferState
)

func invalid(field, format string, args ...any) *reply.QueryError {
	return reply.InvalidQuery(field, format, args...)
}

// invalidID is the refusal of an identifier (or an ID prefix) that is not 1-64
// characters of the ID alphabet (PROTOCOL.md §1).
func invalidID(field string) *reply.QueryError {
	return invalid(field, "must be 1-%d characters of [A-Za-z0-9._:-]", domain.MaxIDLen)
}

func internal(err error) *reply.QueryError {
	return &reply.QueryError{Status: domain.StatusError, Code: domain.CodeInternalError, Message: "read model unavailable, retry: " + err.Error()}
}

func notFound(format string, args ...any) *reply.QueryError {
	return &reply.QueryError{Code: domain.CodeNotFound, Message: fmt.Sprintf(format, args...)}
}

// Observe runs one answer of query and records it, by query and code, in the
// metrics: every transport (natsapi, httpapi) answers through it.
func (s *Service) Observe(query string, answer func() (any, *reply.QueryError)) (any, *reply.QueryError) {
	start := time.Now()
	out, qerr := answer()
	code := "ok"
	if qerr != nil {
		code = string(qerr.Code)
	}
	s.opts.Metrics.observe(query, code, time.Since(start))
	return out, qerr
}

// MaxWait is the longest a query waits for its min_position.
func (s *Service) MaxWait() time.Duration { return s.opts.MaxWait }

// Account answers the account query.
func (s *Service) Account(ctx context.Context, q AccountRequest) (*Account, *reply.QueryError) {
	if !domain.ValidID(q.AccountID) {
		return nil, invalidID("account_id")
	}
	pos, qerr := s.wait(ctx, projections.Accounts, q.MinPosition)
	if qerr != nil {
		return nil, qerr
	}
	var (
		a      Account
		id     *string
		rev    *int64
		curr   *string
		status *string
		bal    *int64
		held   *int64
		avail  *int64
	)
	// One statement: the row and the checkpoint come from one snapshot.
	pos, err := projections.Checkpoints.LiveWith(ctx, s.pool, projections.Accounts, projections.BesideCheckpoint{Cols: `a.account_id, a.currency, a.balance, a.held, a.available, a.revision, a.status`, Join: `LEFT JOIN readmodel.accounts a ON a.account_id = $1`, Args: []any{q.AccountID}, Dest: []any{&id, &curr, &bal, &held, &avail, &rev, &status}})
	if err != nil {
		return nil, internal(err)
	}
	if id == nil {
		e := notFound("account %s does not exist (the accounts read model is at %s)", q.AccountID, pos)
		e.ProjectedPosition = pos.String()
		return nil, e
	}
	a = Account{AccountView: domain.AccountView{AccountID: *id, Currency: *curr, Balance: *bal, Held: *held, Available: *avail, Revision: uint64(*rev)}, Status: *status, ProjectedPosition: pos.String()}
	return &a, nil
}

// Balance answers the balance query from the balance history (one lookup by
// (account, revision), or by (account, at) for a time: the last event at or
// before it in time). A time before the account's first event is
// account_not_found; a revision beyond its last one is invalid_request.
func (s *Service) Balance(ctx context.Context, q BalanceRequest) (*Balance, *reply.QueryError) {
	when, qerr := balanceTimeOf(q)
	if qerr != nil {
		return nil, qerr
	}
	if _, qerr := s.wait(ctx, projections.Balances, q.MinPosition); qerr != nil {
		return nil, qerr
	}
	if when.effective != nil {
		return s.effectiveBalance(ctx, q, *when.effective)
	}
	var r balanceRead
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		return r.read(ctx, tx, q, when.at)
	})
	if err != nil {
		return nil, internal(err)
	}
	pos := r.pos.String()
	switch {
	case r.last == nil:
		e := notFound("account %s has no history (the balances read model is at %s)", q.AccountID, pos)
		e.ProjectedPosition = pos
		return nil, e
	case !r.found && q.Revision != nil:
		return nil, invalid("revision", "account %s is at revision %d (the balances read model is at %s)", q.AccountID, *r.last, pos)
	case !r.found:
		e := &reply.QueryError{Status: domain.StatusRejected, Code: domain.CodeAccountNotFound, Message: fmt.Sprintf("account %s did not exist at %s", q.AccountID, echoTime(when.at, q.At)), ProjectedPosition: pos}
		return nil, e
	}
	out := r.out
	out.AccountID, out.Status, out.Available, out.ProjectedPosition = q.AccountID, r.status, out.Balance-out.Held, pos
	out.AsOf = replyTime(r.when)
	return &out, nil
}

// effectiveBalance answers the balance query asked with effective_at
// (projections.EffectiveBalances): account_not_found when the account has no
// event effective by then.
func (s *Service) effectiveBalance(ctx context.Context, q BalanceRequest, effective time.Time) (*Balance, *reply.QueryError) {
	var (
		last  *int64
		pos   eventstore.Position
		found *projections.EffectiveBalance
	)
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var err error
		pos, err = projections.Checkpoints.LiveWith(ctx, tx, projections.Balances, projections.BesideCheckpoint{Cols: `(SELECT max(revision) FROM readmodel.balance_history WHERE account_id = $1)`, Args: []any{q.AccountID}, Dest: []any{&last}})
		if err != nil || last == nil {
			return err
		}
		return projections.EffectiveBalances(ctx, tx, q.AccountID, effective, func(b projections.EffectiveBalance) error {
			found = &b
			return nil
		})
	})
	if err != nil {
		return nil, internal(err)
	}
	switch {
	case last == nil:
		e := notFound("account %s has no history (the balances read model is at %s)", q.AccountID, pos)
		e.ProjectedPosition = pos.String()
		return nil, e
	case found == nil:
		return nil, &reply.QueryError{Status: domain.StatusRejected, Code: domain.CodeAccountNotFound, Message: fmt.Sprintf("account %s had no event effective at or before %s", q.AccountID, echoTime(&effective, q.EffectiveAt)), ProjectedPosition: pos.String()}
	}
	status := domain.AccountStatusOpen
	if found.Closed {
		status = domain.AccountStatusClosed
	}
	view := domain.AccountView{AccountID: q.AccountID, Currency: found.Currency, Balance: found.Balance, Held: found.Held, Available: found.Balance - found.Held, Revision: uint64(found.Revision)}
	out := Balance{Account: Account{AccountView: view, Status: string(status), ProjectedPosition: pos.String()}, AsOfEffective: echoTime(&effective, q.EffectiveAt)}
	return &out, nil
}

// balanceTime is the instant a balance query asks about: at, a time (nil: a
// revision, or the current balance), or effective, an effective instant.
type balanceTime struct {
	at, effective *time.Time
}

// balanceTimeOf checks a balance query and returns the instant it asks about.
func balanceTimeOf(q BalanceRequest) (w balanceTime, qerr *reply.QueryError) {
	if !domain.ValidID(q.AccountID) {
		return balanceTime{}, invalidID("account_id")
	}
	if w.at, qerr = timeBound("at", q.At); qerr != nil {
		return balanceTime{}, qerr
	}
	if w.effective, qerr = timeBound("effective_at", q.EffectiveAt); qerr != nil {
		return balanceTime{}, qerr
	}
	if q.Revision != nil && *q.Revision < 0 {
		return balanceTime{}, invalid("revision", "must be 0 or more")
	}
	switch {
	case w.at != nil && q.Revision != nil:
		return balanceTime{}, invalid("revision", "give at or revision, not both")
	case w.effective != nil && (w.at != nil || q.Revision != nil):
		return balanceTime{}, invalid("effective_at", "give effective_at alone: not with at or revision")
	}
	return w, nil
}

// balanceRead is what the balance query reads in one snapshot: the balances
// read model's checkpoint, the account's last revision, and its row as of the
// revision or time asked (found).
type balanceRead struct {
	out    Balance
	last   *int64 // the account's last revision, nil: no such account
	pos    eventstore.Position
	found  bool
	status string
	when   time.Time
}

// read reads the checkpoint and the account's last revision, then the row of
// the balance history the query names: by revision, the last at or before a
// time, or the last.
func (r *balanceRead) read(ctx context.Context, tx pgx.Tx, q BalanceRequest, at *time.Time) error {
	const cols = `revision, currency, balance, held, status, at`
	var err error
	r.pos, err = projections.Checkpoints.LiveWith(ctx, tx, projections.Balances, projections.BesideCheckpoint{Cols: `(SELECT max(revision) FROM readmodel.balance_history WHERE account_id = $1)`, Args: []any{q.AccountID}, Dest: []any{&r.last}})
	if err != nil {
		return err
	}
	if r.last == nil {
		return nil
	}
	var row pgx.Row
	switch {
	case q.Revision != nil:
		row = tx.QueryRow(ctx, `SELECT `+cols+` FROM readmodel.balance_history WHERE account_id = $1 AND revision = $2`, q.AccountID, *q.Revision)
	case at != nil:
		row = tx.QueryRow(ctx, `SELECT `+cols+` `+historyAsOf("$1", "$2"), q.AccountID, *at)
	default:
		row = tx.QueryRow(ctx, `SELECT `+cols+` FROM readmodel.balance_history WHERE account_id = $1 AND revision = $2`, q.AccountID, *r.last)
	}
	var rev int64
	err = row.Scan(&rev, &r.out.Currency, &r.out.Balance, &r.out.Held, &r.status, &r.when)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	asOf := uint64(rev)
	r.found, r.out.Revision, r.out.AsOfRevision = err == nil, uint64(rev), &asOf
	return err
}

// Entries answers the entries query.
func (s *Service) Entries(ctx context.Context, q EntriesRequest) (*Entries, *reply.QueryError) {
	page, qerr := entriesPageOf(q)
	if qerr != nil {
		return nil, qerr
	}
	if _, qerr := s.wait(ctx, projections.Entries, q.MinPosition); qerr != nil {
		return nil, qerr
	}
	out := &Entries{Entries: []Entry{}}
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		return readEntries(ctx, tx, q.AccountID, page, out)
	})
	if errors.Is(err, errNotFound) {
		e := notFound("account %s has no statement (the entries read model is at %s)", q.AccountID, out.ProjectedPosition)
		e.ProjectedPosition = out.ProjectedPosition
		return nil, e
	}
	if err != nil {
		return nil, internal(err)
	}
	return out, nil
}

// entriesPage is the page an entries query asks for: the entries after a
// revision, at most limit of them, optionally within [from, to).
type entriesPage struct {
	after    int64
	limit    int
	from, to *time.Time
	// byEffective: from and to bound effective_at, not at (v1.2 §2.3).
	byEffective bool
}

// entriesPageOf checks an entries query and returns its page, with the
// defaults for what it leaves out.
func entriesPageOf(q EntriesRequest) (entriesPage, *reply.QueryError) {
	if !domain.ValidID(q.AccountID) {
		return entriesPage{}, invalidID("account_id")
	}
	page := entriesPage{after: -1, limit: DefaultEntriesLimit}
	if q.AfterRevision != nil {
		if *q.AfterRevision < -1 {
			return entriesPage{}, invalid("after_revision", "must be -1 or more")
		}
		page.after = *q.AfterRevision
	}
	if q.Limit != nil {
		if *q.Limit < 1 || *q.Limit > MaxEntriesLimit {
			return entriesPage{}, invalid("limit", "must be 1-%d", MaxEntriesLimit)
		}
		page.limit = *q.Limit
	}
	var qerr *reply.QueryError
	if page.from, qerr = parseTime("from", q.From); qerr != nil {
		return entriesPage{}, qerr
	}
	if page.to, qerr = parseTime("to", q.To); qerr != nil {
		return entriesPage{}, qerr
	}
	// The order is checked on the times as sent: a range within one
	// microsecond is valid, and empty once truncated.
	if page.from != nil && page.to != nil && !page.from.Before(*page.to) {
		return entriesPage{}, invalid("to", "must be after from")
	}
	page.from, page.to = instant(page.from), instant(page.to)
	switch q.By {
	case "", ByRecord:
	case ByEffective:
		page.byEffective = true
	default:
		return entriesPage{}, invalid("by", "must be %q (from and to bound at, the default) or %q (they bound effective_at)", ByRecord, ByEffective)
	}
	return page, nil
}

// readEntries reads one page of an account's entries, and the entries read
// model's checkpoint, into out; errNotFound means the account has neither
// entries nor a row in the accounts read model.
func readEntries(ctx context.Context, tx pgx.Tx, accountID string, page entriesPage, out *Entries) error {
	var exists bool
	pos, err := projections.Checkpoints.LiveWith(ctx, tx, projections.Entries, projections.BesideCheckpoint{Cols: `EXISTS (SELECT 1 FROM readmodel.entries WHERE account_id = $1) OR EXISTS (SELECT 1 FROM readmodel.accounts WHERE account_id = $1)`, Args: []any{accountID}, Dest: []any{&exists}})
	if err != nil {
		return err
	}
	out.ProjectedPosition = pos.String()
	if !exists {
		return errNotFound
	}
	// One row more than the page tells whether there is a next page. The
	// page is in record order (revision) whichever time bounds it.
	bound := "at"
	if page.byEffective {
		bound = "effective_at"
	}
	rows, err := tx.Query(ctx, fmt.Sprintf(`SELECT event_id::text, revision, type, amount, balance_after, idempotency_key, at, effective_at, reason, ref, metadata
		FROM readmodel.entries WHERE account_id = $1 AND revision > $2
			AND ($4::timestamptz IS NULL OR %[1]s >= $4) AND ($5::timestamptz IS NULL OR %[1]s < $5)
		ORDER BY revision LIMIT $3`, bound), accountID, page.after, page.limit+1, page.from, page.to)
	if err != nil {
		return err
	}
	var e Entry
	var at, effective time.Time
	var reason, ref string
	_, err = pgx.ForEachRow(rows, []any{&e.EventID, &e.Revision, &e.Type, &e.Amount, &e.BalanceAfter, &e.IdempotencyKey, &at, &effective, &reason, &ref, &e.Metadata}, func() error {
		e.At, e.EffectiveAt = replyTime(at), replyTime(effective)
		e.TransferID, e.TransactionID = "", ""
		switch {
		case domain.TransferReason(reason):
			e.TransferID = ref
		case reason == domain.ReasonTransactionOut || reason == domain.ReasonTransactionIn:
			e.TransactionID = ref
		}
		out.Entries = append(out.Entries, e)
		e.Metadata = nil // the next row's decodes into a map of its own
		return nil
	})
	if n := len(out.Entries); err == nil && n > page.limit {
		out.Entries = out.Entries[:page.limit]
		next := out.Entries[page.limit-1].Revision
		out.NextAfterRevision = &next
	}
	return err
}

var errNotFound = errors.New("not found")

// timeBound parses an optional RFC 3339 time of a query, to the microsecond
// (domain.Instant): the instant the query reads by and echoes.
func timeBound(field, v string) (*time.Time, *reply.QueryError) {
	t, qerr := parseTime(field, v)
	return instant(t), qerr
}

// echoTime is the instant a query used, as its reply names it (sent, the
// text as sent when none was parsed).
func echoTime(used *time.Time, sent string) string {
	if used == nil {
		return sent
	}
	return replyTime(*used)
}

// replyTime is an instant as every reply names it: RFC 3339 in UTC, its
// fraction as kept (to the microsecond in the read models), trailing zeros
// dropped.
func replyTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// parseTime parses an optional RFC 3339 time of a query as sent.
func parseTime(field, v string) (*time.Time, *reply.QueryError) {
	if v == "" {
		return nil, nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return nil, invalid(field, "%q is not an RFC 3339 time", v)
	}
	return &t, nil
}

// instant is t to the microsecond (domain.Instant), nil kept: the read
// models keep microseconds, so the instant asked is the one used and echoed.
func instant(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	i := domain.Instant(*t)
	return &i
}

// Transfer answers the transfer query.
func (s *Service) Transfer(ctx context.Context, q TransferRequest) (*Transfer, *reply.QueryError) {
	if !domain.ValidID(q.TransferID) {
		return nil, invalidID("transfer_id")
	}
	if _, qerr := s.wait(ctx, projections.Transfers, q.MinPosition); qerr != nil {
		return nil, qerr
	}
	var (
		id, from, to, curr, status *string
		amount                     *int64
	)
	at, err := projections.Checkpoints.LiveWith(ctx, s.pool, projections.Transfers, projections.BesideCheckpoint{Cols: `t.transfer_id, t.from_account, t.to_account, t.amount, t.currency, t.status`, Join: `LEFT JOIN readmodel.transfers t ON t.transfer_id = $1`, Args: []any{q.TransferID}, Dest: []any{&id, &from, &to, &amount, &curr, &status}})
	if err != nil {
		return nil, internal(err)
	}
	pos := at.String()
	if id == nil {
		e := notFound("transfer %s does not exist (the transfers read model is at %s)", q.TransferID, pos)
		e.ProjectedPosition = pos
		return nil, e
	}
	return &Transfer{TransferID: *id, From: *from, To: *to, Amount: *amount, Currency: *curr, Status: *status, ProjectedPosition: pos}, nil
}

// Command answers the command query: the original reply of the command, exactly
// as the ledger encoded it (duplicate false).
func (s *Service) Command(ctx context.Context, q CommandRequest) (json.RawMessage, *reply.QueryError) {
	if !domain.ValidKey(q.IdempotencyKey) {
		e := invalid("idempotency_key", "must be 1-%d printable ASCII characters", domain.MaxKeyLen)
		return nil, e
	}
	if _, qerr := s.wait(ctx, projections.Commands, q.MinPosition); qerr != nil {
		qerr.IdempotencyKey = q.IdempotencyKey
		return nil, qerr
	}
	var original, command *string
	at, err := projections.Checkpoints.LiveWith(ctx, s.pool, projections.Commands, projections.BesideCheckpoint{Cols: `k.reply::text, k.command`, Join: `LEFT JOIN readmodel.commands k ON k.idempotency_key = $1`, Args: []any{q.IdempotencyKey}, Dest: []any{&original, &command}})
	if err != nil {
		return nil, internal(err)
	}
	if original == nil {
		pos := at.String()
		return nil, &reply.QueryError{Code: domain.CodeNotFound, IdempotencyKey: q.IdempotencyKey, ProjectedPosition: pos,
			Message: fmt.Sprintf("no command was decided with this idempotency key (the commands read model is at %s)", pos)}
	}
	if *command == string(domain.CmdBatch) {
		return s.batchCommand(ctx, []byte(*original))
	}
	return json.RawMessage(*original), nil
}

// batchCommand answers an atomic batch's key: its row's reply, an applied
// batch's element stubs filled with the elements' own rows (reply.FillBatch).
func (s *Service) batchCommand(ctx context.Context, row []byte) (json.RawMessage, *reply.QueryError) {
	var batch reply.Reply
	if err := json.Unmarshal(row, &batch); err != nil {
		return nil, internal(err)
	}
	if batch.Status != domain.StatusApplied {
		return row, nil
	}
	keys := make([]string, len(batch.Replies))
	for i, stub := range batch.Replies {
		keys[i] = stub.IdempotencyKey
	}
	elems := map[string]reply.Reply{}
	rows, err := s.pool.Query(ctx, `SELECT idempotency_key, reply::text FROM readmodel.commands WHERE idempotency_key = ANY($1)`, keys)
	if err != nil {
		return nil, internal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var key, raw string
		var r reply.Reply
		if err := rows.Scan(&key, &raw); err != nil {
			return nil, internal(err)
		}
		if err := json.Unmarshal([]byte(raw), &r); err != nil {
			return nil, internal(err)
		}
		elems[key] = r
	}
	if err := rows.Err(); err != nil {
		return nil, internal(err)
	}
	filled, err := reply.FillBatch(batch, false, func(key string) (*reply.Reply, error) {
		if r, ok := elems[key]; ok {
			return &r, nil
		}
		return nil, nil
	})
	if err != nil {
		return nil, internal(err)
	}
	out, err := json.Marshal(filled)
	if err != nil {
		return nil, internal(err)
	}
	return out, nil
}

// wait returns once the projection's live checkpoint is at or after min (a
// position as a command reply gives it, "commit/prepare"); at once when min is "".
func (s *Service) wait(ctx context.Context, projection, min string) (eventstore.Position, *reply.QueryError) {
	if min == "" {
		return eventstore.Position{}, nil
	}
	want, err := eventstore.ParsePosition(min)
	if err != nil {
		return eventstore.Position{}, invalid("min_position", "%v", err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.opts.MaxWait)
	defer cancel()
	var got eventstore.Position
	for {
		at, err := projections.Checkpoints.LiveOf(ctx, s.pool, projection)
		if err == nil {
			got = at
			if got.Compare(want) >= 0 {
				return got, nil
			}
		}
		t := time.NewTimer(s.opts.PollInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			if err != nil && !errors.Is(err, context.DeadlineExceeded) {
				return got, internal(err)
			}
			return got, &reply.QueryError{Status: domain.StatusError, Code: CodeProjectionBehind, ProjectedPosition: got.String(),
				Message: fmt.Sprintf("the %s read model has not reached %s within %s (it is at %s); retry", projection, want, s.opts.MaxWait, got)}
		case <-t.C:
		}
	}
}
