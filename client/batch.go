package client

import (
	"context"
	"encoding/json"
	"fmt"
)

// BatchOption configures an explicit Batch.
type BatchOption func(*batchOptions)

type batchOptions struct {
	atomic bool
	key    string
}

// Atomic makes a Batch atomic under the batch's own idempotency key: all of
// it or none of it (PROTOCOL.md §2.2).
func Atomic(key string) BatchOption {
	return func(o *batchOptions) { o.atomic, o.key = true, key }
}

// batchRequest is the body of ledger.v1.cmd.batch.
type batchRequest struct {
	Commands []json.RawMessage `json:"commands"`
	Atomic   bool              `json:"atomic,omitempty"`
	Key      string            `json:"idempotency_key,omitempty"`
}

// Batch sends cmds as one ledger.v1.cmd.batch request, in the order given,
// and returns the batch's reply.
//
// Not atomic (the default), every command keeps its own key and gets its own
// reply; the elements the ledger left undecided (status error) or whose
// reply was lost are resent, in a batch of their own, until each has a
// definite reply, so the returned Replies are all definite. With Atomic(key),
// the batch is resent whole, same key, until its answer is definite.
//
// The error is an *IndefiniteError when ctx ended first (with it, for a batch
// that is not atomic, the replies that were definite by then, the others left
// zero), or, before anything
// is sent, the reason the batch cannot be encoded (an element whose body is
// not a JSON object). A batch outside the protocol's limits is sent and
// answered invalid by the ledger.
func (c *Client) Batch(ctx context.Context, cmds []Command, opts ...BatchOption) (BatchReply, error) {
	var bo batchOptions
	for _, o := range opts {
		o(&bo)
	}
	elems := make([]json.RawMessage, len(cmds))
	for i, cmd := range cmds {
		body, err := cmd.body()
		if err != nil {
			return BatchReply{}, fmt.Errorf("client: batch element %d: %w", i, err)
		}
		e, ok := element(cmd.commandType(), body)
		if !ok {
			return BatchReply{}, fmt.Errorf("client: batch element %d (%s): the body is not a JSON object", i, cmd.commandType())
		}
		elems[i] = e
	}
	if bo.atomic {
		return c.batchAtomic(ctx, batchRequest{Commands: elems, Atomic: true, Key: bo.key})
	}
	return c.batchEach(ctx, elems)
}

// batchAtomic resends an atomic batch until its answer is definite.
func (c *Client) batchAtomic(ctx context.Context, req batchRequest) (BatchReply, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return BatchReply{}, fmt.Errorf("client: encode batch: %w", err)
	}
	r := resender{c: c, key: req.Key}
	for {
		var br BatchReply
		if ok, next := settled(c.request(ctx, BatchSubject, body), &br); ok {
			return br, nil
		} else if err := r.next(ctx, next); err != nil {
			return BatchReply{}, err
		}
	}
}

// batchEach sends a batch that is not atomic, then again the elements still
// without a definite reply, until every element has one.
func (c *Client) batchEach(ctx context.Context, elems []json.RawMessage) (BatchReply, error) {
	replies := make([]Reply, len(elems))
	pending := make([]int, len(elems))
	for i := range pending {
		pending[i] = i
	}
	r := resender{c: c, key: fmt.Sprintf("batch of %d", len(elems))}
	for {
		body := batchBody(len(pending), func(j int) []byte { return elems[pending[j]] })
		var br BatchReply
		ok, next := settled(c.request(ctx, BatchSubject, body), &br)
		switch {
		case ok && len(br.Replies) != len(pending):
			return br, nil // refused as a whole (limits, or a ledger without batches)
		case ok:
			var still []int
			var last *Reply
			for j, i := range pending {
				if br.Replies[j].Status.Definite() {
					replies[i] = br.Replies[j]
				} else {
					still = append(still, i)
					last = &br.Replies[j]
				}
			}
			if pending = still; len(pending) == 0 {
				return BatchReply{Status: StatusApplied, Code: CodeOK, Replies: replies}, nil
			}
			next = outcome{err: &ReplyError{Code: last.Code, Message: last.Message}, wait: true, stored: next.stored}
		}
		if err := r.next(ctx, next); err != nil {
			return BatchReply{Status: StatusError, Code: CodeInternalError, Message: err.Error(), Replies: replies}, err
		}
	}
}
