package domain

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

// CmdBatch is the subject of many commands in one request (PROTOCOL.md v1.2
// §2.2): not a command of its own, and never an element of a batch.
const CmdBatch CommandType = "batch"

// Limits of a batch (PROTOCOL.md v1.2 §2.2); each element is also within
// MaxBodyBytes and every limit of its own command.
const (
	MaxBatchCommands  = 1000
	MaxBatchPostings  = 4096
	MaxBatchBodyBytes = 512 << 10
)

// Batch is a decoded ledger.v1.cmd.batch body. A batch outside its limits
// never decodes; an element that is malformed decodes as Invalid, answered
// alone (a batch that is not atomic) or refusing the batch (an atomic one).
type Batch struct {
	Atomic bool
	// Key is an atomic batch's own idempotency key ("" for one that is not).
	Key      string
	Commands []BatchCommand
}

// BatchCommand is one element of a batch: its command, or why it is invalid.
type BatchCommand struct {
	Command
	Invalid *InvalidError
	// Raw is the element as sent.
	Raw json.RawMessage
}

// DecodeBatch decodes a batch body strictly: a JSON object of `commands`
// (1-MaxBatchCommands elements, each at most MaxBodyBytes, at most
// MaxBatchPostings postings in all), `atomic` and, on an atomic batch only
// and then required, `idempotency_key`; at most MaxBatchBodyBytes; nothing
// but whitespace after the object. The error names the field at fault
// (`commands` for a limit of the elements).
func DecodeBatch(body []byte) (Batch, *InvalidError) {
	if len(body) > MaxBatchBodyBytes {
		return Batch{}, invalid("commands", "body is %d bytes, over the limit of %d", len(body), MaxBatchBodyBytes)
	}
	if !utf8.Valid(body) {
		return Batch{}, invalid("", "body is not valid UTF-8")
	}
	if elements, ok := splitBatchFast(body); ok {
		return decodeElements(Batch{}, elements)
	}
	return decodeBatchGeneral(body)
}

// decodeBatchGeneral decodes any batch body with encoding/json's decoder.
func decodeBatchGeneral(body []byte) (Batch, *InvalidError) {
	fields, ierr := decodeObject(body)
	if ierr != nil {
		return Batch{}, ierr
	}
	for _, name := range sortedKeys(fields) {
		if name != "commands" && name != "atomic" && name != "idempotency_key" {
			return Batch{}, invalid(name, "unknown field for a batch")
		}
	}
	var b Batch
	if raw, ok := fields["atomic"]; ok && !isNull(raw) {
		if err := json.Unmarshal(raw, &b.Atomic); err != nil {
			return Batch{}, invalid("atomic", "must be true or false")
		}
	}
	if ierr := b.decodeKey(fields["idempotency_key"]); ierr != nil {
		return Batch{}, ierr
	}
	var elements []json.RawMessage
	if raw, ok := fields["commands"]; !ok || isNull(raw) {
		return Batch{}, invalid("commands", "is required")
	} else if raw = bytes.TrimSpace(raw); raw[0] != '[' || json.Unmarshal(raw, &elements) != nil {
		return Batch{}, invalid("commands", "must be an array of command objects")
	}
	return decodeElements(b, elements)
}

// decodeElements decodes a batch's elements into b, within the batch's limits.
func decodeElements(b Batch, elements []json.RawMessage) (Batch, *InvalidError) {
	if len(elements) < 1 || len(elements) > MaxBatchCommands {
		return Batch{}, invalid("commands", "has %d commands, must have 1-%d", len(elements), MaxBatchCommands)
	}
	b.Commands = make([]BatchCommand, len(elements))
	postings := 0
	for i, raw := range elements {
		if len(raw) > MaxBodyBytes {
			return Batch{}, invalid("commands", "command %d is %d bytes, over the limit of %d", i, len(raw), MaxBodyBytes)
		}
		cmd, ierr := DecodeBatchElement(raw)
		if ierr == nil && b.Atomic && cmd.IdempotencyKey == b.Key {
			// The batch's record and the element's claim would both be the
			// key's stream's first event: the store refuses the append on
			// every send, and the batch would never be decided.
			return Batch{}, invalid("commands", "command %d has the batch's own idempotency_key: a key names one request", i)
		}
		b.Commands[i] = BatchCommand{Command: cmd, Invalid: ierr, Raw: raw}
		if postings += len(cmd.Postings); postings > MaxBatchPostings {
			return Batch{}, invalid("commands", "has more than %d postings in all", MaxBatchPostings)
		}
	}
	return b, nil
}

// splitBatchFast reads the common body of a batch, {"commands":[...]} with
// objects for elements and no other member, without encoding/json's decoder
// (its tokens, and the array decoded again into raw messages, were half of
// DecodeBatch: issue 24): its elements, copied out of body as encoding/json
// would have; false for any other body, which the general path decodes and
// judges.
func splitBatchFast(body []byte) ([]json.RawMessage, bool) {
	sc := flatScan{b: body}
	if !json.Valid(body) || !sc.objectStart() {
		return nil, false
	}
	if name, ok := sc.memberName(); !ok || string(name) != "commands" || sc.i >= len(body) || body[sc.i] != '[' {
		return nil, false
	}
	start := sc.i
	var ends []int // each element's start and end, in pairs
	for sc.i = skipSpace(body, start+1); ; sc.i = skipSpace(body, sc.i+1) {
		end := closing(body, sc.i)
		if end < 0 || body[sc.i] != '{' {
			return nil, false
		}
		ends = append(ends, sc.i, end)
		if sc.i = skipSpace(body, end); sc.i < len(body) && body[sc.i] == ']' {
			break
		} else if sc.i >= len(body) || body[sc.i] != ',' {
			return nil, false
		}
	}
	stop := sc.i + 1
	if sc.i = skipSpace(body, stop); sc.i >= len(body) || body[sc.i] != '}' || skipSpace(body, sc.i+1) != len(body) {
		return nil, false
	}
	array := append([]byte(nil), body[start:stop]...)
	elements := make([]json.RawMessage, len(ends)/2)
	for k := range elements {
		from, to := ends[2*k]-start, ends[2*k+1]-start
		elements[k] = array[from:to:to]
	}
	return elements, true
}

// decodeKey reads the batch's idempotency_key (raw; nil when absent): required
// on an atomic batch, refused on one that is not (its elements carry theirs).
func (b *Batch) decodeKey(raw json.RawMessage) *InvalidError {
	present := raw != nil && !isNull(raw)
	switch {
	case !b.Atomic && present:
		return invalid("idempotency_key", "only an atomic batch has a key of its own; each command carries its own")
	case !b.Atomic:
		return nil
	case !present:
		return invalid("idempotency_key", "is required on an atomic batch")
	}
	if err := decodeString(raw, &b.Key); err != nil || !ValidKey(b.Key) {
		return invalid("idempotency_key", "must be 1-%d printable ASCII characters", MaxKeyLen)
	}
	return nil
}

func isNull(raw json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(raw), []byte("null")) }

// DecodeBatchElement decodes one element of a batch: a command body of its
// type (DecodeCommand's rules) plus the member `type`, a client command type.
func DecodeBatchElement(body []byte) (Command, *InvalidError) {
	if len(body) > MaxBodyBytes {
		return Command{}, invalid("", "body is %d bytes, over the limit of %d", len(body), MaxBodyBytes)
	}
	if !utf8.Valid(body) {
		return Command{}, invalid("", "body is not valid UTF-8")
	}
	if cmd, ok := decodeElementFast(body); ok {
		return checkCommand(cmd)
	}
	fields, ierr := decodeObject(body)
	if ierr != nil {
		return Command{}, ierr
	}
	var t string
	raw, ok := fields["type"]
	switch {
	case !ok || isNull(raw):
		return Command{}, invalid("type", "is required")
	case decodeString(raw, &t) != nil:
		return Command{}, invalid("type", "must be a string")
	case CommandType(t) == CmdBatch:
		return Command{}, invalid("type", "a batch is not an element of a batch")
	}
	specs, ok := commandFields[CommandType(t)]
	if !ok {
		return Command{}, invalid("type", "unknown command type %q", truncate(t, 64))
	}
	delete(fields, "type")
	cmd, ierr := decodeFields(CommandType(t), specs, fields)
	if ierr != nil {
		return Command{}, ierr
	}
	return checkCommand(cmd)
}

// decodeElementFast is decodeFast for a batch element: a flat body with a
// plain `type` naming a client command; false for anything else (the general
// path decides).
func decodeElementFast(body []byte) (Command, bool) {
	var buf [13]bodyField
	fields, ok := flatMembers(body, buf[:])
	if !ok {
		return Command{}, false
	}
	tf := memberNamed(fields, "type")
	if tf == nil || !tf.str {
		return Command{}, false
	}
	specs, known := commandFields[CommandType(tf.value)]
	if !known {
		return Command{}, false
	}
	cmd := Command{Type: CommandType(tf.value)}
	*tf = fields[len(fields)-1] // the members' order does not matter to setFields
	if !cmd.setFields(specs, fields[:len(fields)-1]) {
		return Command{}, false
	}
	return cmd, true
}

// BatchDecided is the single event of an atomic batch's key stream (v1.2
// §2.2): the batch's claim, a KeyClaimed of command "batch" naming the key
// stream itself as where it is decided, so that every reader of claims binds
// the key to the batch's request as to any other, and the batch's decision,
// once and forever. Applied, Keys are its elements' keys, each decided by its
// own claim written in the same append (or decided before, and answered so);
// refused, Index names the element that refused it and Reply is that
// element's reply as the ledger encoded it, and none of the elements' keys is
// decided.
type BatchDecided struct {
	KeyClaimed
	Status Status          `json:"status"`
	Code   Code            `json:"code"`
	Index  *int            `json:"index,omitempty"`
	Reply  json.RawMessage `json:"reply,omitempty"`
	Keys   []string        `json:"keys"`
	// Duplicates are the elements of an applied batch answered as duplicates:
	// their keys were decided before it, or by an earlier element.
	Duplicates []int `json:"duplicates,omitempty"`
}

// Canonical is an atomic batch's canonical request: its elements' canonical
// requests, in order, under "commands" (an invalid element as it was sent,
// compacted). It leaves out the valid elements' keys, as Command.Canonical
// does: two batches are the same request when they also carry the same keys
// (JudgeBatch).
func (b Batch) Canonical() Canonical {
	buf := append(make([]byte, 0, 64+160*len(b.Commands)), `{"atomic":true,"commands":[`...)
	for i, c := range b.Commands {
		if i > 0 {
			buf = append(buf, ',')
		}
		if c.Invalid == nil {
			buf = append(buf, c.Command.Canonical().JSON...)
			continue
		}
		var raw bytes.Buffer
		if json.Compact(&raw, c.Raw) != nil {
			raw.Reset()
			raw.WriteString("null")
		}
		buf = append(buf, raw.Bytes()...)
	}
	buf = append(buf, `],"type":"batch"}`...)
	return canonicalOf(buf, nil)
}
