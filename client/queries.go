package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/ledgerworks/ledger/internal/app/reply"
)

// Queries asks the ledger's read side (PROTOCOL.md §4). Every query is
// read-only, so one whose reply is lost, or answered with an infrastructure
// error, is asked again until ctx ends.
type Queries struct{ c *Client }

// Queries returns the client's queries.
func (c *Client) Queries() Queries { return Queries{c: c} }

// QueryError is a query's definite answer that is not a result: not_found,
// invalid_request, projection_behind (the read model had not reached
// MinPosition in time).
type QueryError struct {
	Status            Status   `json:"status,omitempty"`
	Code              Code     `json:"code"`
	Message           string   `json:"message"`
	Key               string   `json:"idempotency_key,omitempty"`
	Fields            []string `json:"fields,omitempty"`
	ProjectedPosition string   `json:"projected_position,omitempty"`
}

func (e *QueryError) Error() string { return "ledger: " + string(e.Code) + ": " + e.Message }

// ErrNotFound matches (errors.Is) a QueryError of code not_found.
var ErrNotFound = errors.New("ledger: not found")

// Is makes errors.Is(err, ErrNotFound) hold for code not_found.
func (e *QueryError) Is(target error) bool { return target == ErrNotFound && e.Code == CodeNotFound }

// AccountQuery is the body of ledger.v1.query.account.
type AccountQuery struct {
	AccountID string `json:"account_id"`
	// MinPosition (a Reply's Position) makes the read model wait, bounded, until
	// it reflects that write.
	MinPosition string `json:"min_position,omitempty"`
}

// The answers of the read models' queries are the server's own
// (internal/app/reply), so that the two cannot drift: the client imports the
// server's definitions, never the reverse.
type (
	// AccountState is the account as the read model has it.
	AccountState = reply.AccountState
	// Entries is a page of an account's statement, oldest first; Entry is one
	// line of it.
	Entries = reply.Entries
	Entry   = reply.Entry
	// Balances is the sum over the accounts whose ID starts with a prefix, one
	// CurrencyBalance per currency, sorted by currency; none when no account
	// matches.
	Balances        = reply.Balances
	CurrencyBalance = reply.CurrencyBalance
	// TransferState is a transfer as the read model has it.
	TransferState = reply.TransferState
)

// EntriesQuery is the body of ledger.v1.query.entries.
type EntriesQuery struct {
	AccountID     string `json:"account_id"`
	AfterRevision *int64 `json:"after_revision,omitempty"`
	Limit         int    `json:"limit,omitempty"` // 0: the ledger's default (100)
	// From and To keep the entries with From <= at < To, or From <=
	// effective_at < To when By is "effective" (§2.3); the page stays in
	// record order.
	From        *time.Time `json:"from,omitempty"`
	To          *time.Time `json:"to,omitempty"`
	By          string     `json:"by,omitempty"`
	MinPosition string     `json:"min_position,omitempty"`
}

// BalanceQuery is the body of ledger.v1.query.balance: the account as of At,
// or at Revision, or with everything effective at or before EffectiveAt (§2.3,
// backdated postings recorded later included; alone); the current one when
// none is set.
type BalanceQuery struct {
	AccountID   string     `json:"account_id"`
	At          *time.Time `json:"at,omitempty"`
	Revision    *int64     `json:"revision,omitempty"`
	EffectiveAt *time.Time `json:"effective_at,omitempty"`
	MinPosition string     `json:"min_position,omitempty"`
}

// Balance is the account as it stood after its event at AsOfRevision (which
// happened at AsOf), or, asked with EffectiveAt, with everything effective by
// AsOfEffective (AsOfRevision 0 and AsOf "" then).
type Balance struct {
	AccountState
	AsOfRevision  uint64 `json:"as_of_revision"`
	AsOf          string `json:"as_of"`
	AsOfEffective string `json:"as_of_effective,omitempty"`
}

// BalancesQuery is the body of ledger.v1.query.balances (v1.2): the sums over
// every account (open or closed) whose ID starts with Prefix (literally: '_'
// and '.' are no wildcards), of Currency or of all, now, as of At, or with
// everything effective by EffectiveAt.
type BalancesQuery struct {
	Prefix   string     `json:"prefix"`
	Currency string     `json:"currency,omitempty"`
	At       *time.Time `json:"at,omitempty"`
	// EffectiveAt (§2.3): the sums with everything effective at or before it
	// (not with At).
	EffectiveAt *time.Time `json:"effective_at,omitempty"`
	MinPosition string     `json:"min_position,omitempty"`
}

// TransferQuery is the body of ledger.v1.query.transfer.
type TransferQuery struct {
	TransferID  string `json:"transfer_id"`
	MinPosition string `json:"min_position,omitempty"`
}

// TransactionDetail is a transaction as its stream records it.
type TransactionDetail struct {
	TransactionID string            `json:"transaction_id"`
	Status        string            `json:"status"` // posted or rejected
	Postings      []Posting         `json:"postings"`
	Metadata      map[string]string `json:"metadata"`
	Key           string            `json:"idempotency_key"`
	Code          Code              `json:"code,omitempty"`
	Message       string            `json:"message,omitempty"`
	Posting       *int              `json:"posting,omitempty"`
	Accounts      []Account         `json:"accounts"`
	Position      string            `json:"position"`
}

// Account asks ledger.v1.query.account.
func (q Queries) Account(ctx context.Context, req AccountQuery) (AccountState, error) {
	var out AccountState
	return out, q.ask(ctx, "account", req, &out)
}

// Balance asks ledger.v1.query.balance.
func (q Queries) Balance(ctx context.Context, req BalanceQuery) (Balance, error) {
	var out Balance
	return out, q.ask(ctx, "balance", req, &out)
}

// Balances asks ledger.v1.query.balances (v1.2).
func (q Queries) Balances(ctx context.Context, req BalancesQuery) (Balances, error) {
	var out Balances
	return out, q.ask(ctx, "balances", req, &out)
}

// Entries asks ledger.v1.query.entries.
func (q Queries) Entries(ctx context.Context, req EntriesQuery) (Entries, error) {
	var out Entries
	return out, q.ask(ctx, "entries", req, &out)
}

// Transfer asks ledger.v1.query.transfer.
func (q Queries) Transfer(ctx context.Context, req TransferQuery) (TransferState, error) {
	var out TransferState
	return out, q.ask(ctx, "transfer", req, &out)
}

// Transaction asks ledger.v1.query.transaction.
func (q Queries) Transaction(ctx context.Context, transactionID string) (TransactionDetail, error) {
	var out TransactionDetail
	return out, q.ask(ctx, "transaction", struct {
		TransactionID string `json:"transaction_id"`
	}{transactionID}, &out)
}

// Command asks ledger.v1.query.command: the original reply of the command
// decided under key (Duplicate false), or a QueryError matching ErrNotFound
// when none was.
func (q Queries) Command(ctx context.Context, key string) (Reply, error) {
	var out Reply
	return out, q.ask(ctx, "command", struct {
		Key string `json:"idempotency_key"`
	}{key}, &out)
}

// ask sends a query until it gets a definite answer: the result, decoded into
// out, or a *QueryError.
func (q Queries) ask(ctx context.Context, name string, req, out any) error {
	body, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("client: encode query %s: %w", name, err)
	}
	r := resender{c: q.c, key: "query " + name}
	for {
		o := q.c.request(ctx, QuerySubjectPrefix+name, body)
		if o.raw != nil {
			qe, isErr := queryError(o.raw)
			switch {
			case !isErr:
				if err := json.Unmarshal(o.raw, out); err != nil {
					return fmt.Errorf("client: undecodable %s reply %.200q: %w", name, o.raw, err)
				}
				return nil
			case qe.Status != StatusError && qe.Code != CodeInternalError:
				return qe
			default:
				o = outcome{err: qe, wait: true}
			}
		}
		if err := r.next(ctx, o); err != nil {
			return err
		}
	}
}

// queryError reads raw as a query's error reply when it is one: it has a
// code, and none of what marks the results that have one too (a command's
// reply has events, a refused transaction's detail its transaction_id).
func queryError(raw []byte) (*QueryError, bool) {
	var probe struct {
		Code          Code            `json:"code"`
		Events        json.RawMessage `json:"events"`
		TransactionID json.RawMessage `json:"transaction_id"`
	}
	if json.Unmarshal(raw, &probe) != nil || probe.Code == "" || probe.Events != nil || probe.TransactionID != nil {
		return nil, false
	}
	var qe QueryError
	if json.Unmarshal(raw, &qe) != nil {
		return nil, false
	}
	return &qe, true
}
