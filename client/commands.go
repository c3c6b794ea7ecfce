package client

import (
	"bytes"
	"encoding/json"
	"time"
)

// Command is one of the command structs of this package (OpenAccount, Deposit,
// ..., PostTransaction) or a Raw body: what Batch takes.
type Command interface {
	// commandType is the protocol's type: the last token of the subject.
	commandType() string
	// key is the command's idempotency key.
	key() string
	// body is the command's JSON body (without its type).
	body() ([]byte, error)
}

// The fields of section 2.3 (v1.2: EffectiveAt, ExpectedRevision, UpTo) are
// part of the request (the same key with another value is
// idempotency_key_conflict naming the field); left nil or false they are not
// sent.
//
// EffectiveAt is when the money moved in the world (a settlement booked late,
// a history imported): the ledger decides in the order it records commands
// and reports (statements, balances as of an effective time) by this time. It
// may be at most 5 seconds after the ledger's own time, and never before the
// effective opening of an account the command touches; otherwise the reply is
// invalid, invalid_request, Fields naming effective_at, and nothing is
// recorded.
//
// ExpectedRevision (Deposit, Withdraw, PlaceHold, CaptureHold, ReleaseHold,
// CloseAccount): the command applies only if the account's Revision is that
// number; otherwise it is rejected with CodeRevisionMismatch, and the refusal
// is recorded (it moves the revision on, and a resend answers it).
//
// UpTo (Withdraw, Transfer): Amount is a maximum; the ledger moves as much of
// it as the source's Available allows without its overdraft and says how much
// in Reply.Moved (nothing available: CodeInsufficientFunds).

// OpenAccount is ledger.v1.cmd.open_account.
type OpenAccount struct {
	Key            string            `json:"idempotency_key"`
	AccountID      string            `json:"account_id"`
	Currency       string            `json:"currency"`
	OverdraftLimit int64             `json:"overdraft_limit,omitempty"` // minor units; 0: none
	Metadata       map[string]string `json:"metadata,omitempty"`
	EffectiveAt    *time.Time        `json:"effective_at,omitempty"`
}

// Deposit is ledger.v1.cmd.deposit: credits the account from outside the ledger.
type Deposit struct {
	Key       string            `json:"idempotency_key"`
	AccountID string            `json:"account_id"`
	Amount    int64             `json:"amount"` // minor units
	Currency  string            `json:"currency"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	// EffectiveAt and ExpectedRevision (§2.3): see above.
	EffectiveAt      *time.Time `json:"effective_at,omitempty"`
	ExpectedRevision *int64     `json:"expected_revision,omitempty"`
}

// Withdraw is ledger.v1.cmd.withdraw: debits the account to outside the ledger.
type Withdraw struct {
	Key       string            `json:"idempotency_key"`
	AccountID string            `json:"account_id"`
	Amount    int64             `json:"amount"`
	Currency  string            `json:"currency"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	// EffectiveAt, ExpectedRevision and UpTo (§2.3): see above.
	EffectiveAt      *time.Time `json:"effective_at,omitempty"`
	ExpectedRevision *int64     `json:"expected_revision,omitempty"`
	UpTo             bool       `json:"up_to,omitempty"`
}

// Transfer is ledger.v1.cmd.transfer: moves money between two accounts.
type Transfer struct {
	Key        string            `json:"idempotency_key"`
	TransferID string            `json:"transfer_id"`
	From       string            `json:"from"`
	To         string            `json:"to"`
	Amount     int64             `json:"amount"`
	Currency   string            `json:"currency"`
	Metadata   map[string]string `json:"metadata,omitempty"`
	// EffectiveAt and UpTo (§2.3): see above.
	EffectiveAt *time.Time `json:"effective_at,omitempty"`
	UpTo        bool       `json:"up_to,omitempty"`
}

// PlaceHold is ledger.v1.cmd.place_hold: reserves funds.
type PlaceHold struct {
	Key       string            `json:"idempotency_key"`
	AccountID string            `json:"account_id"`
	HoldID    string            `json:"hold_id"`
	Amount    int64             `json:"amount"`
	Currency  string            `json:"currency"`
	ExpiresAt *time.Time        `json:"expires_at,omitempty"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	// EffectiveAt and ExpectedRevision (§2.3): see above.
	EffectiveAt      *time.Time `json:"effective_at,omitempty"`
	ExpectedRevision *int64     `json:"expected_revision,omitempty"`
}

// CaptureHold is ledger.v1.cmd.capture_hold: debits held funds (Amount 0: all
// that is held), crediting To when it is set.
type CaptureHold struct {
	Key       string            `json:"idempotency_key"`
	AccountID string            `json:"account_id"`
	HoldID    string            `json:"hold_id"`
	Amount    int64             `json:"amount,omitempty"`
	To        string            `json:"to,omitempty"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	// EffectiveAt and ExpectedRevision (§2.3): see above.
	EffectiveAt      *time.Time `json:"effective_at,omitempty"`
	ExpectedRevision *int64     `json:"expected_revision,omitempty"`
}

// ReleaseHold is ledger.v1.cmd.release_hold.
type ReleaseHold struct {
	Key       string `json:"idempotency_key"`
	AccountID string `json:"account_id"`
	HoldID    string `json:"hold_id"`
	// ExpectedRevision (§2.3): see above.
	ExpectedRevision *int64 `json:"expected_revision,omitempty"`
}

// Refund is ledger.v1.cmd.refund: reverses a deposit, withdrawal, transfer or
// transaction (Amount 0: all that is still refundable).
type Refund struct {
	Key         string            `json:"idempotency_key"`
	OriginalKey string            `json:"original_key"`
	Amount      int64             `json:"amount,omitempty"`
	Metadata    map[string]string `json:"metadata,omitempty"`
	EffectiveAt *time.Time        `json:"effective_at,omitempty"`
}

// CloseAccount is ledger.v1.cmd.close_account.
type CloseAccount struct {
	Key       string `json:"idempotency_key"`
	AccountID string `json:"account_id"`
	// ExpectedRevision (§2.3): see above.
	ExpectedRevision *int64 `json:"expected_revision,omitempty"`
}

// PostTransaction is ledger.v1.cmd.post_transaction: every posting at once, or none.
type PostTransaction struct {
	Key           string            `json:"idempotency_key"`
	TransactionID string            `json:"transaction_id"`
	Postings      []Posting         `json:"postings"`
	Metadata      map[string]string `json:"metadata,omitempty"`
	EffectiveAt   *time.Time        `json:"effective_at,omitempty"`
}

// Posting is one leg of a PostTransaction.
type Posting struct {
	From     string `json:"from"`
	To       string `json:"to"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

// Raw is a command body sent as it is, for tools that forward bodies they did
// not build (`ledger post --json`, `ledger post --file`): the ledger judges it.
// Its key is read from the body's idempotency_key. A Raw whose body is not a
// JSON object is sent alone, never in a batch (the ledger answers it invalid).
type Raw struct {
	Type string
	Body json.RawMessage
}

func (c OpenAccount) commandType() string     { return "open_account" }
func (c Deposit) commandType() string         { return "deposit" }
func (c Withdraw) commandType() string        { return "withdraw" }
func (c Transfer) commandType() string        { return "transfer" }
func (c PlaceHold) commandType() string       { return "place_hold" }
func (c CaptureHold) commandType() string     { return "capture_hold" }
func (c ReleaseHold) commandType() string     { return "release_hold" }
func (c Refund) commandType() string          { return "refund" }
func (c CloseAccount) commandType() string    { return "close_account" }
func (c PostTransaction) commandType() string { return "post_transaction" }
func (c Raw) commandType() string             { return c.Type }

func (c OpenAccount) key() string     { return c.Key }
func (c Deposit) key() string         { return c.Key }
func (c Withdraw) key() string        { return c.Key }
func (c Transfer) key() string        { return c.Key }
func (c PlaceHold) key() string       { return c.Key }
func (c CaptureHold) key() string     { return c.Key }
func (c ReleaseHold) key() string     { return c.Key }
func (c Refund) key() string          { return c.Key }
func (c CloseAccount) key() string    { return c.Key }
func (c PostTransaction) key() string { return c.Key }
func (c Raw) key() string {
	var k struct {
		Key string `json:"idempotency_key"`
	}
	_ = json.Unmarshal(c.Body, &k)
	return k.Key
}

func (c OpenAccount) body() ([]byte, error)     { return json.Marshal(c) }
func (c Deposit) body() ([]byte, error)         { return json.Marshal(c) }
func (c Withdraw) body() ([]byte, error)        { return json.Marshal(c) }
func (c Transfer) body() ([]byte, error)        { return json.Marshal(c) }
func (c PlaceHold) body() ([]byte, error)       { return json.Marshal(c) }
func (c CaptureHold) body() ([]byte, error)     { return json.Marshal(c) }
func (c ReleaseHold) body() ([]byte, error)     { return json.Marshal(c) }
func (c Refund) body() ([]byte, error)          { return json.Marshal(c) }
func (c CloseAccount) body() ([]byte, error)    { return json.Marshal(c) }
func (c PostTransaction) body() ([]byte, error) { return json.Marshal(c) }
func (c Raw) body() ([]byte, error)             { return c.Body, nil }

// postings is how many postings a command carries (a batch's limit counts them).
func postings(c Command) int {
	switch c := c.(type) {
	case PostTransaction:
		return len(c.Postings)
	case Raw:
		var p struct {
			Postings []json.RawMessage `json:"postings"`
		}
		_ = json.Unmarshal(c.Body, &p)
		return len(p.Postings)
	}
	return 0
}

// element is a command as a batch carries it: its body compacted, with its
// "type" first. ok is false when the body is not a JSON object (a Raw the
// ledger must judge alone).
func element(typ string, body []byte) ([]byte, bool) {
	if len(body) < 2 || body[0] != '{' {
		return nil, false
	}
	t, _ := json.Marshal(typ)
	out := bytes.NewBuffer(make([]byte, 0, len(body)+len(t)+10))
	out.WriteString(`{"type":`)
	out.Write(t)
	at := out.Len()
	if json.Compact(out, body) != nil { // validates it too
		return nil, false
	}
	b := out.Bytes()
	if b[at+1] == '}' { // an empty object
		return append(b[:at], '}'), true
	}
	b[at] = ',' // the body's '{'
	return b, true
}

// batchBody is the body of a ledger.v1.cmd.batch that is not atomic: elems
// (each from element) under "commands".
func batchBody(n int, elem func(i int) []byte) []byte {
	size := batchOverhead
	for i := range n {
		size += len(elem(i)) + 1
	}
	body := make([]byte, 0, size)
	body = append(body, `{"commands":[`...)
	for i := range n {
		if i > 0 {
			body = append(body, ',')
		}
		body = append(body, elem(i)...)
	}
	return append(body, "]}"...)
}
