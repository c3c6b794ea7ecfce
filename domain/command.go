package domain

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// CommandType names a command; client commands are the subjects' last token.
type CommandType string

// Client commands (PROTOCOL.md §2).
const (
	CmdOpenAccount  CommandType = "open_account"
	CmdDeposit      CommandType = "deposit"
	CmdWithdraw     CommandType = "withdraw"
	CmdTransfer     CommandType = "transfer"
	CmdPlaceHold    CommandType = "place_hold"
	CmdCaptureHold  CommandType = "capture_hold"
	CmdReleaseHold  CommandType = "release_hold"
	CmdRefund       CommandType = "refund"
	CmdCloseAccount CommandType = "close_account"
	// CmdPostTransaction moves money along 1-64 postings at once, or not at all (v1.1).
	CmdPostTransaction CommandType = "post_transaction"
)

// Internal commands: saga steps and schedulers. They never arrive from a client;
// their keys are derived (StepKey) from the key of the command that caused them.
const (
	CmdTransferDebit      CommandType = "transfer_debit"
	CmdTransferCredit     CommandType = "transfer_credit"
	CmdTransferCompensate CommandType = "transfer_compensate"
	CmdExpireHold         CommandType = "expire_hold"
	// CmdTransactionLeg is a transaction's movement in one of its accounts: written
	// with the transaction, atomically, under LegKey(key, account).
	CmdTransactionLeg CommandType = "transaction_leg"
	// CmdCaptureCredit credits a capture's amount to its `to` account, written with
	// the capture, atomically, under StepKey(key, StepCaptureTo).
	CmdCaptureCredit CommandType = "capture_credit"
)

// ClientCommandTypes lists the commands a client may send, in protocol order.
var ClientCommandTypes = []CommandType{
	CmdOpenAccount, CmdDeposit, CmdWithdraw, CmdTransfer, CmdPlaceHold,
	CmdCaptureHold, CmdReleaseHold, CmdRefund, CmdCloseAccount, CmdPostTransaction,
}

// IsClient reports whether t is a command a client may send.
func (t CommandType) IsClient() bool {
	for _, c := range ClientCommandTypes {
		if c == t {
			return true
		}
	}
	return false
}

// Command is one decoded, validated command. Optional fields carry a Has flag so
// that "absent" and "zero" never blur.
type Command struct {
	Type           CommandType
	IdempotencyKey string

	AccountID      string
	Currency       string
	Amount         int64
	HasAmount      bool
	OverdraftLimit int64
	Metadata       map[string]string
	TransferID     string
	From, To       string
	HoldID         string
	ExpiresAt      time.Time // zero: no expiry
	OriginalKey    string
	TransactionID  string
	Postings       []Posting
	// ExpectedRevision (v1.2 §2.3), when HasExpectedRevision: the command
	// applies only if the account's revision is this one.
	ExpectedRevision    int64
	HasExpectedRevision bool
	// UpTo (v1.2 §2.3): Amount is a maximum; the command moves as much of it
	// as the source's available balance allows without its overdraft.
	UpTo bool
	// EffectiveAt is when the money moved in the world (v1.2 §2.3), in UTC and
	// to the microsecond: the instant the ledger decides by, records and its
	// read models answer by (PostgreSQL's timestamptz), a finer fraction
	// truncated at intake (setTime); zero: none given, the record time At.
	// Part of the request.
	EffectiveAt time.Time
	// effectiveGiven is effective_at as the request gave it when it was finer
	// than the microsecond (zero otherwise): the request keeps it
	// (requestEffective), so that its hash is what it was before the
	// truncation and an exact resend stays a duplicate, whichever build
	// recorded the key.
	effectiveGiven time.Time

	// At is the time the ledger accepted the command. It is not part of the
	// request: a retry carries a later At and is still the same intent.
	At time.Time
	// Origin is, for an internal step, the client key that caused it.
	Origin string
	// Ref names what a step belongs to (a transfer or refund), for the statement.
	Ref string
	// Reason labels a money movement made by an internal step (for example
	// "transfer_out", "refund_in"); empty for client commands.
	Reason string
	// Claimed: an internal step written with a claim of its own key
	// (Metadata.Claimed), where the store recalls forgotten keys by their claims.
	Claimed bool
	// ToRefusal, on a capture_hold with `to` decided as a saga (capturesaga.go),
	// is the refusal its `to` account gave: the capture takes it when the held
	// account would otherwise allow it, as one decision over both would. It is
	// not part of the request.
	ToRefusal *Rejection
}

// Posting is one leg of a transaction: amount moves from one account to another.
type Posting struct {
	From     string `json:"from"`
	To       string `json:"to"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

// Limits of command bodies (PROTOCOL.md §1–2). Every limit is explicit.
const (
	MaxPostings         = 64
	MaxBodyBytes        = 64 << 10
	MaxMetadataEntries  = 32
	MaxMetadataKeyLen   = 64
	MaxMetadataValueLen = 256
)

// InvalidError is a malformed request: status invalid, code invalid_request.
type InvalidError struct {
	Field   string // the offending field ("" for the body as a whole)
	Message string
}

func (e *InvalidError) Error() string {
	if e.Field == "" {
		return e.Message
	}
	return e.Field + ": " + e.Message
}

func invalid(field, format string, args ...any) *InvalidError {
	return &InvalidError{Field: field, Message: fmt.Sprintf(format, args...)}
}

// field kinds of the strict decoder.
type fieldKind uint8

const (
	fID fieldKind = iota
	fKey
	fCurrency
	fAmount
	fLimit
	fMetadata
	fTime
	fPostings
	fRevision // expected_revision (v1.2 §2.3): an integer 0..MaxAmount
	fBool     // up_to (v1.2 §2.3): true or false
)

type fieldSpec struct {
	name     string
	kind     fieldKind
	required bool
}

var commandFields = map[CommandType][]fieldSpec{
	CmdOpenAccount: {{"account_id", fID, true}, {"currency", fCurrency, true}, {"overdraft_limit", fLimit, false}, {"metadata", fMetadata, false}, effectiveField},
	// v1.1: every command that moves or reserves money takes metadata too.
	// v1.2 §2.3: effective_at (effectiveField), expected_revision on the
	// commands of one account, up_to on withdraw and transfer.
	CmdDeposit:         {{"account_id", fID, true}, {"amount", fAmount, true}, {"currency", fCurrency, true}, {"metadata", fMetadata, false}, effectiveField, {"expected_revision", fRevision, false}},
	CmdWithdraw:        {{"account_id", fID, true}, {"amount", fAmount, true}, {"currency", fCurrency, true}, {"metadata", fMetadata, false}, effectiveField, {"expected_revision", fRevision, false}, {"up_to", fBool, false}},
	CmdTransfer:        {{"transfer_id", fID, true}, {"from", fID, true}, {"to", fID, true}, {"amount", fAmount, true}, {"currency", fCurrency, true}, {"metadata", fMetadata, false}, effectiveField, {"up_to", fBool, false}},
	CmdPlaceHold:       {{"account_id", fID, true}, {"hold_id", fID, true}, {"amount", fAmount, true}, {"currency", fCurrency, true}, {"expires_at", fTime, false}, {"metadata", fMetadata, false}, effectiveField, {"expected_revision", fRevision, false}},
	CmdCaptureHold:     {{"account_id", fID, true}, {"hold_id", fID, true}, {"amount", fAmount, false}, {"to", fID, false}, {"metadata", fMetadata, false}, effectiveField, {"expected_revision", fRevision, false}},
	CmdReleaseHold:     {{"account_id", fID, true}, {"hold_id", fID, true}, {"expected_revision", fRevision, false}},
	CmdRefund:          {{"original_key", fKey, true}, {"amount", fAmount, false}, {"metadata", fMetadata, false}, effectiveField},
	CmdCloseAccount:    {{"account_id", fID, true}, {"expected_revision", fRevision, false}},
	CmdPostTransaction: {{"transaction_id", fID, true}, {"postings", fPostings, true}, {"metadata", fMetadata, false}, effectiveField},
}

// effectiveField is effective_at (v1.2 §2.3), on open_account and every
// command that moves or reserves money.
var effectiveField = fieldSpec{"effective_at", fTime, false}

// DecodeCommand decodes a client command body strictly: a JSON object, valid
// UTF-8, at most MaxBodyBytes, no unknown or repeated fields, integers only for
// amounts, every field within its limits.
func DecodeCommand(t CommandType, body []byte) (Command, *InvalidError) {
	specs, ok := commandFields[t]
	if !ok {
		return Command{}, invalid("type", "unknown command type %q", string(t))
	}
	if len(body) > MaxBodyBytes {
		return Command{}, invalid("", "body is %d bytes, over the limit of %d", len(body), MaxBodyBytes)
	}
	if !utf8.Valid(body) {
		return Command{}, invalid("", "body is not valid UTF-8")
	}
	cmd, ok := decodeFast(t, specs, body)
	if !ok {
		var ierr *InvalidError
		if cmd, ierr = decodeGeneral(t, specs, body); ierr != nil {
			return Command{}, ierr
		}
	}
	return checkCommand(cmd)
}

// checkCommand checks what spans a decoded command's fields.
func checkCommand(cmd Command) (Command, *InvalidError) {
	if cmd.Type == CmdCaptureHold && cmd.To != "" && cmd.To == cmd.AccountID {
		return Command{}, invalid("to", "must differ from account_id (%s)", cmd.AccountID)
	}
	return cmd, nil
}

// decodeGeneral is the strict decoder for every body: it accepts what decodeFast
// accepts, and it is the one that says why a body is refused.
func decodeGeneral(t CommandType, specs []fieldSpec, body []byte) (Command, *InvalidError) {
	fields, ierr := decodeObject(body)
	if ierr != nil {
		return Command{}, ierr
	}
	return decodeFields(t, specs, fields)
}

// decodeFields is decodeGeneral's check of a body's members, fields.
func decodeFields(t CommandType, specs []fieldSpec, fields map[string]json.RawMessage) (Command, *InvalidError) {
	cmd := Command{Type: t}
	rawKey, ok := fields["idempotency_key"]
	if !ok {
		return Command{}, invalid("idempotency_key", "is required")
	}
	if err := decodeString(rawKey, &cmd.IdempotencyKey); err != nil || !ValidKey(cmd.IdempotencyKey) {
		return Command{}, invalid("idempotency_key", "must be 1-%d printable ASCII characters", MaxKeyLen)
	}
	known := map[string]bool{"idempotency_key": true}
	for _, s := range specs {
		known[s.name] = true
	}
	for _, name := range sortedKeys(fields) {
		if !known[name] {
			return Command{}, invalid(name, "unknown field for %s", t)
		}
	}
	for _, s := range specs {
		raw, present := fields[s.name]
		if !present || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
			if s.required {
				return Command{}, invalid(s.name, "is required")
			}
			continue
		}
		if err := cmd.setField(s, raw); err != nil {
			return Command{}, err
		}
	}
	return cmd, nil
}

func (c *Command) setField(s fieldSpec, raw json.RawMessage) *InvalidError {
	switch s.kind {
	case fID:
		var v string
		if decodeString(raw, &v) != nil || !ValidID(v) {
			return invalid(s.name, "must be 1-%d characters of [A-Za-z0-9._:-]", MaxIDLen)
		}
		c.setID(s.name, v)
	case fKey:
		var v string
		if decodeString(raw, &v) != nil || !ValidKey(v) {
			return invalid(s.name, "must be 1-%d printable ASCII characters", MaxKeyLen)
		}
		c.OriginalKey = v
	case fCurrency:
		if decodeString(raw, &c.Currency) != nil || !ValidCurrency(c.Currency) {
			return invalid(s.name, "must be three upper-case letters (ISO 4217 style)")
		}
	case fAmount:
		v, err := decodeInteger(raw, 1, MaxAmount)
		if err != nil {
			return invalid(s.name, "must be an integer of minor units from 1 to %d: %s", MaxAmount, err)
		}
		c.Amount, c.HasAmount = v, true
	case fLimit:
		v, err := decodeInteger(raw, 0, MaxAmount)
		if err != nil {
			return invalid(s.name, "must be an integer of minor units from 0 to %d: %s", MaxAmount, err)
		}
		c.OverdraftLimit = v
	case fMetadata:
		m, ierr := decodeMetadata(raw)
		if ierr != nil {
			return ierr
		}
		c.Metadata = m
	case fTime:
		return c.decodeTime(s.name, raw)
	case fPostings:
		p, ierr := decodePostings(raw)
		if ierr != nil {
			return ierr
		}
		c.Postings = p
	case fRevision:
		v, err := decodeInteger(raw, 0, MaxAmount)
		if err != nil {
			return invalid(s.name, "must be an account revision, an integer from 0 to %d: %s", MaxAmount, err)
		}
		c.ExpectedRevision, c.HasExpectedRevision = v, true
	case fBool:
		switch string(bytes.TrimSpace(raw)) {
		case "true":
			c.UpTo = true
		case "false":
		default:
			return invalid(s.name, "must be true or false")
		}
	}
	return nil
}

// decodeTime reads the time field called name, an RFC 3339 string (setTime).
func (c *Command) decodeTime(name string, raw json.RawMessage) *InvalidError {
	var v string
	if decodeString(raw, &v) != nil {
		return invalid(name, "must be an RFC 3339 timestamp string")
	}
	ts, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return invalid(name, "must be an RFC 3339 timestamp: %v", err)
	}
	if !c.setTime(name, ts) {
		return invalid(name, "must not fall inside the first microsecond of year 1")
	}
	return nil
}

// decodePostings reads a transaction's postings: a JSON array of 1-MaxPostings
// objects, each exactly {"from", "to", "amount", "currency"}, from != to.
func decodePostings(raw json.RawMessage) ([]Posting, *InvalidError) {
	raw = bytes.TrimSpace(raw)
	var items []json.RawMessage
	if len(raw) == 0 || raw[0] != '[' || json.Unmarshal(raw, &items) != nil {
		return nil, invalid("postings", "must be an array of postings")
	}
	if len(items) == 0 || len(items) > MaxPostings {
		return nil, invalid("postings", "has %d postings; a transaction has 1 to %d", len(items), MaxPostings)
	}
	out := make([]Posting, len(items))
	for i, item := range items {
		field := func(name string) string { return fmt.Sprintf("postings[%d].%s", i, name) }
		fields, ierr := decodeObject(item)
		if ierr != nil {
			return nil, invalid(fmt.Sprintf("postings[%d]", i), "must be an object {from, to, amount, currency}")
		}
		for _, name := range sortedKeys(fields) {
			if name != "from" && name != "to" && name != "amount" && name != "currency" {
				return nil, invalid(field(name), "unknown field of a posting")
			}
		}
		p := &out[i]
		for _, f := range []struct {
			name string
			v    *string
			ok   func(string) bool
			msg  string
		}{
			{"from", &p.From, ValidID, fmt.Sprintf("must be 1-%d characters of [A-Za-z0-9._:-]", MaxIDLen)},
			{"to", &p.To, ValidID, fmt.Sprintf("must be 1-%d characters of [A-Za-z0-9._:-]", MaxIDLen)},
			{"currency", &p.Currency, ValidCurrency, "must be three upper-case letters (ISO 4217 style)"},
		} {
			rv, ok := fields[f.name]
			if !ok {
				return nil, invalid(field(f.name), "is required")
			}
			if decodeString(rv, f.v) != nil || !f.ok(*f.v) {
				return nil, invalid(field(f.name), "%s", f.msg)
			}
		}
		rv, ok := fields["amount"]
		if !ok {
			return nil, invalid(field("amount"), "is required")
		}
		v, err := decodeInteger(rv, 1, MaxAmount)
		if err != nil {
			return nil, invalid(field("amount"), "must be an integer of minor units from 1 to %d: %s", MaxAmount, err)
		}
		p.Amount = v
		if p.From == p.To {
			return nil, invalid(field("to"), "must differ from from (%s)", p.From)
		}
	}
	return out, nil
}

// setTime sets the time field called name (expires_at, effective_at), in UTC;
// false for an effective_at inside the first microsecond after the zero time
// and not on it, which the truncation would make the zero time, read
// everywhere as no effective_at given (a reviewer of 2cb508d: a deposit
// "effective" then was applied as effective now).
func (c *Command) setTime(name string, ts time.Time) bool {
	if name == effectiveField.name {
		c.EffectiveAt, c.effectiveGiven = Instant(ts), time.Time{}
		if !c.EffectiveAt.Equal(ts) {
			c.effectiveGiven = ts.UTC()
		}
		return !c.EffectiveAt.IsZero() || ts.IsZero()
	}
	c.ExpiresAt = ts.UTC()
	return true
}

// setID sets the ID field called name; false for a name that is not an ID field.
func (c *Command) setID(name, v string) bool {
	switch name {
	case "account_id":
		c.AccountID = v
	case "transfer_id":
		c.TransferID = v
	case "from":
		c.From = v
	case "to":
		c.To = v
	case "hold_id":
		c.HoldID = v
	case "transaction_id":
		c.TransactionID = v
	default:
		return false
	}
	return true
}

// decodeObject reads one JSON object, rejecting repeated names and trailing data.
func decodeObject(body []byte) (map[string]json.RawMessage, *InvalidError) {
	dec := json.NewDecoder(bytes.NewReader(body))
	tok, err := dec.Token()
	if err != nil {
		return nil, invalid("", "malformed JSON: %v", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, invalid("", "body must be a JSON object")
	}
	fields := make(map[string]json.RawMessage)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, invalid("", "malformed JSON: %v", err)
		}
		name, ok := tok.(string)
		if !ok {
			return nil, invalid("", "malformed JSON: object key expected")
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, invalid(name, "malformed JSON value: %v", err)
		}
		if _, dup := fields[name]; dup {
			return nil, invalid(name, "appears more than once")
		}
		fields[name] = raw
	}
	if _, err := dec.Token(); err != nil {
		return nil, invalid("", "malformed JSON: %v", err)
	}
	if !onlySpace(body[dec.InputOffset():]) {
		return nil, invalid("", "trailing data after the JSON object")
	}
	return fields, nil
}

// onlySpace reports whether b holds nothing but JSON whitespace: what may follow
// a body's object (PROTOCOL.md v1.2 §2.2, strict decoding).
func onlySpace(b []byte) bool {
	return skipSpace(b, 0) == len(b)
}

func decodeString(raw json.RawMessage, v *string) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '"' {
		return fmt.Errorf("not a string")
	}
	return json.Unmarshal(raw, v)
}

// decodeInteger accepts only a JSON integer literal: no fraction, no exponent, no string.
func decodeInteger(raw json.RawMessage, lo, hi int64) (int64, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return 0, fmt.Errorf("empty")
	}
	for i, c := range raw {
		if !(c >= '0' && c <= '9') && !(i == 0 && c == '-') {
			return 0, fmt.Errorf("%s is not an integer literal", truncate(string(raw), 32))
		}
	}
	v, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil || v < lo || v > hi {
		return 0, fmt.Errorf("%s is out of range", truncate(string(raw), 32))
	}
	return v, nil
}

func decodeMetadata(raw json.RawMessage) (map[string]string, *InvalidError) {
	fields, ierr := decodeObject(raw)
	if ierr != nil {
		return nil, invalid("metadata", "must be an object of string values")
	}
	if len(fields) > MaxMetadataEntries {
		return nil, invalid("metadata", "has %d entries, over the limit of %d", len(fields), MaxMetadataEntries)
	}
	m := make(map[string]string, len(fields))
	for k, rv := range fields {
		var v string
		if decodeString(rv, &v) != nil {
			return nil, invalid("metadata", "value of %q must be a string", truncate(k, 32))
		}
		if len(k) == 0 || len(k) > MaxMetadataKeyLen || len(v) > MaxMetadataValueLen {
			return nil, invalid("metadata", "keys must be 1-%d bytes and values at most %d bytes", MaxMetadataKeyLen, MaxMetadataValueLen)
		}
		// PostgreSQL's jsonb refuses U+0000, so the read models could not
		// store it: an event holding it would stop its projection for good.
		if strings.IndexByte(k, 0) >= 0 || strings.IndexByte(v, 0) >= 0 {
			return nil, invalid("metadata", "keys and values must not contain U+0000")
		}
		m[k] = v
	}
	return m, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Request is the canonical form of a command's request: the fields that define the
// intent, with defaults applied, without the key and the time. Two requests are the
// same intent exactly when their canonical forms are equal.
type Request map[string]any

// Request returns the canonical request of a command.
func (c Command) Request() Request {
	r := Request{"type": string(c.Type)}
	set := func(name, v string) {
		if v != "" {
			r[name] = v
		}
	}
	set("account_id", c.AccountID)
	set("currency", c.Currency)
	set("transfer_id", c.TransferID)
	set("from", c.From)
	set("to", c.To)
	set("hold_id", c.HoldID)
	set("original_key", c.OriginalKey)
	set("transaction_id", c.TransactionID)
	if len(c.Postings) > 0 {
		ps := make([]any, len(c.Postings))
		for i, p := range c.Postings {
			ps[i] = map[string]any{"from": p.From, "to": p.To, "amount": p.Amount, "currency": p.Currency}
		}
		r["postings"] = ps
	}
	if c.HasAmount {
		r["amount"] = c.Amount
	}
	if c.HasExpectedRevision {
		r["expected_revision"] = c.ExpectedRevision
	}
	if c.UpTo {
		r["up_to"] = true
	}
	if c.Type == CmdOpenAccount {
		r["overdraft_limit"] = c.OverdraftLimit
	}
	if c.canonicalMetadata() {
		md := map[string]any{}
		for k, v := range c.Metadata {
			md[k] = v
		}
		r["metadata"] = md
	}
	if !c.ExpiresAt.IsZero() {
		r["expires_at"] = c.ExpiresAt.UTC().Format(time.RFC3339Nano)
	}
	if e := c.requestEffective(); !e.IsZero() {
		r["effective_at"] = e.UTC().Format(time.RFC3339Nano)
	}
	return r
}

// requestEffective is effective_at as the request gave it: the canonical
// request's (Canonical, Request), finer than EffectiveAt when it was.
func (c Command) requestEffective() time.Time {
	if !c.effectiveGiven.IsZero() {
		return c.effectiveGiven
	}
	return c.EffectiveAt
}

// CanonicalJSON is the request as JSON with sorted keys and integers exact.
func (r Request) CanonicalJSON() []byte {
	b, err := json.Marshal(map[string]any(r))
	if err != nil {
		panic("domain: canonical request does not marshal: " + err.Error())
	}
	return b
}

// Hash is the hex SHA-256 of the canonical JSON.
func (r Request) Hash() string {
	sum := sha256.Sum256(r.CanonicalJSON())
	return hex.EncodeToString(sum[:])
}

// ParseRequest reads a canonical request back from its JSON.
func ParseRequest(b []byte) (Request, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return nil, err
	}
	return normalize(m).(map[string]any), nil
}

// normalize turns json.Number into int64 so that parsed and built requests compare equal.
func normalize(v any) any {
	switch x := v.(type) {
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return i
		}
		return x.String()
	case map[string]any:
		for k, e := range x {
			x[k] = normalize(e)
		}
		return x
	case []any:
		for i, e := range x {
			x[i] = normalize(e)
		}
		return x
	}
	return v
}

// DiffFields lists, sorted, the fields whose values differ between two requests.
func DiffFields(a, b Request) []string {
	var out []string
	seen := map[string]bool{}
	for _, m := range []Request{a, b} {
		for k := range m {
			if seen[k] {
				continue
			}
			seen[k] = true
			av, aok := a[k]
			bv, bok := b[k]
			if aok != bok || !sameJSON(av, bv) {
				out = append(out, k)
			}
		}
	}
	sort.Strings(out)
	return out
}

func sameJSON(a, b any) bool {
	ab, err1 := json.Marshal(normalizeCopy(a))
	bb, err2 := json.Marshal(normalizeCopy(b))
	return err1 == nil && err2 == nil && bytes.Equal(ab, bb)
}

func normalizeCopy(v any) any {
	if n, ok := v.(json.Number); ok {
		if i, err := n.Int64(); err == nil {
			return i
		}
	}
	return v
}

// canonicalMetadata reports whether the canonical request names metadata:
// always for open_account (as since v1), for a money command only when it has
// some (v1.1), so that the requests decided before v1.1 keep their hashes.
func (c Command) canonicalMetadata() bool {
	return c.Type == CmdOpenAccount || len(c.Metadata) > 0
}
