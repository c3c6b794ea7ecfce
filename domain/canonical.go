package domain

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"sort"
	"strconv"
	"time"
)

// Canonical is a command's request in its canonical form, encoded and hashed once:
// JSON is exactly Request().CanonicalJSON() and Hash exactly Request().Hash(), so
// that a command pays for them once however often it compares or writes them.
type Canonical struct {
	JSON []byte // canonical request JSON (Request.CanonicalJSON)
	Hash string // hex SHA-256 of JSON (Request.Hash)
	Sum  Hash   // the same SHA-256, raw
	req  Request
}

// Canonical returns the command's canonical request, encoded straight from the
// command's fields (no map, no reflection) into the bytes Request().CanonicalJSON()
// gives: keys sorted, strings escaped as encoding/json escapes them.
func (c Command) Canonical() Canonical {
	b := make([]byte, 0, 128)
	b = append(b, '{')
	first := true
	name := func(n string) {
		if !first {
			b = append(b, ',')
		}
		first = false
		b = append(b, '"')
		b = append(b, n...)
		b = append(b, '"', ':')
	}
	str := func(n, v string) {
		if v != "" {
			name(n)
			b = AppendJSONString(b, v)
		}
	}
	// The names in sorted order, as encoding/json writes a map.
	str("account_id", c.AccountID)
	if c.HasAmount {
		name("amount")
		b = strconv.AppendInt(b, c.Amount, 10)
	}
	str("currency", c.Currency)
	if e := c.requestEffective(); !e.IsZero() {
		str("effective_at", e.UTC().Format(time.RFC3339Nano))
	}
	if c.HasExpectedRevision {
		name("expected_revision")
		b = strconv.AppendInt(b, c.ExpectedRevision, 10)
	}
	if !c.ExpiresAt.IsZero() {
		str("expires_at", c.ExpiresAt.UTC().Format(time.RFC3339Nano))
	}
	str("from", c.From)
	str("hold_id", c.HoldID)
	if c.canonicalMetadata() {
		name("metadata")
		b = appendStringMap(b, c.Metadata)
	}
	str("original_key", c.OriginalKey)
	if c.Type == CmdOpenAccount {
		name("overdraft_limit")
		b = strconv.AppendInt(b, c.OverdraftLimit, 10)
	}
	if len(c.Postings) > 0 {
		name("postings")
		b = appendPostings(b, c.Postings)
	}
	str("to", c.To)
	str("transaction_id", c.TransactionID)
	str("transfer_id", c.TransferID)
	name("type")
	b = AppendJSONString(b, string(c.Type))
	if c.UpTo { // absent when false: false is the default, the same intent
		name("up_to")
		b = append(b, "true"...)
	}
	b = append(b, '}')
	return canonicalOf(b, nil)
}

// appendPostings appends postings as encoding/json writes []map[string]any of
// them: each object's keys sorted (amount, currency, from, to).
func appendPostings(b []byte, ps []Posting) []byte {
	b = append(b, '[')
	for i, p := range ps {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"amount":`...)
		b = strconv.AppendInt(b, p.Amount, 10)
		b = append(b, `,"currency":`...)
		b = AppendJSONString(b, p.Currency)
		b = append(b, `,"from":`...)
		b = AppendJSONString(b, p.From)
		b = append(b, `,"to":`...)
		b = AppendJSONString(b, p.To)
		b = append(b, '}')
	}
	return append(b, ']')
}

// Canonical encodes and hashes a request built as a map (ParseRequest's result).
func (r Request) Canonical() Canonical {
	return canonicalOf(r.CanonicalJSON(), r)
}

// Request is the canonical request as a map, for DiffFields (conflicts only).
func (c Canonical) Request() (Request, error) {
	if c.req != nil {
		return c.req, nil
	}
	return ParseRequest(c.JSON)
}

func canonicalOf(b []byte, r Request) Canonical {
	sum := Hash(sha256.Sum256(b))
	return Canonical{JSON: b, Hash: sum.String(), Sum: sum, req: r}
}

// hexSHA256 is hex.EncodeToString of b's SHA-256, with one allocation.
func hexSHA256(b []byte) string { return Hash(sha256.Sum256(b)).String() }

// Hash is a SHA-256 kept raw (32 bytes, comparable); metadata and stored bytes
// carry it as lower-case hex (String).
type Hash [sha256.Size]byte

// String is the hash in lower-case hex, with one allocation.
func (h Hash) String() string {
	var dst [2 * sha256.Size]byte
	hex.Encode(dst[:], h[:])
	return string(dst[:])
}

// IsZero reports whether h is the zero hash: ParseHash's answer for what is not a hash.
func (h Hash) IsZero() bool { return h == Hash{} }

// ParseHash is the raw form of a hash written by String: 64 lower-case hex digits.
// Anything else (which no canonical request's hash equals) gives the zero hash.
func ParseHash(s string) Hash {
	var h Hash
	if len(s) != 2*sha256.Size {
		return Hash{}
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		var v byte
		switch {
		case '0' <= c && c <= '9':
			v = c - '0'
		case 'a' <= c && c <= 'f':
			v = c - 'a' + 10
		default:
			return Hash{}
		}
		h[i/2] = h[i/2]<<4 | v
	}
	return h
}

// appendStringMap appends m as encoding/json writes a map[string]string (or a
// map[string]any of strings): keys sorted bytewise, "{}" for none.
func appendStringMap(b []byte, m map[string]string) []byte {
	b = append(b, '{')
	if len(m) > 0 {
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = AppendJSONString(b, k)
			b = append(b, ':')
			b = AppendJSONString(b, m[k])
		}
	}
	return append(b, '}')
}

// AppendJSONString appends s as a JSON string exactly as json.Marshal writes it
// (HTML characters, U+2028/U+2029 and invalid UTF-8 escaped or replaced alike).
// Strings of printable ASCII without '"', '\\' and the HTML characters '<', '>',
// '&' are written as they are; anything else goes through json.Marshal itself.
func AppendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			enc, err := json.Marshal(s)
			if err != nil {
				panic("domain: string does not marshal: " + err.Error())
			}
			return append(b, enc...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
