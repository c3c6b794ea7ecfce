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
	if !c.ExpiresAt.IsZero() {
		str("expires_at", c.ExpiresAt.UTC().Format(time.RFC3339Nano))
	}
	str("from", c.From)
	str("hold_id", c.HoldID)
	if c.Type == CmdOpenAccount {
		name("metadata")
		b = appendStringMap(b, c.Metadata)
	}
	str("original_key", c.OriginalKey)
	if c.Type == CmdOpenAccount {
		name("overdraft_limit")
		b = strconv.AppendInt(b, c.OverdraftLimit, 10)
	}
	str("to", c.To)
	str("transfer_id", c.TransferID)
	name("type")
	b = AppendJSONString(b, string(c.Type))
	b = append(b, '}')
	return Canonical{JSON: b, Hash: hexSHA256(b)}
}

// Canonical encodes and hashes a request built as a map (ParseRequest's result).
func (r Request) Canonical() Canonical {
	b := r.CanonicalJSON()
	return Canonical{JSON: b, Hash: hexSHA256(b), req: r}
}

// Request is the canonical request as a map, for DiffFields (conflicts only).
func (c Canonical) Request() (Request, error) {
	if c.req != nil {
		return c.req, nil
	}
	return ParseRequest(c.JSON)
}

// hexSHA256 is hex.EncodeToString of b's SHA-256, with one allocation.
func hexSHA256(b []byte) string {
	sum := sha256.Sum256(b)
	var dst [2 * sha256.Size]byte
	hex.Encode(dst[:], sum[:])
	return string(dst[:])
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
