package domain

// The idempotency verdict (PROTOCOL.md §3, ARCHITECTURE decision "one key, one
// request, forever"). Every place that meets a key it may have seen before (an
// account's record, a saga in a transfer stream, the key's claim) asks JudgeKey
// and nothing else, over the raw hash of the canonical request.

// KeyVerdict is what a request under a key is, given what the key was decided for.
type KeyVerdict uint8

const (
	// KeyNew: the key was never decided; decide the request.
	KeyNew KeyVerdict = iota
	// KeyDuplicate: the same request again; answer the original outcome.
	KeyDuplicate
	// KeyConflict: another request under a decided key; answer
	// idempotency_key_conflict naming ConflictFields.
	KeyConflict
)

func (v KeyVerdict) String() string {
	switch v {
	case KeyNew:
		return "new"
	case KeyDuplicate:
		return "duplicate"
	case KeyConflict:
		return "conflict"
	}
	return "unknown"
}

// JudgeKey is the verdict on req under a key: decided says whether the key was
// decided at all, recorded is the hash of the request it was decided for. A
// recorded hash that is not one (the zero hash: metadata whose request_hash did
// not parse) matches no request, so the key is in conflict with every request.
func JudgeKey(decided bool, recorded Hash, req Canonical) KeyVerdict {
	switch {
	case !decided:
		return KeyNew
	case recorded == req.Sum && !recorded.IsZero():
		return KeyDuplicate
	default:
		return KeyConflict
	}
}

// JudgeKeyHex is JudgeKey for a hash as stored (hex, in a claim or metadata).
func JudgeKeyHex(decided bool, recorded string, req Canonical) KeyVerdict {
	return JudgeKey(decided, ParseHash(recorded), req)
}

// ConflictFields lists the fields in which req differs from the canonical request
// a key was decided for (recorded): the whole "request" when they cannot be
// compared field by field, or when the hashes differ but no field does.
func ConflictFields(recorded []byte, req Canonical) []string {
	orig, err := ParseRequest(recorded)
	if err != nil {
		return []string{"request"}
	}
	m, err := req.Request()
	if err != nil {
		return []string{"request"}
	}
	fields := DiffFields(orig, m)
	if len(fields) == 0 {
		fields = []string{"request"}
	}
	return fields
}
