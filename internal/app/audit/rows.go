package audit

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerworks/ledger/domain"
	"github.com/ledgerworks/ledger/eventstore"
	"github.com/ledgerworks/ledger/internal/app/reply"
	"github.com/ledgerworks/ledger/projections"
)

// Each read-model row is compared as a canonical string: the fold renders what the
// row should be, the reader renders what the table holds, with the same function.
// Entries and commands, the large tables, are kept by the fold as digests of their
// rows only.

// ProjectionTables lists the tables of each projection compared with the fold.
var ProjectionTables = map[string][]string{
	projections.Accounts:  {"accounts", "holds"},
	projections.Entries:   {"entries"},
	projections.Transfers: {"transfers"},
	projections.Commands:  {"commands", "command_accounts"},
	projections.Balances:  {"balance_history"},
}

// notedTables are the tables whose rows grow with history: the fold notes
// their rows in its sets (entries, commands and balance history as digests).
var notedTables = map[string]bool{"entries": true, "commands": true, "balance_history": true, "transfers": true, "holds": true}

// rowText renders a read-model row as the canonical text both sides hash:
// its fields in order, separated by '|', strings quoted (strconv.Quote),
// integers in decimal, times as PostgreSQL stores them (UTC, microseconds,
// RFC 3339), a missing time as null. It appends typed fields to one buffer:
// no field is boxed or rendered into a string of its own.
type rowText struct{ b []byte }

// rowTextBytes is the buffer a row starts with (newRowText): enough for the
// rows the fold renders per event, so that rendering one does not grow it
// five times from nothing (2.1% of the audit's allocated bytes each for the
// separators and the times appended, in a heap profile at 200,000 events).
const rowTextBytes = 256

// newRowText returns a rowText over buf, which the caller declares on its
// stack: the row is rendered without allocating unless it outgrows buf.
func newRowText(buf *[rowTextBytes]byte) rowText { return rowText{b: buf[:0]} }

// The methods take and return rowText by value, the caller keeping the
// result (r = r.str(...)): through a pointer the buffer would escape, and a
// buffer on the caller's stack (newRowText) with it.

func (r rowText) sep() rowText {
	if len(r.b) > 0 {
		r.b = append(r.b, '|')
	}
	return r
}

// str appends s as strconv.Quote renders it. Most of the rows' strings (IDs,
// keys, types, currencies) are printable ASCII with no quote or backslash,
// which Quote leaves as they are: those are copied between quotes, without
// Quote's rune by rune decoding (rowText.str was 6.6% of the audit's CPU at
// 1,000,000 events, nearly all of it strconv's).
func (r rowText) str(s string) rowText { return quoted(r, s) }

// quoted is rowText.str of a string or of the bytes of one (a column's as
// the driver hands them: rowscan.go), alike for the same text.
func quoted[S ~string | ~[]byte](r rowText, s S) rowText {
	r = r.sep()
	if !plainASCII(s) {
		r.b = strconv.AppendQuote(r.b, string(s))
		return r
	}
	r.b = append(append(append(r.b, '"'), s...), '"')
	return r
}

// plainASCII reports whether s is printable ASCII without '"' or '\\'.
func plainASCII[S ~string | ~[]byte](s S) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < ' ' || c > '~' || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

func (r rowText) num(n int64) rowText {
	r = r.sep()
	r.b = strconv.AppendInt(r.b, n, 10)
	return r
}

func (r rowText) at(t time.Time) rowText {
	r, _ = r.atSpan(t)
	return r
}

// textSpan is where a field's text lies in a row (rowText.b[from:to]).
type textSpan struct{ from, to int }

// atSpan is at, and where t's text lies in the row.
func (r rowText) atSpan(t time.Time) (rowText, textSpan) {
	r = r.sep()
	from := len(r.b)
	r.b = domain.Instant(t).AppendFormat(r.b, time.RFC3339Nano)
	return r, textSpan{from, len(r.b)}
}

// atAgain is at of a row's second time, t: when it is the instant of prev,
// rendered earlier in the row at s (atSpan), its text is copied rather than
// formatted again. An event's effective time is its time unless a client gave
// one, so a statement or balance-history row's two times are most often one
// text (the rows' times were 2.91 s of the 10,000,000-event audit's 122.6 s,
// time.AppendFormat's own path 2.05 s of them: BENCHMARKS.md, "`auditcpu2`").
func (r rowText) atAgain(t, prev time.Time, s textSpan) rowText {
	if !domain.Instant(t).Equal(domain.Instant(prev)) {
		return r.at(t)
	}
	r = r.sep()
	r.b = append(r.b, r.b[s.from:s.to]...)
	return r
}

func (r rowText) atOrNull(t *time.Time) rowText {
	if t == nil {
		r = r.sep()
		r.b = append(r.b, "null"...)
		return r
	}
	return r.at(*t)
}

// digest is the row's digest (digestOf) without a string of the row.
func (r rowText) digest() string { return digestOf(r.b) }

func field(r rowText, v any) rowText {
	switch x := v.(type) {
	case string:
		return r.str(x)
	case int64:
		return r.num(x)
	case time.Time:
		return r.at(x)
	case *time.Time:
		return r.atOrNull(x)
	default:
		r = r.sep()
		r.b = fmt.Append(r.b, x)
		return r
	}
}

func row(fields ...any) string {
	var buf [rowTextBytes]byte
	r := newRowText(&buf)
	for _, f := range fields {
		r = field(r, f)
	}
	return string(r.b)
}

// digestOf is the digest of a row's bytes: the hex of the first 16 bytes of
// their SHA-256 (rowText.digest, the rows' appendDigest, replyRow).
func digestOf(b []byte) string { return digestValue(b).String() }

// rowDigest is a row's digest (digestOf) as a value: the fold notes a row's
// digest in its sets (rowNote) without a string of its own, an allocation a
// row (a balance-history row's, a statement's, a reply's: about two an
// account event).
type rowDigest [digestLen]byte

// digestValue is digestOf(b) as a value.
func digestValue(b []byte) (d rowDigest) {
	appendDigest(d[:0], b)
	return d
}

func (d rowDigest) String() string { return string(d[:]) }

// rowNote is what the fold notes of a row it expects (historySets.row): its
// digest, or, for a table compared by its rows' text (holds, transfers),
// that text. A value, passed without a string of the digest.
type rowNote struct {
	text   string
	digest rowDigest
	hashed bool // the digest, not text
}

func textNote(text string) rowNote   { return rowNote{text: text} }
func digestNote(d rowDigest) rowNote { return rowNote{digest: d, hashed: true} }

// String is the note as memSets keep it: the digest's text, or the row's.
func (n rowNote) String() string {
	if n.hashed {
		return n.digest.String()
	}
	return n.text
}

// digestLen is the length of a row's digest (digestOf).
const digestLen = 32

// appendDigest appends digestOf(b) to dst.
func appendDigest(dst, b []byte) []byte {
	sum := sha256.Sum256(b)
	return hex.AppendEncode(dst, sum[:16])
}

// metadataJSON renders a client's metadata as PostgreSQL's jsonb::text and
// encoding/json both render an empty one, and through encoding/json otherwise
// (sorted keys; the comparison reads the table's through the same function),
// as the read models hold it (projections.ReadModelMetadata: an event's
// U+0000 is U+FFFD there, on purpose, not a difference).
func metadataJSON(m map[string]string) string {
	if len(m) == 0 {
		return "{}"
	}
	b, _ := json.Marshal(projections.ReadModelMetadata(m))
	return string(b)
}

func accountRowOf(a *domain.Account) string {
	c := accountColsOf(a)
	return row(accountColumns.values(&c)...)
}

// commandAccountRowOf renders an account's row of the commands projection's
// own fold (command_accounts): the accounts row's columns of the same names.
func commandAccountRowOf(a *domain.Account) string {
	c := accountMoneyOf(a)
	return row(commandAccountColumns.values(&c)...)
}

func holdRowOf(account, currency string, h *domain.Hold, captured int64) string {
	c := holdColsOf(account, currency, h, captured)
	return row(holdColumns.values(&c)...)
}

// entryRow renders the statement row of a money event (id: its ID's text),
// with the fold's balance.
func entryRow(re eventstore.RecordedEvent, id string, m domain.Metadata, payload any, account string, balance int64) (rowDigest, bool) {
	var reason, ref, currency string
	var amount int64
	var md map[string]string
	switch p := payload.(type) {
	case *domain.Credited:
		reason, ref, currency, amount, md = p.Reason, p.Ref, p.Currency, p.Amount, p.Metadata
	case *domain.Debited:
		reason, ref, currency, amount, md = p.Reason, p.Ref, p.Currency, -p.Amount, p.Metadata
	case *domain.HoldCaptured:
		reason, ref, currency, amount, md = "hold_capture", p.HoldID, p.Currency, -p.Amount, p.Metadata
	default:
		return rowDigest{}, false
	}
	return entryFields[string]{id: id, account: account, rev: int64(re.Revision), typ: re.Type, reason: reason, ref: ref, amount: amount,
		currency: currency, balance: balance, key: m.Key, at: m.At, md: md, effective: domain.EffectiveTime(m)}.digest(), true
}

// entryFields are the columns of a statement row (entries), as the fold
// expects them (S string) and as the table holds them (S []byte: the
// driver's bytes, rowscan.go), rendered alike (appendDigest).
type entryFields[S ~string | ~[]byte] struct {
	id, account      S
	rev              int64
	typ, reason, ref S
	amount           int64
	currency         S
	balance          int64
	key              S
	at               time.Time
	md               map[string]string
	effective        time.Time
}

func (e entryFields[S]) digest() (d rowDigest) {
	e.appendDigest(d[:0])
	return d
}

// appendDigest appends the row's digest (digestOf of its text) to dst.
func (e entryFields[S]) appendDigest(dst []byte) []byte {
	var buf [rowTextBytes]byte
	r := newRowText(&buf)
	r = quoted(quoted(r, e.id), e.account).num(e.rev)
	r = quoted(quoted(quoted(r, e.typ), e.reason), e.ref).num(e.amount)
	r = quoted(r, e.currency).num(e.balance)
	r, at := quoted(r, e.key).atSpan(e.at)
	r = r.str(metadataJSON(e.md)).atAgain(e.effective, e.at, at)
	return appendDigest(dst, r.b)
}

// historyRow renders the balance-history row of an account event (id: its
// ID's text): the account as the fold has it after the event.
func historyRow(re eventstore.RecordedEvent, id string, m domain.Metadata, a *domain.Account) rowDigest {
	return historyFields[string]{account: a.ID, rev: int64(re.Revision), id: id, typ: re.Type, currency: a.Currency,
		balance: a.Balance, held: a.Held, status: string(a.Status()), at: m.At, effective: domain.EffectiveTime(m)}.digest()
}

// historyFields are the columns of a balance-history row, as entryFields
// are a statement row's.
type historyFields[S ~string | ~[]byte] struct {
	account           S
	rev               int64
	id, typ, currency S
	balance, held     int64
	status            S
	at, effective     time.Time
}

func (h historyFields[S]) digest() (d rowDigest) {
	h.appendDigest(d[:0])
	return d
}

// appendDigest appends the row's digest (digestOf of its text) to dst.
func (h historyFields[S]) appendDigest(dst []byte) []byte {
	var buf [rowTextBytes]byte
	r := newRowText(&buf)
	r = quoted(r, h.account).num(h.rev)
	r = quoted(quoted(quoted(r, h.id), h.typ), h.currency).num(h.balance).num(h.held)
	r, at := quoted(r, h.status).atSpan(h.at)
	r = r.atAgain(h.effective, h.at, at)
	return appendDigest(dst, r.b)
}

func transferRowOf(t *domain.Transfer) string {
	var refunded int64
	for _, k := range t.RefundOrder {
		if r := t.Refunds[k]; r.Stage == domain.SagaCompleted {
			refunded += r.Amount
		}
	}
	var out [rowTextBytes]byte
	return string(transferFields[string]{id: t.ID, from: t.From, to: t.To, amount: t.Amount, currency: t.Currency,
		status: t.Saga.Stage.Status(), refunded: refunded}.appendRow(out[:0]))
}

// transferFields are the columns of a transfers row, as entryFields are a
// statement row's; the row is compared as its text.
type transferFields[S ~string | ~[]byte] struct {
	id, from, to     S
	amount           int64
	currency, status S
	refunded         int64
}

// appendRow appends the row's text to dst.
func (t transferFields[S]) appendRow(dst []byte) []byte {
	var buf [rowTextBytes]byte
	r := newRowText(&buf)
	r = quoted(quoted(quoted(r, t.id), t.from), t.to).num(t.amount)
	r = quoted(quoted(r, t.currency), t.status).num(t.refunded)
	return append(dst, r.b...)
}

// replyBytes is the buffer replyRow renders a reply in: enough for the
// replies of the realistic history (bench/seed), so that rendering one does
// not allocate. At 512 bytes a transfer's or transaction's reply (512-1,135
// bytes: 87,471 of the 412,388 replies of a history of 1,000,201 events, by
// a query of the commands read model's replies' lengths, not kept) grew it on
// the heap, once (twice above 896 bytes), about 100 of the fold's 1,004 bytes
// an event (BenchmarkFoldRealisticEvents).
const replyBytes = 1280

// replyRow is the digest of a reply as the ledger encodes it (duplicate
// false): reply.AppendJSON, json.Marshal's bytes without its reflection
// (json.Marshal was 7.5% of the audit's CPU at 1,000,000 events).
func replyRow(r reply.Reply) rowDigest {
	r.Duplicate = false
	var buf [replyBytes]byte
	return digestValue(reply.AppendJSON(buf[:0], r)) // without a string of the reply
}

// Expected renders the rows a projection's tables should hold now, by table and
// row key. account, when set, keeps only the rows that concern that account.
func (f *Fold) Expected(projection, account string) map[string]map[string]string {
	out := map[string]map[string]string{}
	for _, t := range ProjectionTables[projection] {
		out[t] = map[string]string{}
	}
	keep := func(id string) bool { return account == "" || id == account }
	switch projection {
	case projections.Accounts:
		for id, a := range f.Accounts {
			if !a.Opened || !keep(id) {
				continue
			}
			out["accounts"][id] = accountRowOf(a)
		}
		if ms, ok := f.sets.(*memSets); ok {
			out["holds"] = ms.expected("holds", account)
		}
	case projections.Commands:
		for id, a := range f.Accounts {
			if a.Revision >= 0 && keep(id) { // every account stream with an event, opened or not
				out["command_accounts"][id] = commandAccountRowOf(a)
			}
		}
		if ms, ok := f.sets.(*memSets); ok {
			out["commands"] = ms.expected("commands", account)
		}
	case projections.Entries, projections.Balances, projections.Transfers:
		if ms, ok := f.sets.(*memSets); ok {
			table := ProjectionTables[projection][0]
			out[table] = ms.expected(table, account)
		}
	}
	return out
}

// Querier is what reading a read model needs: a pool, a connection or a transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// ReadTable renders the rows of a read-model table by row key: the live view when
// gen is 0, else the table of generation gen. account, when set, keeps only the
// rows that concern that account.
func ReadTable(ctx context.Context, q Querier, table string, gen int, account string) (map[string]string, error) {
	return readTable(ctx, tableRead{q: q, table: table, gen: gen, account: account}, nil)
}

// readTable is ReadTable of the rows of keys (every row when nil).
func readTable(ctx context.Context, tr tableRead, keys []string) (map[string]string, error) {
	t, err := openTable(ctx, tr, keys)
	if err != nil {
		return nil, err
	}
	defer t.Close()
	out := map[string]string{}
	for t.Next() {
		out[string(t.key)] = string(t.row)
	}
	return out, t.Err()
}

// tableRows reads a read-model table's rows one at a time, each rendered
// (key, row) as the fold renders what it expects: bytes valid until the
// next row (the driver's, or buffers the next row reuses), which a caller
// that keeps them copies.
type tableRows struct {
	table, name string
	rows        pgx.Rows
	key, row    []byte
	err         error
	raw         rawRow
	// id, digest and text are the buffers a row's key and row are rendered in.
	id     [36]byte
	digest [digestLen]byte
	text   []byte
}

// tableRead is a read-model table as the comparison reads it: through q (a
// snapshot of the read models), its name, its generation (0: the live view)
// and the account its rows are kept to ("": every row).
type tableRead struct {
	q       Querier
	table   string
	gen     int
	account string
}

func openTable(ctx context.Context, tr tableRead, keys []string) (*tableRows, error) {
	name := projections.View(tr.table)
	if tr.gen > 0 {
		name = projections.Table(tr.table, tr.gen)
	}
	var sql string
	switch tr.table {
	case "accounts":
		sql = `SELECT ` + accountsSQLs.selects + ` FROM %s WHERE $1 = '' OR account_id = $1`
	case "holds":
		sql = `SELECT ` + holdsSQLs.selects + ` FROM %s WHERE $1 = '' OR account_id = $1`
	case "command_accounts":
		sql = `SELECT ` + commandAccountsSelects + ` FROM %s WHERE $1 = '' OR account_id = $1`
	case "entries":
		sql = `SELECT event_id, account_id, revision, type, reason, ref, amount, currency, balance_after, idempotency_key, at, metadata::text, effective_at FROM %s WHERE $1 = '' OR account_id = $1`
	case "transfers":
		sql = `SELECT transfer_id, from_account, to_account, amount, currency, status, refunded FROM %s WHERE $1 = '' OR from_account = $1 OR to_account = $1`
	case "balance_history":
		sql = `SELECT account_id, revision, event_id, type, currency, balance, held, status, at, effective_at FROM %s WHERE $1 = '' OR account_id = $1`
	case "commands":
		sql = `SELECT idempotency_key, reply::text FROM %s WHERE $1 = '' OR stream = 'account-' || $1`
	default:
		return nil, fmt.Errorf("audit: unknown read-model table %q", tr.table)
	}
	args := []any{tr.account}
	if keys != nil { // only the rows of these keys (a key as the fold names it)
		sql = strings.Replace(sql, "WHERE ", "WHERE (", 1) + ") AND " + keyFilter[tr.table]
		args = append(args, keys)
	}
	rows, err := tr.q.Query(ctx, fmt.Sprintf(sql, name), args...)
	if err != nil {
		return nil, fmt.Errorf("audit: read %s: %w", name, err)
	}
	return &tableRows{table: tr.table, name: name, rows: rows}, nil
}

// keyFilter selects a read-model table's rows by their keys ($2, as the fold
// names them), through the table's unique index. The keys are an array the
// statement computes (ARRAY(SELECT unnest(...))), not the parameter itself:
// PostgreSQL costs an index scan of "= ANY" over a bound array as a descent
// per element, and over a page of 5,000 keys planned a parallel sequential
// scan of the table at 1,000,000 events (2.4x the CPU of the index scan it
// plans over a computed array, BENCHMARKS.md, "`auditpg2`").
var keyFilter = map[string]string{
	"accounts":         `account_id = ANY(ARRAY(SELECT unnest($2::text[])))`,
	"command_accounts": `account_id = ANY(ARRAY(SELECT unnest($2::text[])))`,
	"holds":            `(account_id, hold_id) IN (SELECT split_part(k, '/', 1), substr(k, length(split_part(k, '/', 1)) + 2) FROM unnest($2::text[]) k)`,
	"entries":          `event_id = ANY(ARRAY(SELECT unnest($2::text[]::uuid[])))`,
	"balance_history":  `event_id = ANY(ARRAY(SELECT unnest($2::text[]::uuid[])))`,
	"transfers":        `transfer_id = ANY(ARRAY(SELECT unnest($2::text[])))`,
	"commands":         `idempotency_key = ANY(ARRAY(SELECT unnest($2::text[])))`,
}

// Next reads the next row; false at the end or on an error (Err).
func (t *tableRows) Next() bool {
	if t.err != nil || !t.rows.Next() {
		return false
	}
	t.err = t.scan()
	return t.err == nil
}

func (t *tableRows) Err() error {
	err := t.err
	if err == nil {
		err = t.rows.Err()
	}
	if err != nil {
		return fmt.Errorf("audit: read %s: %w", t.name, err)
	}
	return nil
}

func (t *tableRows) Close() { t.rows.Close() }

// scan reads the row at the cursor into key and row, rendered from the
// driver's bytes (rowscan.go) as the fold renders what it expects.
func (t *tableRows) scan() error {
	r := &t.raw
	r.vals, r.err = t.rows.RawValues(), nil
	if r.fields == nil {
		r.fields = t.rows.FieldDescriptions()
	}
	if len(r.vals) != len(r.fields) {
		return fmt.Errorf("audit: %d values in a row of %d columns", len(r.vals), len(r.fields))
	}
	switch t.table {
	case "accounts":
		t.text = accountColumns.appendRaw(t.text[:0], r)
		t.key, t.row = r.text(0), t.text
	case "command_accounts":
		t.text = commandAccountColumns.appendRaw(t.text[:0], r)
		t.key, t.row = r.text(0), t.text
	case "holds":
		t.text = holdColumns.appendRaw(t.text[:0], r)
		n := len(t.text)
		t.text = append(append(append(t.text, r.text(0)...), '/'), r.text(1)...) // account/hold
		t.key, t.row = t.text[n:], t.text[:n]
	case "entries":
		t.scanEntry(r)
	case "balance_history":
		h := historyFields[[]byte]{account: r.text(0), rev: r.int8(1), id: r.uuidText(2, &t.id), typ: r.text(3), currency: r.text(4),
			balance: r.int8(5), held: r.int8(6), status: r.text(7), at: r.at(8), effective: r.at(9)}
		t.key, t.row = h.id, h.appendDigest(t.digest[:0])
	case "transfers":
		tf := transferFields[[]byte]{id: r.text(0), from: r.text(1), to: r.text(2), amount: r.int8(3), currency: r.text(4),
			status: r.text(5), refunded: r.int8(6)}
		t.text = tf.appendRow(t.text[:0])
		t.key, t.row = tf.id, t.text
	case "commands":
		// The read model holds the reply as the ledger encodes it, byte for byte.
		t.key = r.text(0)
		t.row = appendDigest(t.digest[:0], r.text(1))
	default:
		return fmt.Errorf("audit: unknown table %q", t.table)
	}
	return r.err
}

// scanEntry reads a statement row; its metadata is read into a map and
// rendered as the fold renders it (metadataJSON) unless empty.
func (t *tableRows) scanEntry(r *rawRow) {
	e := entryFields[[]byte]{id: r.uuidText(0, &t.id), account: r.text(1), rev: r.int8(2), typ: r.text(3), reason: r.text(4),
		ref: r.text(5), amount: r.int8(6), currency: r.text(7), balance: r.int8(8), key: r.text(9), at: r.at(10), effective: r.at(12)}
	if md := r.text(11); r.err == nil && string(md) != "{}" {
		var err error
		if e.md, err = metadataOf(md); err != nil {
			r.fail(11, err)
		}
	}
	t.key, t.row = e.id, e.appendDigest(t.digest[:0])
}

// metadataOf reads a read model's metadata (jsonb's text) into a map: a
// function of its own, so that the map's variable is on the heap only when
// there is metadata to read.
func metadataOf(b []byte) (map[string]string, error) {
	var m map[string]string
	err := json.Unmarshal(b, &m)
	return m, err
}

// TableDiff is how a table differs from the fold.
type TableDiff struct {
	Table          string
	Rows, Expected int
	Digest         string   // of the table's rows
	ExpectedDigest string   // of the fold's rows
	Missing        []string // row keys the fold has and the table lacks
	Extra          []string // row keys the table has and the fold does not
	Differ         []string // row keys whose content differs
}

// OK reports whether the table equals the fold.
func (d TableDiff) OK() bool { return len(d.Missing)+len(d.Extra)+len(d.Differ) == 0 }

// Describe names the first differences.
func (d TableDiff) Describe(max int) string {
	var parts []string
	add := func(what string, keys []string) {
		for i, k := range keys {
			if i == max {
				parts = append(parts, fmt.Sprintf("%d more %s", len(keys)-max, what))
				break
			}
			parts = append(parts, fmt.Sprintf("%s %q", what, k))
		}
	}
	add("missing row", d.Missing)
	add("unexpected row", d.Extra)
	add("differing row", d.Differ)
	return fmt.Sprintf("%s: %d rows (fold %d), digest %s (fold %s): %s", d.Table, d.Rows, d.Expected, short(d.Digest), short(d.ExpectedDigest), strings.Join(parts, ", "))
}

func short(s string) string {
	if len(s) > 16 {
		return s[:16]
	}
	return s
}

// CompareTable compares a table's rows with the fold's.
func CompareTable(table string, expected, actual map[string]string) TableDiff {
	d := TableDiff{Table: table, Rows: len(actual), Expected: len(expected), Digest: Digest(actual), ExpectedDigest: Digest(expected)}
	for k, want := range expected {
		got, ok := actual[k]
		switch {
		case !ok:
			d.Missing = append(d.Missing, k)
		case got != want:
			d.Differ = append(d.Differ, k)
		}
	}
	for k := range actual {
		if _, ok := expected[k]; !ok {
			d.Extra = append(d.Extra, k)
		}
	}
	d.sortKeys()
	return d
}

// sortKeys sorts the keys a diff names.
func (d *TableDiff) sortKeys() {
	sort.Strings(d.Missing)
	sort.Strings(d.Extra)
	sort.Strings(d.Differ)
}

// compareRows is CompareTable of a table read one row at a time: it keeps
// the keys of the rows read, not the rows, which read into a map beside the
// fold's expected ones (the accounts table, at the end of the audit) cost
// memory that grows with the accounts. With onlyExpected, a row the fold does not expect is left out (an
// incremental audit's rows, which its events touched). A key read twice is
// named extra.
func compareRows(table string, expected map[string]string, t *tableRows, onlyExpected bool) (TableDiff, error) {
	d := TableDiff{Table: table, Expected: len(expected), ExpectedDigest: Digest(expected)}
	seen := make(map[string]struct{}, len(expected))
	var lanes [4]uint64
	for t.Next() {
		want, ok := expected[string(t.key)]
		if !ok && onlyExpected {
			continue
		}
		d.Rows++
		lanes = addLanes(lanes, t.key, t.row)
		key := string(t.key)
		if _, again := seen[key]; again || !ok {
			d.Extra = append(d.Extra, key)
			continue
		}
		seen[key] = struct{}{}
		if string(t.row) != want {
			d.Differ = append(d.Differ, key)
		}
	}
	if err := t.Err(); err != nil {
		return TableDiff{}, err
	}
	d.Digest = lanesString(lanes)
	for k := range expected {
		if _, ok := seen[k]; !ok {
			d.Missing = append(d.Missing, k)
		}
	}
	d.sortKeys()
	return d, nil
}

// Digest is an order-independent digest of rows: the sum, lane by lane, of the
// SHA-256 of each (key, row).
func Digest(rows map[string]string) string {
	var lanes [4]uint64
	for k, r := range rows {
		lanes = addLanes(lanes, k, r)
	}
	return lanesString(lanes)
}

func addLanes[K, R ~string | ~[]byte](lanes [4]uint64, key K, row R) [4]uint64 {
	sum := rowHash(key, row)
	return addHash(lanes, sum[:])
}

// rowHash is the SHA-256 of a (key, row): what Digest sums, and what the
// PostgreSQL sets keep of a row instead of the row itself; alike for the
// same text as strings (the fold's) or bytes (a table's, rowscan.go).
func rowHash[K, R ~string | ~[]byte](key K, row R) [sha256.Size]byte {
	var buf [rowTextBytes]byte // the bytes hashed, on the stack unless longer
	b := append(append(append(buf[:0], key...), 0), row...)
	return sha256.Sum256(b)
}

// addHash adds a row's hash (rowHash) to the lanes.
func addHash(lanes [4]uint64, sum []byte) [4]uint64 {
	for i := range lanes {
		lanes[i] += binary.BigEndian.Uint64(sum[i*8:])
	}
	return lanes
}

func lanesString(lanes [4]uint64) string {
	var out [32]byte
	for i, l := range lanes {
		binary.BigEndian.PutUint64(out[i*8:], l)
	}
	return hex.EncodeToString(out[:])
}
