package natsapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/ledgerworks/ledger/internal/app/reply"
)

// PubAck is JetStream's acknowledgement of a stored message. Because the stream
// captures the command subjects, a command sent as a request gets this first, on
// its reply subject, and then the ledger's reply.
type PubAck struct {
	Stream    string `json:"stream"`
	Seq       uint64 `json:"seq"`
	Duplicate bool   `json:"duplicate,omitempty"`
	Error     *struct {
		Code        int    `json:"code"`
		ErrCode     int    `json:"err_code"`
		Description string `json:"description"`
	} `json:"error,omitempty"`
}

// ParsePubAck reports whether data is a JetStream publish acknowledgement (and not
// a ledger reply, which always has a "code").
func ParsePubAck(data []byte) (PubAck, bool) {
	var probe map[string]json.RawMessage
	if json.Unmarshal(data, &probe) != nil {
		return PubAck{}, false
	}
	if _, ok := probe["code"]; ok {
		return PubAck{}, false
	}
	_, hasStream := probe["stream"]
	_, hasErr := probe["error"]
	if !hasStream && !hasErr {
		return PubAck{}, false
	}
	var a PubAck
	if json.Unmarshal(data, &a) != nil {
		return PubAck{}, false
	}
	return a, true
}

// ErrNoReply means no ledger reply came before the context ended. The outcome is
// indefinite: retry with the same key (PROTOCOL.md; ARCHITECTURE pitfalls). Stored
// tells whether JetStream confirmed that the command is in the stream, in which
// case a ledger will decide it even if no one retries.
type ErrNoReply struct {
	Stored *PubAck
	Err    error
}

func (e *ErrNoReply) Error() string {
	if e.Stored != nil {
		return fmt.Sprintf("no reply from the ledger (%v); the command is stored in %s as message %d and will be decided: query its outcome or retry with the same key", e.Err, e.Stored.Stream, e.Stored.Seq)
	}
	return fmt.Sprintf("no reply from the ledger (%v): the outcome is unknown, retry with the same key", e.Err)
}

func (e *ErrNoReply) Unwrap() error { return e.Err }

// RequestReply is Request with the reply decoded.
func RequestReply(ctx context.Context, nc *nats.Conn, typ string, body []byte, hdr nats.Header) (reply.Reply, error) {
	b, err := Request(ctx, nc, typ, body, hdr)
	if err != nil {
		return reply.Reply{}, err
	}
	var r reply.Reply
	if err := json.Unmarshal(b, &r); err != nil {
		return reply.Reply{}, fmt.Errorf("natsapi: the reply %s: %w", b, err)
	}
	return r, nil
}

// Request sends a command body on ledger.v1.cmd.<typ> and returns the ledger's
// reply (the raw JSON of a reply.Reply). LEDGER_COMMANDS is declared with NoAck, so
// no PubAck should come; one from a stream declared otherwise is skipped. hdr may carry
// a Nats-Msg-Id (the stream's courtesy dedupe). ctx bounds the wait.
func Request(ctx context.Context, nc *nats.Conn, typ string, body []byte, hdr nats.Header) ([]byte, error) {
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, fmt.Errorf("natsapi: %w", err)
	}
	defer sub.Unsubscribe()
	msg := &nats.Msg{Subject: CommandSubject(typ), Reply: inbox, Data: body, Header: hdr}
	if err := nc.PublishMsg(msg); err != nil {
		return nil, fmt.Errorf("natsapi: publish: %w", err)
	}
	var stored *PubAck
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
				return nil, &ErrNoReply{Stored: stored, Err: err}
			}
			return nil, fmt.Errorf("natsapi: %w", err)
		}
		if m.Header.Get("Status") == "503" {
			return nil, &ErrNoReply{Err: nats.ErrNoResponders}
		}
		if a, ok := ParsePubAck(m.Data); ok {
			if a.Error == nil {
				stored = &a
			}
			continue
		}
		return m.Data, nil
	}
}

// Query sends a query body on ledger.v1.query.<name> and returns the reply.
func Query(ctx context.Context, nc *nats.Conn, name string, body []byte) ([]byte, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, queryTimeout)
		defer cancel()
	}
	m, err := nc.RequestWithContext(ctx, QuerySubjectPrefix+name, body)
	if err != nil {
		return nil, fmt.Errorf("natsapi: query %s: %w", name, err)
	}
	return m.Data, nil
}
