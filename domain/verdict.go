package domain

// The idempotency verdict (PROTOCOL.md §3, ARCHITECTURE decision "one key, one
// request, forever"). Every place that meets a key it may have seen before (an
// account's record, a saga in a transfer stream, a transaction stream, the
// key's claim) asks Judge and nothing else, over the raw hash (Hash) of the
// canonical request: each carrier turns what it keeps into a Decided, parsing a
// stored hex hash once (ParseHash).

// KeyVerdict is what a request under a key is, given what the key was decided for.
type KeyVerdict uint8

const (
	// KeyNew: the key was never decided; decide the request.
	KeyNew KeyVerdict = iota
	// KeyDuplicate: the same request again; answer the original outcome.
	KeyDuplicate
	// KeyConflict: another request under a decided key; answer
	// idempotency_key_conflict naming Judgement.Fields.
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

// Decided is what a key was decided for: the hash of the canonical request
// and that request, kept (Request) or read when a conflict needs its fields
// (Read: an account's record keeps only the hash). A nil *Decided is a key
// never decided. A zero Hash (a stored hash that did not parse) matches no
// request, so the key is in conflict with every request.
type Decided struct {
	Hash    Hash
	Request []byte
	Read    func() ([]byte, error)
}

// Judgement is the verdict on a request under a key and what its reply
// needs: for a conflict, the fields in which the request differs.
type Judgement struct {
	Verdict KeyVerdict
	Fields  []string
}

// Judge is the verdict on req under a key decided for d (nil: never
// decided): new, duplicate (the caller answers the original outcome), or
// conflict with its fields. The error is Read's, called for a conflict only.
func Judge(d *Decided, req Canonical) (Judgement, error) {
	switch {
	case d == nil:
		return Judgement{Verdict: KeyNew}, nil
	case d.Hash == req.Sum && !d.Hash.IsZero():
		return Judgement{Verdict: KeyDuplicate}, nil
	}
	recorded := d.Request
	if recorded == nil && d.Read != nil {
		var err error
		if recorded, err = d.Read(); err != nil {
			return Judgement{}, err
		}
	}
	return Judgement{Verdict: KeyConflict, Fields: conflictFields(recorded, req)}, nil
}

// DecidedFor is what the metadata of a key's first event says it was decided for.
func DecidedFor(m Metadata) *Decided {
	return &Decided{Hash: ParseHash(m.RequestHash), Request: m.Request}
}

// conflictFields lists the fields in which req differs from the canonical
// request a key was decided for (recorded): the whole "request" when they
// cannot be compared field by field, or when the hashes differ but no field does.
func conflictFields(recorded []byte, req Canonical) []string {
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

// JudgeBatch is the verdict on an atomic batch b under a key that decided
// the batch d records, once the claim's hash matched b's canonical request
// (Judge said duplicate). The hash leaves out a valid element's key (a
// command's key is not part of its request: Command.Canonical; an invalid
// element is hashed as sent, its key with it), so the same commands under
// other keys hash alike; but a key names one request, and an element's key
// decides what the element answers, so they are another batch: a conflict
// naming commands. Every BatchDecided, applied or refused, records its
// elements' keys in order (Keys, since the first build that wrote one), so
// the comparison tells records of every build alike; one that does not list
// an element matches no batch, as a hash that does not parse matches no
// request (Judge).
func JudgeBatch(d *BatchDecided, b Batch) Judgement {
	if len(d.Keys) != len(b.Commands) {
		return Judgement{Verdict: KeyConflict, Fields: []string{"commands"}}
	}
	for i, c := range b.Commands {
		if c.Invalid == nil && c.IdempotencyKey != d.Keys[i] {
			return Judgement{Verdict: KeyConflict, Fields: []string{"commands"}}
		}
	}
	return Judgement{Verdict: KeyDuplicate}
}
